"""Higress gateway mode: what a DSpark model's route should carry (pure).

GPUStack 2.3's gateway scores instances with its `least-load` capability when a route is
in "scoring" mode (no positive target weights, a capability enabled). GPUStack turns
`least-load` and `session-affinity` on for multi-replica deployments it creates; a
single-replica deployment gets a weight-100 target and neither. For DSpark routes we
want least-load always (replicas are added later) and no session affinity — JSON
requests are independent, and pinning them defeats load spreading — unless the user
turns it back on, which the marker remembers.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence

from gpustack_dspark.routing.policy import GatewayPolicy, GatewaySessionAffinity

MARKER_KEY = "dspark-routing"  # route.meta key, owned through our registered route plugin
MARKER_VERSION = 1


@dataclass(frozen=True)
class RoutePlan:
    least_load: Optional[Dict[str, Any]] = None  # section to write through GPUStack's plugin
    session_affinity: Optional[Dict[str, Any]] = None
    zero_weight_target_ids: Sequence[int] = ()
    marker: Optional[Dict[str, Any]] = None  # new marker, None = unchanged

    @property
    def changes(self) -> bool:
        return bool(self.least_load or self.session_affinity or self.zero_weight_target_ids or self.marker)


def plan_route(
    least_load: Optional[Dict[str, Any]],
    session_affinity: Optional[Dict[str, Any]],
    marker: Optional[Dict[str, Any]],
    candidate_weights: Dict[int, int],
    policy: GatewayPolicy,
) -> RoutePlan:
    """`candidate_weights`: target id -> weight of the route's non-fallback targets.

    Idempotent: a route already in the wanted shape yields no changes.
    """
    marker = dict(marker or {})
    new_marker = dict(marker)
    ll_write = None
    sa_write = None
    zero = ()
    if policy.least_load:
        if not (least_load or {}).get("enabled"):
            ll_write = {**(least_load or {}), "enabled": True}
        # One target carries a weight only by GPUStack's single-replica default; a weight
        # keeps the route "weighted", where capability scoring is not applied. Several
        # weighted targets are a business split the user chose: left alone.
        if len(candidate_weights) == 1:
            zero = tuple(t for t, w in candidate_weights.items() if (w or 0) > 0)
    if policy.session_affinity is GatewaySessionAffinity.OFF and not marker.get("session_affinity_reset"):
        if (session_affinity or {}).get("enabled"):
            sa_write = {**session_affinity, "enabled": False}
        new_marker["session_affinity_reset"] = True
    new_marker["version"] = MARKER_VERSION
    return RoutePlan(ll_write, sa_write, zero, new_marker if new_marker != marker else None)
