#!/bin/sh
# Regenerate constraints.txt (`make constraints`): resolve pyproject.toml's ranges afresh, with every
# extra, in a scratch virtualenv, and pin exactly what was installed. Quiet unless a step fails.
#   PYTHON=python3 PIP_VERSION=26.3 sh tools/constraints.sh
set -eu
PYTHON=${PYTHON:-python3}
PIP_VERSION=${PIP_VERSION:?the pip version the Makefile pins}
EXTRAS=${EXTRAS:-dev,server,postgres,aws}
here=$(dirname "$0")

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
pip="$scratch/venv/bin/python -m pip --quiet --disable-pip-version-check"
sh "$here/quietly.sh" "$PYTHON" -m venv "$scratch/venv"
# shellcheck disable=SC2086  # $pip is a command line
sh "$here/quietly.sh" $pip install "pip==$PIP_VERSION"
# shellcheck disable=SC2086
sh "$here/quietly.sh" $pip install -e ".[$EXTRAS]"
{
    echo "# Every package the project installs, pinned: pip freeze of a fresh venv holding .[$EXTRAS]."
    echo "# Ranges live in pyproject.toml. Regenerate with: make constraints"
    # shellcheck disable=SC2086
    $pip freeze --exclude-editable | LC_ALL=C sort -f -t= -k1,1
} >"$scratch/constraints.txt"
mv "$scratch/constraints.txt" constraints.txt
