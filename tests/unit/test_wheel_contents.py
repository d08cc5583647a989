"""The wheel a GPUStack server (or a worker image) installs, built from this checkout and listed.

Test code is for this repository, not for a server: the stand-ins (`tests/support/`) and the
experiment scripts (`tests/bench/`) must not reach the wheel, while the library the CLI and
the demo use (`gpustack_dspark/bench/`) must. Built with pip from a copy of the checkout
(no network, this venv's setuptools; ~10 s), so the build leaves nothing in the checkout.
"""

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path, PurePosixPath

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOT_SOURCE = shutil.ignore_patterns(".git", ".venv*", ".tools", "__pycache__", "*.egg-info", "build", "dist",
                                    "test-artifacts", ".state", ".pytest_cache")
STAND_INS = {"stand_in_kube_api.py", "stand_in_replica.py", "stand_in_instances.py"}
EXPERIMENTS = {"routing_compare.py", "drafting.py", "budget_trace.py", "schema_bench.py", "order_json.py",
               "format_check_cost.py"}
CLI_BENCH_LIBRARY = {"__init__.py", "load.py", "workloads.py", "runner.py", "report.py", "sweep.py",
                     "extraction.py"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    base = tmp_path_factory.mktemp("wheel")
    source, out = base / "source", base / "out"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE, symlinks=True)
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index",
                            "--quiet", "--wheel-dir", str(out), str(source)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-3000:]
    (path,) = out.glob("*.whl")
    with zipfile.ZipFile(path) as archive:
        return archive.namelist(), archive.read(next(n for n in archive.namelist()
                                                     if n.endswith(".dist-info/entry_points.txt"))).decode()


def test_the_wheel_holds_no_stand_in_no_experiment_and_no_test_code(wheel):
    names, _ = wheel
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    stem = f"{project['name'].replace('-', '_')}-{project['version']}"
    assert {n.split("/")[0] for n in names} == {"gpustack_dspark", f"{stem}.dist-info", f"{stem}.data"}
    files = [PurePosixPath(n) for n in names]
    assert not [f for f in files if f.name in STAND_INS or "stand_in" in f.name], names
    assert not [f for f in files if f.name in EXPERIMENTS], names
    assert not [f for f in files if "tests" in f.parts or f.name.startswith("test_")], names
    # Only the console's assets are data files; the experiments' data left with them.
    assert {f.parts[2] for f in files if f.parts[0] == f"{stem}.data"} == {"share"}
    assert not [f for f in files if f.parts[:2] == ("gpustack_dspark", "bench") and f.name not in CLI_BENCH_LIBRARY]


def test_the_wheel_holds_what_the_server_the_worker_and_the_cli_run(wheel):
    names, entry_points = wheel
    for needed in ("gpustack_dspark/plugin.py", "gpustack_dspark/reply_check.py", "gpustack_dspark/worker/serve.py",
                   "gpustack_dspark/routing/format_check.py", "gpustack_dspark/devstack/loopback/sitecustomize.py",
                   *(f"gpustack_dspark/bench/{name}" for name in CLI_BENCH_LIBRARY)):
        assert needed in names, needed
    for script in ("gpustack-dspark = gpustack_dspark.cli.main:main", "dspark-serve = gpustack_dspark.worker.serve:main",
                   "dspark = gpustack_dspark.plugin:DSparkPlugin"):
        assert script in entry_points
