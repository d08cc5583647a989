#!/usr/bin/env bash
# Installs, with apt, the system packages this machine lacks, for one purpose:
#
#   install-system-packages.sh demo   what `make demo` runs on: PostgreSQL's server binaries,
#                                     runuser, and for the container path (docs/containers.md)
#                                     Podman, runc (crun refuses cgroup v1/v2 hybrid hosts;
#                                     --no-install-recommends leaves crun out) and debootstrap
#                                     (the image's base is made locally: no registry)
#   install-system-packages.sh test   (the default) all of the above plus what only the tests
#                                     use: Chromium (the UI tests drive Debian's Chromium
#                                     through Playwright; Playwright's own browser download
#                                     cannot work offline) and promtool from Debian's
#                                     prometheus package (the alert-rule tests)
#
# Split so that `make demo` never waits for a browser it does not start. Nothing is
# installed when everything is already there. `--list` after the purpose prints what would be
# installed (one line, maybe empty) and installs nothing.
set -euo pipefail

purpose="${1:-test}"
case "$purpose" in
  demo|test) ;;
  *) echo "usage: $0 [demo|test] [--list] (got '$purpose')" >&2; exit 2 ;;
esac
list_only=0
[ "${2:-}" = "--list" ] && list_only=1

missing=()
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || missing+=(postgresql)
command -v runuser >/dev/null || missing+=(util-linux)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ "$purpose" = test ]; then
  command -v chromium >/dev/null || missing+=(chromium)
  command -v promtool >/dev/null || missing+=(prometheus)
fi

if [ "$list_only" -eq 1 ]; then
  echo "${missing[*]}"
  exit 0
fi
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
# Only the binaries are wanted: a policy-rc.d (when none exists) keeps the packages' init
# scripts from starting daemons (the prometheus package would start a server on :9090).
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
fi
trap '[ "$own_policy" -eq 1 ] && rm -f "$policy"' EXIT
progress="$(dirname "$0")/progress.sh"
log="${TMPDIR:-/tmp}/gpustack-dspark-apt.log"
"$progress" "apt-get install ${missing[*]}" "$log" -- \
  sh -c 'apt-get update -qq && apt-get install -y -qq --no-install-recommends "$@"' apt "${missing[@]}"
