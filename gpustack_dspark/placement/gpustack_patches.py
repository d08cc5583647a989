"""Every change this plugin makes to GPUStack's scheduler internals, in one place.

GPUStack 2.3 picks a resource-fit selector by backend name (scheduler.py,
`build_candidate_selector`); only the built-in vLLM backend gets vLLM's VRAM and
tensor-parallel fit. DSpark's CUDA flavour runs vLLM, so its models are routed to that
same selector — GPUStack's own class, not a re-implementation. The CPU flavour keeps the
custom-backend selector, the one path GPUStack has for CPU-only workers.

The placement policy (JSON label, isolation) wraps `find_candidate`, the function that
runs GPUStack's fixed filter chain: it narrows the worker list GPUStack starts from and
adds its reason to the messages (placement/enforce.py). GPUStack has no filter registry.

Each patch checks the GPUStack version and the exact shape of what it replaces; on any
mismatch it applies nothing and says why, and GPUStack schedules as it always did.
"""

import inspect
import logging
from dataclasses import dataclass
from typing import Callable, List, Optional

from gpustack_dspark.placement import enforce
from gpustack_dspark.placement.flavour import uses_gpu_flavour
from gpustack_dspark.placement.policy import PlacementPolicy
from gpustack_dspark.versions import check_gpustack

logger = logging.getLogger(__name__)

EXPECTED_SELECTOR_PARAMS = ["config", "model", "model_instances", "cpu_only", "ram_claim", "resource_view"]
EXPECTED_FIND_CANDIDATE_PARAMS = ["session", "config", "model", "workers", "model_instances", "role",
                                  "exclude_instance_id", "group_id", "resource_view"]
_PATCH_MARK = "_dspark_patched"


@dataclass(frozen=True)
class PatchResult:
    applied: bool
    reason: str = ""


def _signature_problem(function: Callable, name: str, expected: list) -> Optional[str]:
    try:
        params = list(inspect.signature(function).parameters)
    except (TypeError, ValueError) as e:
        return f"cannot read the signature of {name}: {e}"
    if params != expected:
        return f"{name} takes {params}, expected {expected}"
    return None


def _gpustack_scheduler():
    """(GPUStack's scheduler module, None) or (None, why it cannot be patched)."""
    version = check_gpustack()
    if not version.ok:
        return None, version.reason
    try:
        from gpustack.scheduler import scheduler
    except ImportError as e:
        return None, f"GPUStack's scheduler is not importable: {e}"
    return scheduler, None


def route_gpu_flavour_to_vllm_fit() -> PatchResult:
    """Make GPUStack size DSpark CUDA models with its vLLM resource-fit selector."""
    scheduler, reason = _gpustack_scheduler()
    if scheduler is None:
        return PatchResult(False, reason)
    try:
        from gpustack.policies.candidate_selectors import VLLMResourceFitSelector
    except ImportError as e:
        return PatchResult(False, f"GPUStack's scheduler is not importable: {e}")

    original = getattr(scheduler, "build_candidate_selector", None)
    if original is None:
        return PatchResult(False, "gpustack.scheduler.scheduler.build_candidate_selector is missing")
    if getattr(original, _PATCH_MARK, False):
        return PatchResult(True)
    problem = _signature_problem(original, "build_candidate_selector", EXPECTED_SELECTOR_PARAMS)
    if problem:
        return PatchResult(False, problem)

    def build_candidate_selector(config, model, model_instances, cpu_only=False, ram_claim=None, *,
                                 resource_view):
        if (not cpu_only and not model.gpu_type_selector
                and uses_gpu_flavour(model.backend, model.backend_version)):
            return VLLMResourceFitSelector(config, model, model_instances, resource_view=resource_view)
        return original(config, model, model_instances, cpu_only, ram_claim, resource_view=resource_view)

    setattr(build_candidate_selector, _PATCH_MARK, True)
    build_candidate_selector.__wrapped__ = original
    build_candidate_selector.__doc__ = original.__doc__
    scheduler.build_candidate_selector = build_candidate_selector
    logger.info("DSpark CUDA models now use GPUStack's vLLM resource fit")
    return PatchResult(True)


def enforce_placement_policy(get_policy: Callable[[], PlacementPolicy]) -> PatchResult:
    """Run GPUStack's scheduler (`find_candidate`, used by the scheduling loop and by the
    deploy form's evaluator) through the placement policy that `get_policy` returns."""
    scheduler, reason = _gpustack_scheduler()
    if scheduler is None:
        return PatchResult(False, reason)

    original = getattr(scheduler, "find_candidate", None)
    if original is None:
        return PatchResult(False, "gpustack.scheduler.scheduler.find_candidate is missing")
    if getattr(original, _PATCH_MARK, False):
        original = original.__wrapped__  # re-applied (tests): replace, never stack
    if not inspect.iscoroutinefunction(original):
        return PatchResult(False, "gpustack.scheduler.scheduler.find_candidate is no longer a coroutine function")
    problem = _signature_problem(original, "find_candidate", EXPECTED_FIND_CANDIDATE_PARAMS)
    if problem:
        return PatchResult(False, problem)

    async def find_candidate(session, config, model, workers, model_instances, role=None,
                             exclude_instance_id=None, group_id=None, resource_view=None):
        return await enforce.find_candidate_with_policy(
            original, get_policy, session, config, model, workers, model_instances, role=role,
            exclude_instance_id=exclude_instance_id, group_id=group_id, resource_view=resource_view)

    setattr(find_candidate, _PATCH_MARK, True)
    find_candidate.__wrapped__ = original
    find_candidate.__doc__ = original.__doc__
    scheduler.find_candidate = find_candidate
    logger.info("GPUStack's scheduler now applies the DSpark placement policy")
    return PatchResult(True)


def remove_patches() -> List[str]:
    """Undo what this module applied (tests, and a plugin that turns itself off)."""
    removed = []
    try:
        from gpustack.scheduler import scheduler
    except ImportError:
        return removed
    current = getattr(scheduler, "build_candidate_selector", None)
    if current is not None and getattr(current, _PATCH_MARK, False):
        scheduler.build_candidate_selector = current.__wrapped__
        removed.append("build_candidate_selector")
    current = getattr(scheduler, "find_candidate", None)
    if current is not None and getattr(current, _PATCH_MARK, False):
        scheduler.find_candidate = current.__wrapped__
        removed.append("find_candidate")
    return removed
