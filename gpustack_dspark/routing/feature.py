"""Routing as the plugin sees it: two features, `routing` and `routing_gateway_routes`.

Fail-closed at every step: a bad policy file, a GPUStack whose proxy does not have the
expected shape, or a middleware that cannot be mounted leaves GPUStack's stock routing in
place and says why in the status. The gateway routes' least-load needs routing (its policy)
and is its own feature: GPUStack's route plugins can be missing while the proxy is fine.
"""

import asyncio
import logging
import os
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.feature import Context, Feature, FeatureOff, On, Task, TurnedOff
from gpustack_dspark.observe.gc_pauses import GcPauses
from gpustack_dspark.routing import gateway_sync, metrics
from gpustack_dspark.routing.format_middleware import FormatCheckMiddleware, FormatStats
from gpustack_dspark.routing.gpustack_patches import RoutingStats, apply_routing_hooks, release_slot
from gpustack_dspark.routing.inflight import InFlightTracker
from gpustack_dspark.routing.middleware import InFlightMiddleware
from gpustack_dspark.routing.policy import PolicyError, RoutingPolicy, load_policy

logger = logging.getLogger(__name__)

POLICY_ENV = "DSPARK_ROUTING_POLICY"


POLICY_FILE = "routing.yaml"


def policy_path(policy_dir: Optional[str] = None) -> Optional[Path]:
    """`--dspark-policy-dir DIR` -> DIR/routing.yaml if present; else the file named by
    DSPARK_ROUTING_POLICY; else none: the built-in defaults (the same as the shipped
    policies/routing.yaml)."""
    if policy_dir is not None:
        directory = Path(policy_dir)
        if not directory.is_dir():
            raise PolicyError(f"--dspark-policy-dir {policy_dir}: not a directory")
        candidate = directory / POLICY_FILE
        if candidate.exists():
            return candidate
    configured = os.environ.get(POLICY_ENV)
    return Path(configured) if configured else None


