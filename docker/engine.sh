#!/bin/sh
# The Docker engine of the container tier. Uses the engine DOCKER_HOST (or /var/run/docker.sock)
# reaches when there is one; otherwise starts its own dockerd, with HOST NETWORKING ONLY:
#
#   --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false
#
# so it creates no bridge, no veth, no NAT, changes no firewall rule and no sysctl of the machine
# (the three-zone tests rely on those), and containers get no network unless they ask for the
# host's (network_mode: host / --network host). Its data root, exec root and socket are its own, so
# it never meets a system dockerd; the data root persists between runs, which is the image cache.
#
#   sh docker/engine.sh run -- CMD [ARG...]  CMD with an engine; an engine started here is stopped after
#   sh docker/engine.sh start | stop | status
#
# CMD runs with DOCKER_HOST set, COUNTERSIGN_DOCKER_REQUIRED=1 (container tests fail rather than
# skip) and TESTCONTAINERS_RYUK_DISABLED=true (Ryuk would be one more image from a registry).
# One line of progress for a start and one for a stop; dockerd's log is shown only on failure.
set -eu

data_root=${COUNTERSIGN_DOCKER_ROOT:-/var/lib/countersign-docker}
run_dir=${COUNTERSIGN_DOCKER_RUN:-/run/countersign-docker}
own_host="unix://${run_dir}/docker.sock"
pidfile="${run_dir}/dockerd.pid"
log="${run_dir}/dockerd.log"
started_here=""

answers() { # HOST: does an engine answer there?
    DOCKER_HOST=$1 timeout 20 docker version --format '{{.Server.Version}}' >/dev/null 2>&1
}

engine_host() { # prints the DOCKER_HOST of a reachable engine, or nothing
    if [ -n "${DOCKER_HOST:-}" ] && answers "${DOCKER_HOST}"; then
        echo "${DOCKER_HOST}"
    elif [ -S /var/run/docker.sock ] && answers unix:///var/run/docker.sock; then
        echo unix:///var/run/docker.sock
    elif [ -S "${run_dir}/docker.sock" ] && answers "${own_host}"; then
        echo "${own_host}"
    fi
}

start() {
    host=$(engine_host)
    if [ -n "${host}" ]; then
        DOCKER_HOST=${host}
        return 0
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "docker/engine.sh: no Docker engine reachable, and starting dockerd needs root" >&2
        return 1
    fi
    if ! command -v dockerd >/dev/null 2>&1; then
        echo "docker/engine.sh: dockerd not installed (sh docker/requirements.sh installs docker.io)" >&2
        return 1
    fi
    mkdir -p "${data_root}" "${run_dir}"
    chmod 0711 "${data_root}" "${run_dir}"
    # A dockerd of ours that died without cleaning up leaves its pid file; it is not running.
    rm -f "${pidfile}"
    # setsid: its own session, so a Ctrl-C of the test run does not kill it before the trap stops it.
    setsid dockerd \
        --data-root "${data_root}" \
        --exec-root "${run_dir}/exec" \
        --pidfile "${pidfile}" \
        --host "${own_host}" \
        --bridge=none --iptables=false --ip6tables=false --ip-forward=false --ip-masq=false \
        --storage-driver overlay2 \
        --log-level warn \
        >"${log}" 2>&1 </dev/null &
    waited=0
    until answers "${own_host}"; do
        waited=$((waited + 1))
        if [ "${waited}" -gt 60 ] || ! kill -0 "$!" 2>/dev/null; then
            echo "docker/engine.sh: dockerd did not start; its log:" >&2
            tail -n 30 "${log}" >&2
            return 1
        fi
        sleep 0.5
    done
    DOCKER_HOST=${own_host}
    started_here=1
    # This engine serves the container tier alone: whatever a run cut short left behind (containers
    # that restart policies would bring back, their volumes) goes before the next run.
    leftovers=$(DOCKER_HOST=${own_host} docker ps --all --quiet)
    if [ -n "${leftovers}" ]; then
        # shellcheck disable=SC2086  # one container id per word
        DOCKER_HOST=${own_host} docker rm --force --volumes ${leftovers} >/dev/null
    fi
    DOCKER_HOST=${own_host} docker volume prune --force >/dev/null
    echo "docker/engine.sh: dockerd $(DOCKER_HOST=${own_host} docker version --format '{{.Server.Version}}') started (host networking only; data root ${data_root})"
}

stop() {
    [ -f "${pidfile}" ] || { unmount_leftovers; return 0; }
    pid=$(cat "${pidfile}")
    if kill -0 "${pid}" 2>/dev/null; then
        kill -TERM "${pid}"
        waited=0
        while kill -0 "${pid}" 2>/dev/null; do
            waited=$((waited + 1))
            if [ "${waited}" -gt 60 ]; then
                echo "docker/engine.sh: dockerd ${pid} ignored SIGTERM for 30 s; killing it" >&2
                kill -KILL "${pid}" 2>/dev/null || true
                break
            fi
            sleep 0.5
        done
        echo "docker/engine.sh: dockerd stopped"
    fi
    rm -f "${pidfile}"
    unmount_leftovers
}

# dockerd leaves its default network namespace bind-mounted under the exec root.
unmount_leftovers() {
    awk -v root="${run_dir}/exec/" 'index($2, root) == 1 { print $2 }' /proc/mounts | sort -r | while read -r mount; do
        umount "${mount}" 2>/dev/null || true
    done
}

case "${1:-}" in
run)
    shift
    [ "${1:-}" = "--" ] && shift
    [ "$#" -gt 0 ] || { echo "usage: sh docker/engine.sh run -- CMD [ARG...]" >&2; exit 2; }
    start
    if [ -n "${started_here}" ]; then
        trap 'stop' EXIT
        trap 'exit 130' INT TERM
    fi
    status=0
    DOCKER_HOST=${DOCKER_HOST} COUNTERSIGN_DOCKER_REQUIRED=1 TESTCONTAINERS_RYUK_DISABLED=true "$@" || status=$?
    exit "${status}"
    ;;
start)
    start
    [ -n "${started_here}" ] || echo "docker/engine.sh: using the engine at ${DOCKER_HOST}"
    echo "export DOCKER_HOST=${DOCKER_HOST}"
    ;;
stop)
    stop
    ;;
status)
    host=$(engine_host)
    if [ -n "${host}" ]; then
        echo "engine at ${host}: $(DOCKER_HOST=${host} docker version --format '{{.Server.Version}}')"
    else
        echo "no Docker engine reachable"
        exit 1
    fi
    ;;
*)
    echo "usage: sh docker/engine.sh run -- CMD [ARG...] | start | stop | status" >&2
    exit 2
    ;;
esac
