#!/bin/sh
# The `init` job of docker/compose.yaml: a DEVELOPMENT PKI, the operator key, one file signing key
# per deployer and the database password, each written into the volume of the one service that
# needs it. Runs once: a second run (docker compose up again) finds public/operator.toml and stops.
#
# Nothing here is for production: there the operator key is made offline, deployer keys live in
# KMS and certificates come from your private CA (docs/deploy.md).
#
# Every directory comes from the environment (the compose file sets them to the volumes' mount
# points), so the same script runs outside a container, which tests/docker does.
set -eu
umask 077

: "${CA_DIR:?}" "${PUBLIC_DIR:?}" "${DB_DIR:?}" "${OPERATOR_DIR:?}" "${DEMO_DIR:?}"
: "${COORDINATOR_TLS_DIR:?}" "${VERIFIER_TLS_DIRS:?}" "${SIGNER_DIRS:?}"

if [ -f "${PUBLIC_DIR}/operator.toml" ]; then
    echo "init: already initialised (${PUBLIC_DIR}/operator.toml exists); nothing to do"
    exit 0
fi
if [ -e "${CA_DIR}/ca.key" ]; then
    echo "init: a previous run stopped half-way; remove the volumes (docker compose down --volumes) and retry" >&2
    exit 1
fi

json_field() { # FIELD < JSON
    python -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"
}

# issue DIR ROLE NAME [DEPLOYER]: certificate and key as DIR/tls.pem, DIR/tls.key, plus DIR/ca.pem.
issue() {
    dir=$1 role=$2 name=$3
    if [ "$#" -ge 4 ]; then
        countersign pki issue --ca "${CA_DIR}" --out "${dir}" --name "${name}" --role "${role}" --deployer "$4" > /dev/null
    else
        countersign pki issue --ca "${CA_DIR}" --out "${dir}" --name "${name}" --role "${role}" > /dev/null
    fi
    if [ "${name}" != tls ]; then
        mv "${dir}/${name}.pem" "${dir}/tls.pem"
        mv "${dir}/${name}.key" "${dir}/tls.key"
    fi
    cp "${CA_DIR}/ca.pem" "${dir}/ca.pem"
    chmod 0644 "${dir}/ca.pem" "${dir}/tls.pem"
    echo "init: ${role} certificate ${name} -> ${dir}"
}

# 1. The development CA. Its key stays in the ca volume, which only this job mounts.
countersign pki init --out "${CA_DIR}" > /dev/null
cp "${CA_DIR}/ca.pem" "${PUBLIC_DIR}/ca.pem"
chmod 0644 "${PUBLIC_DIR}/ca.pem"

# 2. Server (and client) certificates of the daemons.
issue "${COORDINATOR_TLS_DIR}" coordinator tls
for entry in ${VERIFIER_TLS_DIRS}; do           # NAME=DIR
    issue "${entry#*=}" verifier "${entry%%=*}"
done

# 3. One signer per deployer: its TLS material and its Ed25519 file key (mode 0600); the public
#    key goes to the public volume, as a deployer would send it to the operator.
for entry in ${SIGNER_DIRS}; do                 # DEPLOYER=DIR
    deployer=${entry%%=*} dir=${entry#*=}
    issue "${dir}" signer tls "${deployer}"
    countersign keygen --out "${dir}/signer.jwk" > /dev/null
    countersign public-key --key "file:${dir}/signer.jwk" > "${PUBLIC_DIR}/${deployer}.json"
    chmod 0644 "${PUBLIC_DIR}/${deployer}.json"
    echo "init: ${deployer} key $(json_field key_id < "${PUBLIC_DIR}/${deployer}.json")"
    # The demo's agent runtime of this deployer (a client certificate only its signer accepts).
    countersign pki issue --ca "${CA_DIR}" --out "${DEMO_DIR}" --name "runtime-${deployer}" \
        --role runtime --deployer "${deployer}" > /dev/null
done
countersign pki issue --ca "${CA_DIR}" --out "${DEMO_DIR}" --name client --role client > /dev/null
cp "${CA_DIR}/ca.pem" "${DEMO_DIR}/ca.pem"

# 4. The operator: its key and its client certificate (only the operator may submit statements).
issue "${OPERATOR_DIR}" operator tls
countersign operator init --out "${OPERATOR_DIR}/operator.jwk" > "${OPERATOR_DIR}/operator.pub.json"
operator_public_key=$(json_field public_key < "${OPERATOR_DIR}/operator.pub.json")
cp "${OPERATOR_DIR}/operator.pub.json" "${PUBLIC_DIR}/operator.pub.json"
chmod 0644 "${PUBLIC_DIR}/operator.pub.json"

# 5. The database password: one file for the PostgreSQL image (POSTGRES_PASSWORD_FILE, read by
#    its postgres user, hence 0644 inside a volume only the database users mount) and a libpq
#    password file (PGPASSFILE, mode 0600 as libpq demands) for the coordinator and verifiers.
password=$(python -c 'import secrets; print(secrets.token_urlsafe(32))')
printf '%s\n' "${password}" > "${DB_DIR}/postgres-password"
chmod 0644 "${DB_DIR}/postgres-password"
printf '*:*:*:countersign:%s\n' "${password}" > "${DB_DIR}/pgpass"
chmod 0600 "${DB_DIR}/pgpass"

# 6. Last, atomically: the pinned operator key every daemon reads (--config), which also marks
#    the job as done.
printf '# Written by docker/dev-mesh/init.sh: the operator key every daemon pins.\noperator_public_key = "%s"\n' \
    "${operator_public_key}" > "${PUBLIC_DIR}/operator.toml.tmp"
chmod 0644 "${PUBLIC_DIR}/operator.toml.tmp"
mv "${PUBLIC_DIR}/operator.toml.tmp" "${PUBLIC_DIR}/operator.toml"
echo "init: operator public key ${operator_public_key} pinned in ${PUBLIC_DIR}/operator.toml"
