#!/bin/sh
# What the foreign-client test (tests/node_client) needs beyond the virtualenv:
#   nodejs, npm        Debian's, when the machine has no node of its own (node 20 or later)
#   node_modules       @grpc/grpc-js, @grpc/proto-loader and protobufjs at the versions of
#                      tests/node_client/package-lock.json, installed with `npm ci`
# Idempotent and quiet: does nothing when node_modules matches the lock; otherwise installs what is
# missing and prints one line, or the failing tool's output.
set -eu

here=tests/node_client
stamp="$here/node_modules/.package-lock.json"
if [ -e "$stamp" ] && [ "$stamp" -nt "$here/package-lock.json" ] && [ "$stamp" -nt "$here/package.json" ]; then
    exit 0
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
        echo "tools/node/requirements.sh: node and npm are missing; install them (node 20 or later)" >&2
        exit 1
    fi
    echo "tools/node/requirements.sh: installing nodejs npm"
    export DEBIAN_FRONTEND=noninteractive
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends nodejs npm; } >"$log" 2>&1; then
        cat "$log" >&2
        echo "tools/node/requirements.sh: apt-get failed" >&2
        exit 1
    fi
fi
echo "tools/node/requirements.sh: npm ci in $here"
if ! npm ci --prefix "$here" --no-audit --no-fund --ignore-scripts >"$log" 2>&1; then
    cat "$log" >&2
    echo "tools/node/requirements.sh: npm ci failed" >&2
    exit 1
fi
touch "$stamp"
