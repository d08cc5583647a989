"""The venvs install with uv from what pip is configured with (scripts/uv_args.py): a machine
whose pip finds packages in local indexes, a wheel folder and under constraints must get the
same from uv, with pip's precedence between its configuration files and PIP_* variables."""

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("uv_args", ROOT / "scripts" / "uv_args.py")
uv_args = importlib.util.module_from_spec(spec)
spec.loader.exec_module(uv_args)


def test_pip_settings_map_to_uv_arguments_with_pip_precedence():
    listed = "\n".join([
        ":env:.find-links='/opt/wheels'",
        ":env:.default-timeout='180'",
        "global.extra-index-url='file:///opt/pypi/simple file:///opt/pypi-more/simple'",
        "global.find-links='/srv/old-wheels'",   # PIP_FIND_LINKS wins over the file
        "global.constraint='/etc/xdg/pip/constraints.txt'",
        "install.index-url='https://mirror.example/simple'",
        "global.index-url='https://ignored.example/simple'",  # install.* wins over global.*
        "global.cert='/etc/ssl/certs/ca-certificates.crt'",
        "not a setting line",
    ])
    config = uv_args.read_pip_config(listed)
    assert config["find-links"] == ["/opt/wheels"] and config["index-url"] == ["https://mirror.example/simple"]
    args = uv_args.uv_args(config)
    pairs = list(zip(args[::2], args[1::2]))
    assert pairs[0] == ("--index-strategy", "unsafe-best-match")  # pip: best version across indexes
    assert ("--extra-index-url", "file:///opt/pypi/simple") in pairs
    assert ("--extra-index-url", "file:///opt/pypi-more/simple") in pairs
    assert ("--find-links", "/opt/wheels") in pairs and ("--find-links", "/srv/old-wheels") not in pairs
    assert ("--constraint", "/etc/xdg/pip/constraints.txt") in pairs
    assert ("--index-url", "https://mirror.example/simple") in pairs
    assert "--no-index" not in args
    assert uv_args.uv_args(uv_args.read_pip_config("global.no-index='true'"))[-1] == "--no-index"


def test_an_unconfigured_pip_gives_only_the_index_strategy(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PIP_CONFIG_FILE": "/dev/null"}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "uv_args.py"), sys.executable], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == ["--index-strategy", "unsafe-best-match"]
