"""The DSpark backend's name, versions and health path (pure constants), and where a
replica GPUStack lists answers.

Kept apart from backend.py (server side: registration) so the CLI, which must not import
the server side, names the backend from the same source when it writes model documents.
"""

from typing import Any, Dict, Mapping, Optional

from gpustack_dspark.versions import SUPPORTED_VLLM_VERSION

BACKEND_NAME = "DSpark-custom"
CUDA_VERSION = f"{SUPPORTED_VLLM_VERSION}-cuda-custom"
CPU_VERSION = f"{SUPPORTED_VLLM_VERSION}-cpu-custom"
# Served by the DSpark worker (dspark-serve): 503 until vLLM is healthy and warmup is done.
HEALTH_CHECK_PATH = "/dspark/ready"

# GPUStack's model update schema requires the name and the source; everything else not sent
# is left as it is (a sparse update). `backend` too: without it GPUStack's model validator
# re-derives distributed_inference_across_workers as for its default backend and writes that.
SPARSE_UPDATE_KEEP = ("name", "source", "backend", "distributed_inference_across_workers", "huggingface_repo_id",
                      "huggingface_filename", "model_scope_model_id", "model_scope_file_path", "local_path")


def sparse_model_update(model: Mapping[str, Any], changes: Mapping[str, Any]) -> Dict[str, Any]:
    """The body of the sparse `PUT /v2/models/{id}` that changes only `changes` of `model`
    (a GET's answer): `gpustack-dspark apply`, the rolling sweep and the console all send it."""
    return {**{k: model[k] for k in SPARSE_UPDATE_KEEP if model.get(k) is not None}, **changes}


def replica_url(instance: Mapping[str, Any]) -> Optional[str]:
    """A GPUStack model instance's own address (its worker's IP and its port), None before it has one."""
    port = instance.get("port") or (instance.get("ports") or [None])[0]
    return f"http://{instance.get('worker_ip') or '127.0.0.1'}:{port}" if port else None


def replica_info(instance: Mapping[str, Any], timeout_s: float = 1.0) -> Optional[Dict[str, Any]]:
    """The replica's `/dspark/info`, or None when it does not answer (yet)."""
    import httpx

    url = replica_url(instance)
    if not url:
        return None
    try:
        r = httpx.get(f"{url}/dspark/info", timeout=timeout_s, trust_env=False)
        return r.json() if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
