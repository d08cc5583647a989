#!/usr/bin/env python3
"""Checks that a host virtualenv holds exactly the CPU image's lock, so the image build can
copy its installed packages instead of fetching and installing the same wheels again.

Why: `make setup` installs `backend_images/cpu/requirements.lock` into `.venv-worker`
(--no-deps, the same lock as the image). Installing those ~150 wheels again inside the build
costs about 130 s of CPU on a 2-core machine (unpacking and byte-compiling 56,000 files) plus
their download; copying the checked tree costs a few seconds of I/O. The copy is only right
when the tree is what the lock says and runs on the image's Debian bookworm, so this script
refuses, with one line saying what to do, when:

- the venv's Python is not 3.11 (the image's python3.11; .pyc files and cp311 wheels match
  across 3.11 patch releases);
- a locked package is missing or at another version, or the venv holds a package the lock
  does not (pip, setuptools and wheel, which bootstrap a venv, and this project's own
  package are allowed: the build installs the project from a wheel of its own);
- an installed wheel's platform tag needs a newer glibc than bookworm's 2.36, or another
  architecture than x86_64.

    venv_for_image.py VENV LOCK EXCLUDE_FILE   -> prints VENV's site-packages; writes to
                                                  EXCLUDE_FILE the paths (tar patterns) of
                                                  this project's own installed files

Standard library only: it runs on the host before anything of the project is importable.
"""

import re
import sys
from email.parser import HeaderParser
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

PROJECT = "gpustack-dspark"
BOOTSTRAP = {"pip", "setuptools", "wheel"}
IMAGE_GLIBC = (2, 36)  # Debian bookworm, the image's base
_LEGACY_MANYLINUX = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}


class VenvMismatch(Exception):
    """One line: what is wrong and how to fix it."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_lock(text: str) -> Dict[str, str]:
    """name -> version of every `name==version` line (comments and blanks skipped)."""
    pins: Dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        if "==" not in line:
            raise VenvMismatch(f"lock line {raw.strip()!r} is not name==version")
        name, version = line.split("==", 1)
        pins[normalize(name)] = version.strip()
    return pins


def host_glibc() -> Tuple[int, int]:
    import os

    try:
        version = os.confstr("CS_GNU_LIBC_VERSION") or ""  # "glibc 2.36"
        major, minor = version.split()[-1].split(".")[:2]
        return int(major), int(minor)
    except (ValueError, OSError, IndexError):
        return (99, 0)


def platform_ok(tag: str, image_glibc: Tuple[int, int] = IMAGE_GLIBC,
                built_on: Tuple[int, int] = IMAGE_GLIBC) -> bool:
    """Whether a wheel's platform tag runs on the image (x86_64 glibc <= image_glibc).
    built_on: the host's glibc, for wheels built here from source (linux_x86_64)."""
    if tag == "any":
        return True
    if not tag.endswith("_x86_64"):
        return False
    if tag == "linux_x86_64":
        return built_on <= image_glibc
    head = tag[: -len("_x86_64")]
    if head in _LEGACY_MANYLINUX:
        return _LEGACY_MANYLINUX[head] <= image_glibc
    match = re.fullmatch(r"manylinux_(\d+)_(\d+)", head)
    return bool(match) and (int(match.group(1)), int(match.group(2))) <= image_glibc


def wheel_platforms(wheel_file_text: str) -> List[str]:
    """The platform part of each Tag line (a compressed set like
    `manylinux_2_17_x86_64.manylinux2014_x86_64` stays one entry: alternatives)."""
    tags = HeaderParser().parsestr(wheel_file_text).get_all("Tag") or []
    return [t.strip().split("-")[-1] for t in tags if t.strip()]


def platforms_ok(platforms: str, built_on: Tuple[int, int] = IMAGE_GLIBC) -> bool:
    """A Tag line's platform (maybe a compressed set): fine when one of its alternatives is."""
    return any(platform_ok(p, built_on=built_on) for p in platforms.split("."))


