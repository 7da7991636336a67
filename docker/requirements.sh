#!/bin/sh
# System packages the container tier (make containers, tests/docker) needs, from Debian's archive:
#   docker.io       the Docker engine (dockerd, containerd, runc) and a docker client
#   docker-compose  Compose: bookworm has only v1 (1.29, Python); the v2 plugin is not packaged there
#   mmdebstrap      builds the local stand-in base images from Debian packages (docker/local-base)
# Idempotent and quiet: does nothing when all are present; otherwise installs what is missing with
# apt-get (needs root) and prints one line, or apt's output if it fails. No service is started:
# docker/engine.sh starts its own engine, with host networking only, and stops it after.
set -eu

missing=""
command -v dockerd >/dev/null 2>&1 || missing="$missing docker.io"
command -v containerd >/dev/null 2>&1 || missing="$missing containerd"
# A docker client from elsewhere may come first on PATH; the engine is what decides.
docker compose version >/dev/null 2>&1 || command -v docker-compose >/dev/null 2>&1 \
    || missing="$missing docker-compose"
command -v mmdebstrap >/dev/null 2>&1 || missing="$missing mmdebstrap"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "docker/requirements.sh: root is needed to install:$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "docker/requirements.sh: no apt-get here; install$missing by hand" >&2
    exit 1
fi

echo "docker/requirements.sh: installing$missing"
log=$(mktemp)
policy=""
cleanup() {
    rm -f "$log"
    [ -z "$policy" ] || rm -f "$policy"
}
trap cleanup EXIT
# docker.io's maintainer scripts would start a stock dockerd, which rewrites iptables (the
# three-zone tests rely on the machine's rules). policy-rc.d exit 101 forbids any service start.
if [ ! -e /usr/sbin/policy-rc.d ]; then
    policy=/usr/sbin/policy-rc.d
    printf '#!/bin/sh\n# docker/requirements.sh: no service starts while it installs\nexit 101\n' > "$policy"
    chmod 0755 "$policy"
fi
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the package list is word-split on purpose
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "docker/requirements.sh: apt-get failed" >&2
    exit 1
fi
for tool in dockerd containerd mmdebstrap; do
    command -v "$tool" >/dev/null 2>&1 || { echo "docker/requirements.sh: $tool still missing" >&2; exit 1; }
done
