"""Which DSpark image flavour a model deploys with (pure)."""

from typing import Optional

from gpustack_dspark import backend


def is_dspark_model(backend_name: Optional[str]) -> bool:
    return backend_name == backend.BACKEND_NAME


def uses_gpu_flavour(backend_name: Optional[str], backend_version: Optional[str]) -> bool:
    """True for DSpark models on the CUDA image: those are sized by vLLM's VRAM fit.

    A model without a version deploys the backend's default (CUDA). User-added versions
    are left to GPUStack's stock behaviour: we do not know what their image runs.
    """
    if not is_dspark_model(backend_name):
        return False
    return (backend_version or backend.CUDA_VERSION) == backend.CUDA_VERSION
