"""Every change this plugin makes to GPUStack's scheduler internals, in one place.

GPUStack 2.3 picks a resource-fit selector by backend name (scheduler.py,
`build_candidate_selector`); only the built-in vLLM backend gets vLLM's VRAM and
tensor-parallel fit. DSpark's CUDA flavour runs vLLM, so its models are routed to that
same selector — GPUStack's own class, not a re-implementation. The CPU flavour keeps the
custom-backend selector, the one path GPUStack has for CPU-only workers.

The placement policy (JSON label, isolation) wraps `find_candidate`, the function that
runs GPUStack's fixed filter chain: it narrows the worker list GPUStack starts from and
adds its reason to the messages (placement/enforce.py). GPUStack has no filter registry.

Each patch checks the GPUStack version and the exact shape of what it replaces (the GPUStack
seam: `gpustack_seam/shapes.py`); on any mismatch it applies nothing and says why, and
GPUStack schedules as it always did.
"""

import logging
from typing import Callable, List

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.gpustack_seam import PatchResult, SeamMismatch
from gpustack_dspark.placement import enforce
from gpustack_dspark.placement.flavour import uses_gpu_flavour
from gpustack_dspark.placement.policy import PlacementPolicy

logger = logging.getLogger(__name__)

__all__ = ["PatchResult", "route_gpu_flavour_to_vllm_fit", "enforce_placement_policy", "remove_patches"]


def route_gpu_flavour_to_vllm_fit() -> PatchResult:
    """Make GPUStack size DSpark CUDA models with its vLLM resource-fit selector."""
    try:
        scheduler, original = gs.target("scheduler.build_candidate_selector")
        if gs.is_patched(original):
            return PatchResult(True)
        selector = gs.resolve("VLLMResourceFitSelector")
    except SeamMismatch as e:
        return PatchResult(False, str(e))

    def build_candidate_selector(config, model, model_instances, cpu_only=False, ram_claim=None, *,
                                 resource_view):
        if (not cpu_only and not model.gpu_type_selector
                and uses_gpu_flavour(model.backend, model.backend_version)):
            return selector(config, model, model_instances, resource_view=resource_view)
        return original(config, model, model_instances, cpu_only, ram_claim, resource_view=resource_view)

    scheduler.build_candidate_selector = gs.wrap(original, build_candidate_selector)
    logger.info("DSpark CUDA models now use GPUStack's vLLM resource fit")
    return PatchResult(True)


def enforce_placement_policy(get_policy: Callable[[], PlacementPolicy]) -> PatchResult:
    """Run GPUStack's scheduler (`find_candidate`, used by the scheduling loop and by the
    deploy form's evaluator) through the placement policy that `get_policy` returns."""
    try:
        scheduler, original = gs.target("scheduler.find_candidate")
    except SeamMismatch as e:
        return PatchResult(False, str(e))
    original = gs.unwrap(original)  # re-applied (tests): replace, never stack

    async def find_candidate(session, config, model, workers, model_instances, role=None,
                             exclude_instance_id=None, group_id=None, resource_view=None):
        return await enforce.find_candidate_with_policy(
            original, get_policy, session, config, model, workers, model_instances, role=role,
            exclude_instance_id=exclude_instance_id, group_id=group_id, resource_view=resource_view)

    scheduler.find_candidate = gs.wrap(original, find_candidate)
    logger.info("GPUStack's scheduler now applies the DSpark placement policy")
    return PatchResult(True)


def remove_patches() -> List[str]:
    """Undo what this module applied (tests, and a plugin that turns itself off)."""
    removed = []
    try:
        scheduler = gs.scheduler
    except SeamMismatch:
        return removed
    for name in ("build_candidate_selector", "find_candidate"):
        current = getattr(scheduler, name, None)
        if current is not None and gs.is_patched(current):
            setattr(scheduler, name, gs.unwrap(current))
            removed.append(name)
    return removed
