#!/bin/sh
# System packages the three-zone harness (python -m tools.zones, tests/zones) needs beyond the virtualenv:
#   iproute2  ip netns / ip link / ip addr (namespaces, veth pairs, the bridge)
#   iptables  partitions (DROP rules) and random loss (-m statistic) inside each zone's namespace
# Idempotent and quiet: does nothing when both are present; otherwise installs what is missing with
# apt-get (needs root) and prints one line, or apt's output if it fails.
set -eu

missing=""
command -v ip >/dev/null 2>&1 || missing="$missing iproute2"
command -v iptables >/dev/null 2>&1 || missing="$missing iptables"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "tools/zones/requirements.sh: root is needed to install:$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tools/zones/requirements.sh: no apt-get here; install$missing by hand" >&2
    exit 1
fi

echo "tools/zones/requirements.sh: installing$missing"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the package list is word-split on purpose
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "tools/zones/requirements.sh: apt-get failed" >&2
    exit 1
fi
for tool in ip iptables; do
    command -v "$tool" >/dev/null 2>&1 || { echo "tools/zones/requirements.sh: $tool still missing" >&2; exit 1; }
done