def check(installed: Dict[str, Tuple[str, List[str]]], pins: Dict[str, str], python_version: str,
          built_on: Tuple[int, int] = IMAGE_GLIBC) -> None:
    """installed: normalized name -> (version, wheel platform tags); built_on: the host's glibc.
    Raises VenvMismatch."""
    fix = "rebuild it: rm -rf .venv-worker && make worker-venv"
    if not python_version.startswith("3.11"):
        raise VenvMismatch(f"the worker venv runs Python {python_version}, the image python3.11; {fix}")
    missing = sorted(f"{n}=={v}" for n, v in pins.items() if n not in installed)
    wrong = sorted(f"{n} {installed[n][0]} (lock {v})" for n, v in pins.items()
                   if n in installed and installed[n][0] != v)
    extra = sorted(f"{n}=={installed[n][0]}" for n in installed
                   if n not in pins and n not in BOOTSTRAP and n != PROJECT)
    problems = []
    if missing:
        problems.append("missing " + ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else ""))
    if wrong:
        problems.append("other versions " + ", ".join(wrong[:5]) + (" ..." if len(wrong) > 5 else ""))
    if extra:
        problems.append("not in the lock " + ", ".join(extra[:5]) + (" ..." if len(extra) > 5 else ""))
    if problems:
        raise VenvMismatch(f"the worker venv is not the lock ({'; '.join(problems)}); {fix}")
    for name, (version, platforms) in sorted(installed.items()):
        # Its tags are alternatives: the wheel runs where one of them does.
        bad = [] if any(platforms_ok(p, built_on=built_on) for p in platforms) else platforms
        if bad:
            raise VenvMismatch(f"{name}=={version} is installed for {bad[0]}, which Debian bookworm "
                               f"(glibc {IMAGE_GLIBC[0]}.{IMAGE_GLIBC[1]}, x86_64) cannot run; {fix} on a "
                               "bookworm-like host")


def site_packages(venv: Path) -> Path:
    found = sorted(venv.glob("lib/python3*/site-packages"))
    if not found:
        raise VenvMismatch(f"{venv} is not a virtualenv (no lib/python3*/site-packages); run: make worker-venv")
    return found[0]


def python_version(venv: Path) -> str:
    cfg = venv / "pyvenv.cfg"
    text = cfg.read_text() if cfg.exists() else ""
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip() in ("version", "version_info"):
            return value.strip()
    return site_packages(venv).parent.name.replace("python", "")


def scan(sp: Path) -> Tuple[Dict[str, Tuple[str, List[str]]], List[str]]:
    """Installed distributions of a site-packages folder, and this project's own files."""
    installed: Dict[str, Tuple[str, List[str]]] = {}
    own: List[str] = []
    for info in sorted(sp.glob("*.dist-info")):
        meta = info / "METADATA"
        if not meta.exists():
            continue
        headers = HeaderParser().parsestr(meta.read_text(errors="replace"), headersonly=True)
        name, version = normalize(headers.get("Name", "")), headers.get("Version", "")
        wheel = info / "WHEEL"
        platforms = wheel_platforms(wheel.read_text()) if wheel.exists() else []
        installed[name] = (version, platforms)
        if name == PROJECT:
            own.extend(_record_paths(info))
    return installed, own


def _record_paths(info: Path) -> Iterable[str]:
    yield f"./{info.name}"
    record = info / "RECORD"
    for line in record.read_text().splitlines() if record.exists() else ():
        path = line.rsplit(",", 2)[0]
        if path and not path.startswith(".."):  # ../../../bin/...: outside site-packages
            yield "./" + path


def main(argv: Optional[List[str]] = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3:
        print("usage: venv_for_image.py VENV LOCK EXCLUDE_FILE", file=sys.stderr)
        return 2
    venv, lock, exclude = Path(args[0]), Path(args[1]), Path(args[2])
    try:
        if not venv.is_dir():
            raise VenvMismatch(f"no worker venv at {venv}: run make worker-venv (it installs the image's lock)")
        sp = site_packages(venv)
        installed, own = scan(sp)
        check(installed, read_lock(lock.read_text()), python_version(venv), host_glibc())
    except VenvMismatch as e:
        print(f"venv_for_image: {e}", file=sys.stderr)
        return 1
    exclude.write_text("".join(f"{p}\n" for p in sorted(set(own))))
    print(sp.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
