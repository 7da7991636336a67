#!/bin/sh
# Run a command with its output held in a log: print nothing when it succeeds, the whole log (on stderr)
# and its exit status when it fails. Used by the Makefile so that set-up prints one line of progress.
#   sh tools/quietly.sh COMMAND [ARGS...]
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$@" >"$log" 2>&1; then
    exit 0
else
    status=$?
fi
cat "$log" >&2
echo "failed (exit $status): $*" >&2
exit "$status"
