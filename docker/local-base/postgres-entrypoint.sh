#!/bin/sh
# Entry point of the LOCAL STAND-IN PostgreSQL image (docker/local-base/build.sh): the part of the
# official postgres image's contract that docker/compose.yaml and testcontainers' PostgresContainer
# rely on, over Debian's postgresql-15.
#
#   POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE   the superuser's password (required)
#   POSTGRES_USER (postgres)  POSTGRES_DB ($POSTGRES_USER)  PGDATA  PGPORT (5432)
#
# First start with an empty PGDATA: initdb, local socket trust, scram-sha-256 over TCP, then the
# database is created on a socket-only server, so that a TCP answer means "ready". Started as root,
# it makes PGDATA and the socket directory the postgres user's and drops to it (setpriv).
set -eu

case "${1:-}" in
-*) set -- postgres "$@" ;;
esac
if [ "${1:-}" != postgres ]; then
    exec "$@"
fi

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" -eq 0 ]; then
    mkdir -p "${PGDATA}" /var/run/postgresql
    chown postgres:postgres "${PGDATA}" /var/run/postgresql
    chmod 0700 "${PGDATA}"
    chmod 2775 /var/run/postgresql
    exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" "$@"
fi

if [ ! -s "${PGDATA}/PG_VERSION" ]; then
    password=${POSTGRES_PASSWORD:-}
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then
        password=$(cat "${POSTGRES_PASSWORD_FILE}")
    fi
    if [ -z "${password}" ]; then
        echo "postgres-entrypoint: set POSTGRES_PASSWORD or POSTGRES_PASSWORD_FILE" >&2
        exit 1
    fi
    user=${POSTGRES_USER:-postgres}
    database=${POSTGRES_DB:-${user}}
    pwfile=$(mktemp)
    trap 'rm -f "${pwfile}"' EXIT
    printf '%s\n' "${password}" > "${pwfile}"
    initdb --username="${user}" --pwfile="${pwfile}" --auth-local=trust --auth-host=scram-sha-256 \
        --encoding=UTF8 --locale=C.UTF-8 >/dev/null
    rm -f "${pwfile}"
    printf 'host all all all scram-sha-256\n' >> "${PGDATA}/pg_hba.conf"
    pg_ctl --silent --wait --options="-c listen_addresses=''" start
    if [ "${database}" != postgres ]; then
        printf 'CREATE DATABASE :"database";\n' \
            | psql --quiet --no-psqlrc -v ON_ERROR_STOP=1 -v database="${database}" --username="${user}" --dbname=postgres
    fi
    pg_ctl --silent --wait --mode=fast stop
    echo "postgres-entrypoint: initialised ${PGDATA} (user ${user}, database ${database})"
fi

exec "$@"
