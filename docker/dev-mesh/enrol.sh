#!/bin/sh
# The `enrol` job of docker/compose.yaml: the operator admits each deployer's public key through
# an operator-signed statement (countersign operator enrol), as in docs/operations.md. A deployer
# already in the served registry is left alone, so the job can run again after a restart.
#
# It holds the operator key and the operator's client certificate; the deployers' public keys come
# from the public volume (init.sh wrote them with `countersign public-key --key file:...`).
set -eu
umask 077

: "${COORDINATOR:?}" "${OPERATOR_DIR:?}" "${PUBLIC_DIR:?}" "${DEPLOYERS:?}" "${OPERATOR_HEAD_FILE:?}"
work=$(mktemp -d)
trap 'rm -rf "${work}"' EXIT

json_field() { # FIELD < JSON
    python -c 'import json, sys; print(json.load(sys.stdin)[sys.argv[1]])' "$1"
}

tls="--ca ${OPERATOR_DIR}/ca.pem --cert ${OPERATOR_DIR}/tls.pem --tls-key ${OPERATOR_DIR}/tls.key"
operator_public_key=$(json_field public_key < "${PUBLIC_DIR}/operator.pub.json")

for deployer in $(echo "${DEPLOYERS}" | tr ',' ' '); do
    # The served log, verified against the operator key, folded into registry.json.
    # shellcheck disable=SC2086
    countersign registry export --coordinator "${COORDINATOR}" --operator-public-key="${operator_public_key}" \
        --out "${work}/registry" ${tls} > /dev/null
    if python -c 'import json, sys; sys.exit(sys.argv[2] not in json.load(open(sys.argv[1]))["deployers"])' \
        "${work}/registry/registry.json" "${deployer}"; then
        echo "enrol: ${deployer} is already enrolled"
        continue
    fi
    public_key=$(json_field public_key < "${PUBLIC_DIR}/${deployer}.json")
    # shellcheck disable=SC2086
    countersign operator enrol --key "${OPERATOR_DIR}/operator.jwk" --deployer "${deployer}" \
        --public-key="${public_key}" --coordinator "${COORDINATOR}" --note "docker compose dev mesh" ${tls} \
        --head-file "${OPERATOR_HEAD_FILE}"
done
echo "enrol: done"
