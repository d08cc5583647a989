"""The CPU demo model: the tiny fixture served by DSpark replicas in containers.

`create_demo_model` is the one place that creates it (through GPUStack's REST API); it is
meant to become `gpustack-dspark apply -f deploy/models/cpu-demo.yaml` with the same fields.
"""

import shutil
from pathlib import Path
from typing import Any, Dict, List

from gpustack_dspark import backend
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.replica import CPU_VLLM_ARGS, DRAFT_MODEL, SERVED_NAME, TARGET_MODEL

WARMUP_REQUESTS = 8
# vLLM 0.32 picks the speculative method from the draft checkpoint's *path* when these occur
# in it (SpeculativeConfig: "dspark" in the path -> method dspark, GPU-only), overriding
# method=draft_model: found when a temp folder named dspark-* made the replicas fail on CPU.
VLLM_PATH_MARKERS = ("dspark", "eagle-", "eagle3", "dflash")


def equal_form(argv) -> List[str]:
    """`--flag value` argv in the backend's `--flag=value` parameter format."""
    out: List[str] = []
    for arg in argv:
        if arg.startswith("--") or not out:
            out.append(arg)
        else:
            out[-1] += "=" + arg
    return out


def stage_model_dir(dest: Path) -> Path:
    """Copy the fixture target + draft into a folder of their own.

    GPUStack bind-mounts the model path's *parent* read-write into a privileged container,
    so the model gets its own parent (never the checkout's fixtures/); the draft sits beside
    it and is visible in the container at the same path.
    """
    marker = next((m for m in VLLM_PATH_MARKERS if m in str(dest.resolve()).lower()), None)
    if marker:
        raise ValueError(f"model folder {dest}: vLLM would take the {marker!r} in this path as the "
                         f"speculative method of the draft model; use a folder whose path has none of "
                         f"{', '.join(VLLM_PATH_MARKERS)}")
    dest.mkdir(parents=True, exist_ok=True)
    for source in (TARGET_MODEL, DRAFT_MODEL):
        if not (dest / source.name).exists():
            shutil.copytree(source, dest / source.name)
    return dest / TARGET_MODEL.name


def demo_model_body(model_path: Path, cluster_id: int, replicas: int = 2,
                    name: str = SERVED_NAME) -> Dict[str, Any]:
    params: List[str] = [
        "--enable-dspark", "--dspark-grammar-mode=json", "--dspark-method=auto",
        f"--dspark-draft-model={model_path.parent / DRAFT_MODEL.name}",
        f"--dspark-warmup-requests={WARMUP_REQUESTS}",
        *equal_form(CPU_VLLM_ARGS),  # the fast, stable 2-core vLLM layout
    ]
    return {
        "name": name,
        "source": "local_path",
        "local_path": str(model_path),
        "backend": backend.BACKEND_NAME,
        "backend_version": backend.CPU_VERSION,
        "backend_parameters": params,
        "replicas": replicas,
        "cluster_id": cluster_id,
        "cpu_offloading": True,          # CPU worker: else "requires ~N GiB VRAM", pending
        "enable_model_route": True,      # routable under /v1 by its name
    }


def create_demo_model(api: GPUStackAPI, model_path: Path, cluster_id: int, replicas: int = 2,
                      name: str = SERVED_NAME) -> Dict[str, Any]:
    return api.post("/v2/models", demo_model_body(model_path, cluster_id, replicas, name))
