#!/usr/bin/env bash
# Installs packages into a venv with uv, as `pip install` would (same indexes, wheel folders,
# constraints and certificate: scripts/uv_args.py reads them from pip's configuration), and
# byte-compiled, as pip leaves them. uv is pinned and installed once into .tools/ (UV below);
# where it cannot be had, this falls back to the venv's own pip, slower but the same result.
#
#   scripts/venv-install.sh VENV PIP-INSTALL-ARGS...
#
# Why: `make demo` on a fresh machine spent 88 s (project venv) + 125 s (worker venv) in pip
# (serial unpack and compile of ~150 wheels); uv took 35 s + 56 s for the same packages
# (stop note of 2026-12-03), and the Makefile runs both venvs at once.
set -euo pipefail
venv="$1"; shift
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
UV="${UV:-}"
if [ -z "$UV" ] || [ ! -x "$UV" ]; then
  echo "uv not found (${UV:-unset}): installing with pip" >&2
  exec "$venv/bin/python" -m pip install "$@"
fi
args=()
while IFS= read -r line; do
  case "$line" in
    SSL_CERT_FILE=*) export SSL_CERT_FILE="${line#SSL_CERT_FILE=}" ;;
    *) args+=("$line") ;;
  esac
done < <(python3 "$ROOT/scripts/uv_args.py" "$(dirname "$UV")/python")
exec "$UV" pip install --python "$venv/bin/python" --compile-bytecode "${args[@]}" "$@"
