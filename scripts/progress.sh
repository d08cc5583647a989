#!/usr/bin/env bash
# Runs a long setup command quietly, so that a person watching `make demo` / `make test`
# sees it start, a line at least every 10 s while it works, and its end — each with the time
# since the make command began (DSPARK_T0, epoch seconds, set by the Makefile) — instead of
# a silent minute of pip or apt. Its whole output goes to a log file, shown (tail) on failure.
#
#   scripts/progress.sh LABEL LOG -- COMMAND [ARGS...]
set -uo pipefail

label="$1"; log="$2"; shift 2
[ "${1:-}" = "--" ] && shift
t0="${DSPARK_T0:-$(date +%s)}"
stamp() { local s=$(( $(date +%s) - ${t0%.*} )); printf '%d:%02d' $((s / 60)) $((s % 60)); }
say() { echo "$(stamp) [setup] $label: $*"; }

mkdir -p "$(dirname "$log")"
: > "$log"
say "started (log $log)"
started=$(date +%s)
"$@" >> "$log" 2>&1 &
pid=$!
# Forward a stop to the command, so Ctrl-C / a closed terminal never leaves it running.
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; exit 130' INT TERM HUP
while kill -0 "$pid" 2>/dev/null; do
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    sleep 1
    kill -0 "$pid" 2>/dev/null || break 2
  done
  last="$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-100)"
  say "still working, $(( $(date +%s) - started ))s${last:+; last: $last}"
done
wait "$pid"
rc=$?
if [ "$rc" -ne 0 ]; then
  say "failed (exit $rc) after $(( $(date +%s) - started ))s; the end of $log:"
  tail -n 20 "$log" >&2
  exit "$rc"
fi
say "done in $(( $(date +%s) - started ))s"
