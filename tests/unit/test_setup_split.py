"""`make demo` sets up only what the demo runs on; `make test` everything. Checked on the real
Makefile (what `make -n -B` would run) and the real system-packages script (`--list`, with a
PATH that has the demo's tools but not the tests' ones)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "install-system-packages.sh"


def _would_run(target: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    return subprocess.run(["make", "-n", "-B", "--no-print-directory", target], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=True).stdout


def test_make_demo_installs_no_browser_no_test_tools():
    demo = _would_run("demo")
    assert "install-system-packages.sh demo" in demo
    assert "install-helm" not in demo and "[server,dev]" not in demo and "pytest" not in demo
    assert '-e ".[server,devstack]"' in demo and "requirements.lock" in demo  # both venvs, the image's lock


def test_what_the_devstack_runs_on_is_in_the_extras_make_demo_installs():
    # A fresh clone's `make demo` stopped at the worker: "fastfetch not found" (it was in [dev] only).
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    demo = _would_run("demo")
    installed = [name for name in extras if f".[server,{name}]" in demo or f'".[{name}]"' in demo]
    assert installed == ["devstack"], installed
    assert any(req.startswith("fastfetch-bin") for req in extras["devstack"])


def test_make_test_still_installs_everything():
    test = _would_run("test")
    assert "install-system-packages.sh test" in test and "install-helm" in test and "[server,devstack,dev]" in test


@pytest.fixture
def demo_tools_only(tmp_path):
    """A PATH with the demo's commands (stubs) and neither chromium nor promtool."""
    for name in ("runuser", "podman", "runc", "debootstrap"):
        (tmp_path / name).symlink_to("/bin/true")
    return {**os.environ, "PATH": str(tmp_path)}


def test_the_demo_purpose_does_not_ask_for_the_tests_packages(demo_tools_only):
    if not list(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl")):
        pytest.skip("needs PostgreSQL's server binaries installed (make setup)")
    listed = subprocess.run(["/bin/bash", str(SCRIPT), "demo", "--list"], env=demo_tools_only,
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed == []
    listed = subprocess.run(["/bin/bash", str(SCRIPT), "test", "--list"], env=demo_tools_only,
                            capture_output=True, text=True, check=True).stdout.split()
    assert listed == ["chromium", "prometheus"]


def test_an_unknown_purpose_is_refused_in_one_line():
    result = subprocess.run(["/bin/bash", str(SCRIPT), "browsers"], capture_output=True, text=True)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "demo|test" in result.stderr
