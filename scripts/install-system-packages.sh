#!/usr/bin/env bash
# Installs, with apt, the system packages the devstack and the tests need and this machine
# lacks: PostgreSQL's server binaries, runuser, Chromium (the UI tests drive Debian's
# Chromium through Playwright; Playwright's own browser download cannot work offline), and
# promtool from Debian's prometheus package (the alert-rule tests), and,
# for the container path (docs/containers.md) Podman, runc (crun refuses cgroup v1/v2
# hybrid hosts; --no-install-recommends leaves crun out) and debootstrap (the image's base
# is made locally: no registry).
# Nothing is installed when everything is already there.
set -euo pipefail

missing=()
compgen -G "/usr/lib/postgresql/*/bin/pg_ctl" >/dev/null || missing+=(postgresql)
command -v runuser >/dev/null || missing+=(util-linux)
command -v chromium >/dev/null || missing+=(chromium)
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v promtool >/dev/null || missing+=(prometheus)

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "missing system packages: ${missing[*]}; install them with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# Only the binaries are wanted: a policy-rc.d (when none exists) keeps the packages' init
# scripts from starting daemons (the prometheus package would start a server on :9090).
policy=/usr/sbin/policy-rc.d
own_policy=0
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod +x "$policy" && own_policy=1
fi
trap '[ "$own_policy" -eq 1 ] && rm -f "$policy"' EXIT
apt-get install -y -qq --no-install-recommends "${missing[@]}"
