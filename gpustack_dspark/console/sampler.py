"""Glue: every few seconds, read the DSpark deployments and their instances from GPUStack's
database, each replica's `/dspark/info` and `/metrics`, and keep the figures in bounded
memory (`series.SeriesStore`, the last hour). The console's endpoint shapes the latest
sample with the routing layer's live in-flight counts (`view.py`).

A replica that does not answer is shown with the reason; a failing pass is reported in the
plugin's features and retried; nothing here can reach GPUStack's request path."""

import asyncio
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark import backend_ids
from gpustack_dspark.backend_ids import replica_url
from gpustack_dspark.console import figures, view
from gpustack_dspark.console.series import SeriesStore

logger = logging.getLogger(__name__)

INTERVAL_S = 5.0
WINDOW_S = 3600.0
REPLICA_TIMEOUT_S = 2.0



async def read_deployments() -> List[Tuple[Dict[str, Any], List[Dict[str, Any]]]]:
    """The DSpark models (not deleted) with their instances, as JSON-able dicts."""
    from sqlmodel import col, select

    Model, ModelInstance, async_session = gs.Model, gs.ModelInstance, gs.async_session

    out = []
    async with async_session() as session:
        models = (await session.exec(select(Model).where(
            Model.backend == backend_ids.BACKEND_NAME, col(Model.deleted_at).is_(None)))).all()
        for model in models:
            instances = (await session.exec(select(ModelInstance).where(
                ModelInstance.model_id == model.id, col(ModelInstance.deleted_at).is_(None)))).all()
            out.append((model.model_dump(mode="json"), [i.model_dump(mode="json") for i in instances]))
    return out


async def read_replica(client, instance: Mapping[str, Any]) -> Tuple[Optional[dict], Optional[figures.Counters],
                                                                  Optional[str]]:
    """(info, counters, error) of one replica; error says why there is none."""
    url = replica_url(instance)
    if not url:
        return None, None, "no port yet"
    try:
        info_r, metrics_r = await asyncio.gather(client.get(f"{url}/dspark/info"), client.get(f"{url}/metrics"))
    except Exception as e:
        return None, None, f"not reachable: {type(e).__name__}"
    if info_r.status_code != 200:
        return None, None, f"/dspark/info answered {info_r.status_code}"
    try:
        info = info_r.json()
        counters = figures.parse_metrics(metrics_r.text) if metrics_r.status_code == 200 else None
    except ValueError as e:
        return None, None, f"unreadable answer: {e}"[:200]
    return info, counters, None


class ConsoleSampler:
    def __init__(self, in_flight: Callable[[], Mapping[Any, Mapping[str, Any]]],
                 format_checks: Callable[[], Dict[Tuple[str, str, str], int]],
                 report: Callable[..., None], interval_s: float = INTERVAL_S, window_s: float = WINDOW_S) -> None:
        self.in_flight = in_flight
        self.format_checks = format_checks
        self.report = report
        self.interval_s = interval_s
        self.series = SeriesStore(window_s, interval_s)
        self._latest: List[Tuple[Dict[str, Any], List[Dict[str, Any]], Dict, Dict, Dict]] = []
        self._prev: Dict[Any, Tuple[float, Dict[Any, figures.Counters], int]] = {}
        self._totals: Dict[Any, Dict[str, float]] = {}
        self.last_sample_at: Optional[float] = None
        self.error: Optional[str] = None

    async def task(self) -> None:
        import httpx

        async with httpx.AsyncClient(timeout=REPLICA_TIMEOUT_S, trust_env=False) as client:
            while True:
                try:
                    await self.sample(client)
                    if self.error:
                        self.report(None)
                    self.error = None
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # a bug or the database away: keep the last sample, retry
                    self.error = f"{type(e).__name__}: {e}"[:300]
                    logger.warning("DSpark console sampling failed: %s", self.error)
                    self.report(self.error)
                await asyncio.sleep(self.interval_s)

    async def sample(self, client) -> None:
        deployments = await read_deployments()
        errors_by_model = figures.format_errors_by_model(self.format_checks())
        latest = []
        now = time.time()
        for model, instances in deployments:
            read = await asyncio.gather(*(read_replica(client, i) for i in instances))
            infos = {i["id"]: r[0] for i, r in zip(instances, read) if r[0] is not None}
            info_errors = {i["id"]: r[2] for i, r in zip(instances, read) if r[2] is not None}
            counters = {i["id"]: r[1] for i, r in zip(instances, read) if r[1] is not None}
            format_errors = errors_by_model.get(model["name"], 0)
            prev = self._prev.get(model["id"])
            # Per replica, then summed: a restarted replica counts from zero, the others go on.
            inc = figures.sum_counters(figures.increase(prev[1].get(i), c) for i, c in counters.items()) \
                if prev else None
            point = figures.rates(inc, now - prev[0] if prev else 0.0)
            point["format_errors"] = (max(0, format_errors - prev[2]) if prev else None)
            self._prev[model["id"]] = (now, counters, format_errors)
            totals = self._totals.setdefault(model["id"], {"format_errors": 0, "withheld": 0})
            totals["format_errors"] = format_errors
            totals["withheld"] = sum(int(((info or {}).get("requests") or {}).get("schema_violations", 0))
                                     for info in infos.values())
            self.series.add(model["id"], now, point)
            latest.append((model, instances, infos, info_errors, counters))
        ids = [m["id"] for m, _ in deployments]
        self.series.keep_only(ids)
        for gone in [k for k in self._prev if k not in ids]:
            self._prev.pop(gone, None)
            self._totals.pop(gone, None)
        self._latest = latest
        self.last_sample_at = now

    def replica_caches(self) -> Dict[str, Any]:
        in_flight = self.in_flight()
        deployments = {model["name"]: {str(i["id"]): view.affinity_view(in_flight.get(i["id"]), counters.get(i["id"]))
                                       for i in instances}
                       for model, instances, _infos, _errors, counters in self._latest}
        return {"last_sample_at": self.last_sample_at, "deployments": deployments}

    def view(self, features: Mapping[str, Any]) -> Dict[str, Any]:
        now = time.time()
        in_flight = self.in_flight()
        deployments = [view.deployment_view(model, instances, infos, info_errors, in_flight,
                                            self.series.get(model["id"], now), self._totals.get(model["id"], {}),
                                            counters)
                       for model, instances, infos, info_errors, counters in self._latest]
        sampler = {"interval_s": self.interval_s, "window_s": self.series.window_s,
                   "last_sample_at": self.last_sample_at, "error": self.error}
        return view.console_view(deployments, features, sampler, now)