class RoutingFeature(Feature):
    """`routing`: the proxy's hooks (expected finish time, JSON-aware targets, one retry, ...),
    the in-flight slot and the JSON format check; this feature's section of the status."""

    name = "routing"
    section = "routing"
    when_off = "GPUStack's round-robin proxy stays"

    def __init__(self) -> None:
        self.tracker = InFlightTracker()
        self.stats = RoutingStats()
        self.format_stats = FormatStats()
        self.policy: Optional[RoutingPolicy] = None
        self.policy_source = "built-in defaults"
        self.hooks: List[str] = []
        self.gateway_last: Dict[str, Any] = {"passes": 0, "changed_routes": [], "error": None}
        self.gc = GcPauses()

    def start(self, ctx: Context) -> On:
        try:
            self.apply(ctx.app, ctx.settings.policy_dir)
        except ValueError as e:  # PolicyError: a bad policy file, in its own words
            raise FeatureOff(str(e)) from e
        return On({"hooks": list(self.hooks)})

    def tasks(self) -> List[Task]:
        return [self.gc_freeze_task] if self.policy.proxy.gc_freeze else []

    def apply(self, app, policy_dir: Optional[str] = None) -> None:
        """Raises PolicyError / RuntimeError with the reason routing stays stock."""
        path = policy_path(policy_dir)
        if path is not None:
            self.policy = load_policy(path)
            self.policy_source = str(path)
        else:
            self.policy = RoutingPolicy()
        result = apply_routing_hooks(self.policy, self.tracker, self.stats)
        if not result.applied:
            raise RuntimeError(result.reason)
        self.hooks = result.hooks
        self.gc.install()
        # Added first = inner: the format check runs inside the slot the in-flight middleware opens.
        app.add_middleware(FormatCheckMiddleware, stats=self.format_stats)
        app.add_middleware(InFlightMiddleware, release=lambda slot: release_slot(self.tracker, slot))
        try:
            metrics.register(self.tracker, lambda: dict(self.stats.decisions), lambda: dict(self.stats.retries),
                             self.format_stats.snapshot)
        except Exception as e:  # metrics are a view; routing works without them
            logger.warning("DSpark routing metrics not registered: %s", e)

    async def gc_freeze_task(self) -> None:
        """`proxy.gc_freeze: true`: freeze what startup left alive (see observe/gc_pauses.py)."""
        await self.gc.freeze_after_startup()

    async def gateway_task(self) -> None:
        """Keep DSpark routes in the gateway shape; never raises out (errors are reported)."""
        interval = self.policy.gateway.sync_interval_s if self.policy else 10.0
        while True:
            try:
                changed = await gateway_sync.sync_dspark_routes(self.policy.gateway)
                self.gateway_last["error"] = None
                if changed:
                    self.gateway_last["changed_routes"] = (self.gateway_last["changed_routes"] + changed)[-20:]
            except asyncio.CancelledError:
                raise
            except Exception as e:
                logger.exception("DSpark gateway route sync failed; retrying in %.0f s", interval)
                self.gateway_last["error"] = f"{type(e).__name__}: {e}"
            self.gateway_last["passes"] += 1
            await asyncio.sleep(interval)

    def status(self) -> Dict[str, Any]:
        instances = self.tracker.snapshot()
        return {
            "policy_source": self.policy_source,
            "policy": self.policy.model_dump(mode="json") if self.policy else None,
            "hooks": list(self.hooks),
            "balance": self.policy.proxy.balance.value if self.policy else None,
            "in_flight": {str(k): v for k, v in instances.items()},
            "in_flight_total": self.tracker.total(),
            "slow_start": {"ramping": {str(k): v for k, v in self.tracker.ramping().items()},
                           "ramps_started": self.tracker.slow_start.ramps_started},
            "affinity": self._affinity_status(),
            "tables": self.tracker.sizes(),
            "unmatched_releases": self.tracker.unmatched_releases,
            "decisions": dict(self.stats.decisions),
            "retries": dict(self.stats.retries),
            "silence": {"timeout_s": self.policy.proxy.silence_timeout_s if self.policy else None,
                        **self.stats.silence},
            "replica_statuses": dict(self.stats.statuses),
            "worker_row_copies": ({"copied": self.stats.worker_snapshots.copied,
                                   "failed": self.stats.worker_snapshots.failed}
                                  if self.stats.worker_snapshots else None),
            "gateway": dict(self.gateway_last),
            "gc": {"freeze": bool(self.policy and self.policy.proxy.gc_freeze), **self.gc.snapshot()},
            "json_format_checks": self.format_stats.totals(),
            "metrics": [metrics.IN_FLIGHT, metrics.WEIGHT, metrics.SERVICE_TIME, metrics.DECISIONS + "_total", metrics.RETRIES + "_total",
                        metrics.AFFINITY + "_total", metrics.AFFINITY_KEYS,
                        metrics.JSON_CHECKED + "_total", metrics.JSON_FORMAT_ERRORS + "_total"],
        }

    def _affinity_status(self) -> Dict[str, Any]:
        """Affinity's counters: per instance, requests at their key's home, requests spilled
        in from a full home, and the keys it got last (of the last 4,096)."""
        snapshot = self.tracker.affinity_snapshot()
        snapshot["active"] = bool(snapshot["enabled"] and self.policy
                                  and self.policy.proxy.balance.value != "round_robin")
        snapshot["instances"] = {str(k): v for k, v in snapshot["instances"].items()}
        return snapshot


class GatewayRoutes(Feature):
    """`routing_gateway_routes`: DSpark routes' least-load through GPUStack's route plugins
    (Higress), kept in shape by a task; its passes show in the routing section."""

    name = "routing_gateway_routes"
    requires = ("routing",)

    def __init__(self, routing: RoutingFeature) -> None:
        self.routing = routing

    def start(self, ctx: Context) -> On:
        if not self.routing.policy.gateway.least_load:
            raise TurnedOff("turned off by gateway.least_load=false in the routing policy")
        gs.require_feature(self.name)
        gateway_sync.register_marker_owner()
        return On()

    def tasks(self) -> List[Task]:
        return [self.routing.gateway_task]


__all__ = ["RoutingFeature", "GatewayRoutes", "PolicyError", "POLICY_ENV"]
