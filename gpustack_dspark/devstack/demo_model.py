"""The model the container path deploys: a model YAML applied with `gpustack-dspark apply`,
the command a user runs (default `deploy/models/cpu-demo.yaml`: the real model,
SmolLM2-135M-Instruct, 2 replicas, the CPU image; `cpu-demo-fixture.yaml`: the tiny order-JSON
fixture, what the container tests deploy).

A file whose `local_path` names the real model's cache link (`real_model.link_path`, under any
cache folder) needs the conversion first: `real_model_wanted` says so, `with_real_model` gives the
file to apply once it is there (the file itself, or a copy naming the conversion where the
file's `~/.cache` is not this machine's cache folder).
"""

import shutil
import subprocess
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from gpustack_dspark import bounded

from gpustack_dspark.devstack.replica import REPO_ROOT

DEMO_MODEL_FILE = REPO_ROOT / "deploy" / "models" / "cpu-demo.yaml"
FIXTURE_MODEL_FILE = REPO_ROOT / "deploy" / "models" / "cpu-demo-fixture.yaml"


def _document(path: Path) -> dict:
    docs = [d for d in bounded.load_yaml_all(bounded.read_text(path, bounded.MODEL_FILE), bounded.MODEL_FILE)
            if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict) or not docs[0].get("name"):
        raise ValueError(f"{path}: the demo deploys one model; give a file with one document that has a name")
    return docs[0]


def model_name_and_replicas(path: Path) -> Tuple[str, int]:
    """The one model a demo file declares: its name and replica count (GPUStack's default 1)."""
    doc = _document(path)
    return str(doc["name"]), int(doc.get("replicas", 1))


def real_model_wanted(path: Path) -> bool:
    """Whether the file's model is the real model's cache link (it must be converted first)."""
    from gpustack_dspark.devstack.real_model import MODEL_NAME

    local = _document(path).get("local_path")
    return isinstance(local, str) and Path(local).parts[-3:] == ("gpustack-dspark", "models", MODEL_NAME)


def with_real_model(path: Path, model_dir: Path, scratch: Path) -> Path:
    """The file to apply once the real model is at `model_dir`: `path` when its local_path reaches
    it, else a copy in `scratch` with local_path set to `model_dir`."""
    doc = _document(path)
    if Path(str(doc["local_path"])).expanduser().resolve() == model_dir.resolve():
        return path
    import yaml

    copy = scratch / path.name
    copy.write_text(yaml.safe_dump({**doc, "local_path": str(model_dir)}, sort_keys=False))
    return copy


def cli_command() -> List[str]:
    """`gpustack-dspark` from this interpreter's environment (the console script when installed)."""
    script = Path(sys.executable).parent / "gpustack-dspark"
    if script.exists():
        return [str(script)]
    found = shutil.which("gpustack-dspark")
    return [found] if found else [sys.executable, "-m", "gpustack_dspark.cli.main"]


def apply_argv(path: Path, server_url: str, api_key: str) -> List[str]:
    # --no-wait: the stack watches the replicas itself (it records every state on the way).
    return [*cli_command(), "apply", "-f", str(path), "--no-wait", "--server", server_url, "--api-key", api_key]


def apply_model_file(path: Path, server_url: str, api_key: str, log_path: Path, timeout_s: float = 300) -> str:
    """`gpustack-dspark apply -f PATH`; returns what it printed, raises with it on failure."""
    result = subprocess.run(apply_argv(path, server_url, api_key), capture_output=True, text=True,
                            timeout=timeout_s)
    output = result.stdout + result.stderr
    with open(log_path, "a") as log:
        log.write(output)
    if result.returncode != 0:
        raise RuntimeError(f"gpustack-dspark apply -f {path} failed (exit {result.returncode}):\n{output[-3000:]}")
    return output
