"""The placement policy inside GPUStack's `find_candidate` (glue; installed by gpustack_patches).

The policy only narrows the worker list GPUStack's scheduler starts from. Everything else —
cluster, label, status and backend filters, the resource-fit selector (vLLM's for DSpark
CUDA models), scoring — is GPUStack's own, run unchanged on the narrowed list. When no
candidate is left, the policy's reason goes first in the messages GPUStack writes to the
instance's `state_message` ("No suitable workers. Details: ...").
"""

import logging
from typing import Awaitable, Callable, Optional

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.placement.policy import (
    ISOLATED,
    JSON_ONLY,
    ClusterPolicy,
    PlacementPolicy,
    WorkerView,
    isolation_message,
    missing_label_message,
    screen_workers,
)

logger = logging.getLogger(__name__)


async def _cluster_name(session, cluster_id: Optional[int]) -> Optional[str]:
    cluster = await gs.Cluster.one_by_id(session, cluster_id)
    return getattr(cluster, "name", None)


async def policy_for_model(policy: PlacementPolicy, session, cluster_id: Optional[int]) -> ClusterPolicy:
    """Per-cluster overrides are keyed by cluster name, read from GPUStack's database."""
    if not policy.clusters or cluster_id is None or session is None:
        return policy.default
    try:
        return policy.for_cluster(await _cluster_name(session, cluster_id))
    except Exception as e:  # a lookup failure must not stop scheduling
        logger.warning("placement policy: cannot read cluster %s (%s); using the default policy", cluster_id, e)
        return policy.default


def _cluster_of(model, workers) -> Optional[int]:
    """The model's cluster; GPUStack's evaluator may hand a spec without one, with the
    workers of a single cluster."""
    if getattr(model, "cluster_id", None) is not None:
        return model.cluster_id
    clusters = {getattr(w, "cluster_id", None) for w in workers}
    return clusters.pop() if len(clusters) == 1 else None


async def find_candidate_with_policy(original: Callable[..., Awaitable], get_policy: Callable[[], PlacementPolicy],
                                     session, config, model, workers, model_instances, role=None,
                                     exclude_instance_id=None, group_id=None, resource_view=None):
    def run(some_workers):
        return original(session, config, model, some_workers, model_instances, role=role,
                        exclude_instance_id=exclude_instance_id, group_id=group_id,
                        resource_view=resource_view)

    try:
        cluster_id = _cluster_of(model, workers)
        policy = await policy_for_model(get_policy(), session, cluster_id)
        views = [WorkerView(w.name, w.cluster_id, w.labels or {}) for w in workers]
        screening = screen_workers(model.backend, model.worker_selector, cluster_id, views, policy)
    except Exception:  # a policy bug must not stop GPUStack from scheduling
        logger.exception("placement policy failed for model %s; scheduling without it",
                         getattr(model, "name", "?"))
        return await run(workers)

    if screening.rule not in (JSON_ONLY, ISOLATED) or not screening.excluded:
        return await run(workers)

    kept = [workers[i] for i in screening.keep]
    candidate, messages = await run(kept)
    if candidate is not None:
        return candidate, messages

    if screening.rule == JSON_ONLY:
        reason = missing_label_message(model.backend, screening, policy)
    else:
        reason = isolation_message(screening, policy, await _would_fit_on(run, workers, screening))
    return None, [reason + "\n", *messages]


async def _would_fit_on(run, workers, screening) -> Optional[str]:
    """Ask GPUStack's own filters and fit, on the excluded workers only, whether the model
    would have fitted there: the message then says isolation is what kept it pending."""
    excluded = set(screening.excluded)
    try:
        candidate, _ = await run([w for w in workers if w.name in excluded])
    except Exception as e:
        logger.debug("placement policy: probing the isolated workers failed: %s", e)
        return None
    return candidate.worker.name if candidate is not None else None
