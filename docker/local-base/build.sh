#!/bin/sh
# LOCAL STAND-IN base images for the container tier, built from Debian packages because this
# project's machines reach no public image registry (only PyPI and Debian's archive):
#
#   countersign-local-base:bookworm-<recipe>       Debian 12 minbase + python3 (3.11) + python3-venv:
#                                                  stands in for docker/Dockerfile's pinned
#                                                  python:3.11.x-slim-bookworm (--build-arg PYTHON_IMAGE)
#   countersign-local-postgres:15-bookworm-<recipe> Debian 12 minbase + postgresql-15 and an entry
#                                                  point with the official postgres image's contract
#                                                  (POSTGRES_USER/_DB/_PASSWORD[_FILE], PGDATA, PGPORT)
#
# Each is `mmdebstrap` of bookworm (bookworm-updates, bookworm-security) into a tarball, then
# `docker import`. <recipe> is a hash of this script, the entry point and the machine's extra CA
# certificates (see below): an image whose tag exists is not rebuilt; a tarball kept in the cache
# directory is imported again without mmdebstrap; anything older is removed. Nothing above these
# bases is stand-in: the images under test are built from docker/Dockerfile itself.
#
# Extra CA certificates: this machine reaches PyPI through a TLS-inspecting egress proxy whose CA is
# in /usr/local/share/ca-certificates. The stand-ins trust the same anchors (and PIP_CERT points pip
# at the system bundle, as the machine's pip does), so `pip install` inside `docker build` works here
# exactly as on the host. A real base from the registry needs neither.
#
#   sh docker/local-base/build.sh            build what is missing; one line per image built
#   sh docker/local-base/build.sh --print    the same, then PYTHON_IMAGE=... and POSTGRES_IMAGE=...
#
# Needs root, mmdebstrap (docker/requirements.sh) and an engine (docker/engine.sh).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
cache=${COUNTERSIGN_LOCAL_BASE_CACHE:-/var/cache/countersign/local-base}
mirror=${COUNTERSIGN_DEBIAN_MIRROR:-http://deb.debian.org/debian}
security=${COUNTERSIGN_DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
suite=bookworm

extra_cas=$(find /usr/local/share/ca-certificates -maxdepth 1 -type f -name '*.crt' 2>/dev/null | sort)
# shellcheck disable=SC2086  # word-split list of certificate files (no spaces in their names)
recipe=$(cat "$here/build.sh" "$here/postgres-entrypoint.sh" ${extra_cas} | sha256sum | cut -c1-12)
python_image="countersign-local-base:${suite}-${recipe}"
postgres_image="countersign-local-postgres:15-${suite}-${recipe}"

has_image() { docker image inspect "$1" >/dev/null 2>&1; }

# bootstrap TARBALL PACKAGES [CUSTOMIZE-HOOK...]: minbase + PACKAGES + the machine's extra CAs.
bootstrap() {
    tarball=$1 packages=$2
    shift 2
    set -- "$@" --customize-hook='if ls /usr/local/share/ca-certificates/*.crt >/dev/null 2>&1; then
            cp /usr/local/share/ca-certificates/*.crt "$1/usr/local/share/ca-certificates/"; fi;
            chroot "$1" update-ca-certificates >/dev/null 2>&1'
    mmdebstrap --quiet --format=tar --variant=minbase --include="${packages},ca-certificates" \
        --aptopt='Acquire::Check-Valid-Until "false"' \
        --aptopt='Acquire::Languages "none"' \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        "$@" \
        "${suite}" "${tarball}.partial" \
        "deb ${mirror} ${suite} main" \
        "deb ${mirror} ${suite}-updates main" \
        "deb ${security} ${suite}-security main"
    mv "${tarball}.partial" "${tarball}"
}

build_python() {
    tarball="${cache}/python-${suite}-${recipe}.tar"
    [ -f "${tarball}" ] || bootstrap "${tarball}" python3,python3-venv,python-is-python3
    docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'LABEL org.opencontainers.image.description="LOCAL STAND-IN for python:3.11-slim-bookworm (docker/local-base/build.sh)"' \
        --change "LABEL io.countersign.local-base.recipe=${recipe}" \
        --change 'CMD ["python3"]' \
        "${tarball}" "${python_image}" >/dev/null
}

build_postgres() {
    tarball="${cache}/postgres-15-${suite}-${recipe}.tar"
    # No cluster at install time (the entry point makes one in PGDATA), the official image's paths.
    [ -f "${tarball}" ] || bootstrap "${tarball}" postgresql-15 \
        --customize-hook='chroot "$1" pg_dropcluster 15 main 2>/dev/null || true' \
        --customize-hook="cp '${here}/postgres-entrypoint.sh' \"\$1/usr/local/bin/docker-entrypoint.sh\"" \
        --customize-hook='chmod 0755 "$1/usr/local/bin/docker-entrypoint.sh"' \
        --customize-hook='install -d -o "$(chroot "$1" id -u postgres)" -g "$(chroot "$1" id -g postgres)" -m 0700 "$1/var/lib/postgresql/data"'
    docker import \
        --change 'ENV PATH=/usr/lib/postgresql/15/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PGDATA=/var/lib/postgresql/data' \
        --change 'LABEL org.opencontainers.image.description="LOCAL STAND-IN for the postgres image (docker/local-base/build.sh)"' \
        --change "LABEL io.countersign.local-base.recipe=${recipe}" \
        --change 'VOLUME /var/lib/postgresql/data' \
        --change 'EXPOSE 5432' \
        --change 'ENTRYPOINT ["/usr/local/bin/docker-entrypoint.sh"]' \
        --change 'CMD ["postgres"]' \
        "${tarball}" "${postgres_image}" >/dev/null
}

# ensure NAME IMAGE BUILDER: the image, built (and timed) only when missing.
ensure() {
    name=$1 image=$2 builder=$3
    has_image "${image}" && return 0
    if [ "$(id -u)" -ne 0 ]; then
        echo "docker/local-base/build.sh: building ${image} needs root (mmdebstrap)" >&2
        exit 1
    fi
    started=$(date +%s)
    from="mmdebstrap of ${suite}"
    case "${name}" in
    python) [ -f "${cache}/python-${suite}-${recipe}.tar" ] && from="the cached tarball" ;;
    postgres) [ -f "${cache}/postgres-15-${suite}-${recipe}.tar" ] && from="the cached tarball" ;;
    esac
    "${builder}"
    echo "docker/local-base: ${image} (local stand-in base) built from ${from} in $(($(date +%s) - started)) s"
}

mkdir -p "${cache}"
# Tarballs and images of older recipes are never used again.
find "${cache}" -maxdepth 1 -name '*.tar*' ! -name "*-${recipe}.tar" -exec rm -f {} +
for repository in countersign-local-base countersign-local-postgres; do
    docker image ls --format '{{.Repository}}:{{.Tag}}' "${repository}" | while read -r old; do
        case "${old}" in *"-${recipe}") ;; *) docker image rm "${old}" >/dev/null 2>&1 || true ;; esac
    done
done

ensure python "${python_image}" build_python
ensure postgres "${postgres_image}" build_postgres

if [ "${1:-}" = "--print" ]; then
    echo "PYTHON_IMAGE=${python_image}"
    echo "POSTGRES_IMAGE=${postgres_image}"
fi
