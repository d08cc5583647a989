"""Applies `gateway.plan_route` to DSpark models' routes through GPUStack's own route
plugins (the same write path as `PUT /v2/model-routes/{id}` with a `plugins` section).

The route row's meta is updated too, which emits GPUStack's UPDATED event: its gateway
reconcile then renders the Higress rules from what is stored. With the gateway disabled
the stored configuration is simply ready for when it is turned on.
"""

import logging
from typing import Dict, List

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark import backend
from gpustack_dspark.routing.gateway import MARKER_KEY, plan_route
from gpustack_dspark.routing.policy import GatewayPolicy

logger = logging.getLogger(__name__)


def register_marker_owner() -> None:
    """Own `route.meta["dspark-routing"]` as a route plugin so GPUStack's model-metadata
    sync keeps it and API responses hide it. Idempotent."""
    if gs.get_route_plugin(MARKER_KEY) is not None:
        return

    class DSparkRoutingMarker(gs.RoutePlugin):
        name = MARKER_KEY  # no RouteExtension: no API section, no hooks, meta only

    gs.register_route_plugin(DSparkRoutingMarker())


async def sync_dspark_routes(policy: GatewayPolicy) -> List[Dict[str, object]]:
    """One pass over the routes that have a DSpark target; returns what changed."""
    from sqlmodel import col, select

    enrich_routes, get_route_plugin, lb_plugin = gs.enrich_routes, gs.get_route_plugin, gs.lb_plugin
    ModelRoute, ModelRouteTarget, Model, async_session = gs.ModelRoute, gs.ModelRouteTarget, gs.Model, gs.async_session

    least_load = get_route_plugin("least-load")
    session_affinity = get_route_plugin("session-affinity")
    changed: List[Dict[str, object]] = []
    async with async_session() as session:
        model_ids = (await session.exec(
            select(Model.id).where(Model.backend == backend.BACKEND_NAME, col(Model.deleted_at).is_(None))
        )).all()
        if not model_ids:
            return changed
        route_ids = sorted(set((await session.exec(
            select(ModelRouteTarget.route_id).where(
                col(ModelRouteTarget.model_id).in_(model_ids), col(ModelRouteTarget.deleted_at).is_(None))
        )).all()))
        for route_id in route_ids:
            route = await ModelRoute.one_by_id(session, route_id)
            if route is None or route.deleted_at is not None:
                continue
            sections = (await enrich_routes([route], session)).get(route.id, {})
            route_targets = await ModelRouteTarget.all_by_field(session, "route_id", route.id)
            weights = {t.id: t.weight or 0 for t in route_targets
                       if t.deleted_at is None and not t.fallback_status_codes}
            plan = plan_route(sections.get("least-load"), sections.get("session-affinity"),
                              (route.meta or {}).get(MARKER_KEY), weights, policy)
            if not plan.changes:
                continue
            if plan.least_load and least_load is not None:
                await least_load.on_route_write("update", route, plan.least_load, session)
            if plan.session_affinity and session_affinity is not None:
                await session_affinity.on_route_write("update", route, plan.session_affinity, session)
            for target in route_targets:
                if target.id in plan.zero_weight_target_ids:
                    await target.update(session, {"weight": 0}, auto_commit=False)
            meta = dict(route.meta or {})
            meta[MARKER_KEY] = plan.marker or meta.get(MARKER_KEY) or {}
            await route.update(session, {"meta": meta}, auto_commit=False)
            await session.commit()
            await lb_plugin.refresh_lb_mode(route, session)
            entry = {"route_id": route.id, "route": route.name, "least_load": bool(plan.least_load),
                     "session_affinity_off": bool(plan.session_affinity),
                     "zeroed_weights": list(plan.zero_weight_target_ids)}
            logger.info("DSpark route %s configured for the gateway: %s", route.name, entry)
            changed.append(entry)
    return changed
