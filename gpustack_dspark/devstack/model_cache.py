"""The cache of built models (outside the checkout, never committed): where it is, and how a
build gets into it.

Contract: `build_once(dest, build, ready)` returns `dest` when `ready(dest)`, else runs
`build(scratch)` into a scratch folder beside `dest` and renames it into place, so a
half-written build is never found; a build another process renamed into place meanwhile is
taken as it is. The scratch folder is removed whatever happens.
"""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpustack-dspark" / "models"


def build_once(dest: Path, build: Callable[[Path], None], ready: Callable[[Path], bool]) -> Path:
    if ready(dest):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        build(scratch / "build")
        try:
            (scratch / "build").rename(dest)
        except OSError:  # built meanwhile by another process: theirs is as good
            if not ready(dest):
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return dest
