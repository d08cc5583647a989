#!/usr/bin/env python3
"""Prints uv's arguments for what this machine's pip is configured with, one per line.

Why: the venvs are installed with uv (scripts/venv-install.sh: the same packages as pip in
about a third of the time: parallel downloads, unpacking and byte-compiling). uv does not read
pip's configuration, and a machine's pip may be set up to find packages in local indexes or a
wheel folder, under constraints, behind a certificate (pip.conf, PIP_* variables). This reads
`pip config list` (files and environment, as pip itself merges them) and maps each setting uv
has an equivalent for; pip's choice among indexes (the best version across all of them) is
uv's `unsafe-best-match`, always passed.

    uv_args.py PYTHON    -> lines: uv arguments, then `SSL_CERT_FILE=...` if pip has a cert
Standard library only: it runs before the venv holds anything but pip.
"""

import shlex
import subprocess
import sys
from typing import Dict, List

# pip option -> uv option; each value may hold several space-separated entries.
OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
           "find-links": "--find-links", "constraint": "--constraint"}


def read_pip_config(text: str) -> Dict[str, List[str]]:
    """`pip config list` lines (`global.find-links='/opt/wheels'`, `:env:.constraint='...'`)
    -> option -> values, with pip's precedence: `install` over `global`, PIP_* over both."""
    by_section: Dict[str, Dict[str, List[str]]] = {"global": {}, "install": {}, ":env:": {}}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep or "." not in key:
            continue
        section, _, option = key.rpartition(".")
        if section in by_section:
            by_section[section][option] = shlex.split(value)[0].split() if value.strip() else []
    found: Dict[str, List[str]] = {}
    for section in ("global", "install", ":env:"):
        found.update(by_section[section])
    return found


def uv_args(config: Dict[str, List[str]]) -> List[str]:
    args = ["--index-strategy", "unsafe-best-match"]
    for option, flag in OPTIONS.items():
        for value in config.get(option, []):
            args += [flag, value]
    if config.get("no-index") and config["no-index"][0].lower() in ("1", "true", "yes", "on"):
        args.append("--no-index")
    return args


def main(python: str) -> int:
    result = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True, text=True)
    config = read_pip_config(result.stdout if result.returncode == 0 else "")
    for arg in uv_args(config):
        print(arg)
    if config.get("cert"):
        print(f"SSL_CERT_FILE={config['cert'][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else sys.executable))
