#!/bin/sh
# System packages the report's browser test (tests/audit/test_report_browser.py) needs beyond the virtualenv:
#   chromium           Debian's headless-capable Chromium: opens the HTML report, dumps its DOM, screenshots it
#   fonts-dejavu-core  a font, so the screenshot shows text rather than empty boxes
# Idempotent and quiet: does nothing when both are present; otherwise installs what is missing with
# apt-get (needs root) and prints one line, or apt's output if it fails.
set -eu

missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
[ -e /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || missing="$missing fonts-dejavu-core"
[ -z "$missing" ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "tools/browser/requirements.sh: root is needed to install:$missing" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "tools/browser/requirements.sh: no apt-get here; install$missing by hand" >&2
    exit 1
fi

echo "tools/browser/requirements.sh: installing$missing"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086  # the package list is word-split on purpose
if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends $missing; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "tools/browser/requirements.sh: apt-get failed" >&2
    exit 1
fi
command -v chromium >/dev/null 2>&1 || { echo "tools/browser/requirements.sh: chromium still missing" >&2; exit 1; }
