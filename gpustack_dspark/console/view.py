"""The JSON the console page reads (pure): one entry per DSpark deployment, its replicas
with GPUStack's state and the replica's own phase, in-flight counts from the routing layer,
the latest figures and the last hour of them, and the plugin's features."""

from typing import Any, Dict, List, Mapping, Optional

from gpustack_dspark.console.figures import Counters, hit_rate
from gpustack_dspark.knobs import KNOBS_BY_FLAG, scan_knob_tokens

# The replica's phases (worker/state.py) as the console names them.
PHASE_NAMES = {"loading": "loading", "warming": "warming", "ready": "warm", "failed": "failed"}
FIGURES = ("output_tokens_per_s", "latency_p50_s", "latency_p99_s", "acceptance_rate",
           "tokens_per_forward", "requests_per_s", "withheld", "format_errors", "prefix_cache_hit_rate",
           "grammar_compiles")


def knob_values(backend_parameters: Optional[List[str]]) -> Dict[str, Optional[str]]:
    """The DSpark flags of a model's backend parameters, {flag: value as written}; the last
    value of a flag wins, as in `dspark-serve`."""
    out: Dict[str, Optional[str]] = {}
    for token in scan_knob_tokens(list(backend_parameters or []), check_values=False):
        if token.flag in KNOBS_BY_FLAG:
            out.pop(token.flag, None)
            out[token.flag] = token.raw
    return out


def affinity_view(routing: Optional[Mapping[str, Any]], counters: Optional[Counters]) -> Dict[str, Any]:
    """Affinity at one replica: the proxy's counts (keys living here, requests at their key's
    home, requests spilled in from a full home or to even the load) and the replica's own cache
    figures since it started (prefix-cache hit rate, grammar compiles)."""
    routing = routing or {}
    values = counters.values if counters else {}
    rate = hit_rate(values)
    return {"keys": routing.get("affinity_keys"), "home": routing.get("affinity_home"),
            "spilled_in": routing.get("affinity_spilled_in"),
            "prefix_cache_hit_rate": None if rate is None else round(rate, 4),
            "prefix_cache_queries": values.get("prefix_cache_queries"),
            "grammar_compiles": values.get("grammar_compiles")}


def replica_view(instance: Mapping[str, Any], info: Optional[Mapping[str, Any]], info_error: Optional[str],
                 in_flight: Optional[int], routing: Optional[Mapping[str, Any]] = None,
                 counters: Optional[Counters] = None) -> Dict[str, Any]:
    state = str(instance.get("state") or "").lower()
    out: Dict[str, Any] = {
        "id": instance.get("id"),
        "name": instance.get("name"),
        "state": state,
        "state_message": instance.get("state_message") or None,
        "worker": instance.get("worker_name"),
        "restarts": instance.get("restart_count") or 0,
        "in_flight": in_flight or 0,
        "phase": None, "phase_reason": None, "warmup_s": None, "method": None,
        "speculative_length": None, "speculation": None, "info_error": info_error,
        "affinity": affinity_view(routing, counters),
    }
    if info:
        warmup = info.get("warmup") or {}
        drafting = info.get("drafting") or {}
        out.update(
            phase=PHASE_NAMES.get(str(info.get("phase")), info.get("phase")),
            phase_reason=info.get("reason"),
            warmup_s=warmup.get("duration_s"),
            method=info.get("method"),
            speculative_length=info.get("speculative_length"),
            speculation=drafting.get("budget"),
        )
    return out


def deployment_view(model: Mapping[str, Any], instances: List[Mapping[str, Any]],
                    infos: Mapping[Any, Mapping[str, Any]], info_errors: Mapping[Any, str],
                    in_flight: Mapping[Any, Mapping[str, Any]], series: Mapping[str, List],
                    totals: Mapping[str, Any], counters: Optional[Mapping[Any, Counters]] = None) -> Dict[str, Any]:
    replicas = [replica_view(i, infos.get(i.get("id")), info_errors.get(i.get("id")),
                             (in_flight.get(i.get("id")) or {}).get("in_flight"), in_flight.get(i.get("id")),
                             (counters or {}).get(i.get("id")))
                for i in sorted(instances, key=lambda i: i.get("id") or 0)]
    latest = {name: (points[-1][1] if points else None) for name, points in
              ((n, series.get(n) or []) for n in FIGURES)}
    return {
        "id": model.get("id"),
        "name": model.get("name"),
        "replicas_wanted": model.get("replicas"),
        "replicas_warm": sum(1 for r in replicas if r["state"] == "running" and r["phase"] == "warm"),
        "knobs": knob_values(model.get("backend_parameters")),
        "instances": replicas,
        "in_flight": sum(r["in_flight"] for r in replicas),
        "figures": latest,
        "totals": dict(totals),
        "series": {name: [[round(t, 1), v] for t, v in series.get(name) or []] for name in FIGURES},
    }


def console_view(deployments: List[Dict[str, Any]], features: Mapping[str, Any],
                 sampler: Mapping[str, Any], now: float) -> Dict[str, Any]:
    return {
        "generated_at": now,
        "sampler": dict(sampler),
        "features": dict(features),
        "deployments": sorted(deployments, key=lambda d: str(d.get("name"))),
    }
