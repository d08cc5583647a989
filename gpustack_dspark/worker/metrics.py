"""The replica's own Prometheus metrics, served on vLLM's `/metrics` (same port, same scrape).

vLLM 0.32 serves `/metrics` from prometheus-client's default REGISTRY when it runs one API
server process (no PROMETHEUS_MULTIPROC_DIR), which is how `dspark-serve` launches it; so a
collector registered there by the launcher lands in the same exposition as vLLM's own
`vllm:*` families, and GPUStack's worker scrapes both in one request. Values are read from
the replica's state at scrape time: nothing to update on the request path.

Other worker-side layers (e.g. the grammar-forced drafting layer) add their families with
`register_collector`:

    from gpustack_dspark.worker import metrics
    from prometheus_client.core import CounterMetricFamily

    def my_families():
        c = CounterMetricFamily("dspark_forced_tokens_proposed", "...", labels=["model_name"])
        c.add_metric([metrics.model_label()], counters.proposed)
        yield c

    metrics.register_collector(my_families)

A function that raises loses its own families for that scrape (logged once), never the
others, and never vLLM's. Names: docs/metrics.md.
"""

import logging
from typing import Callable, Iterable, Iterator, List, Optional

from gpustack_dspark.worker import state as worker_state

logger = logging.getLogger("gpustack_dspark.worker")

PHASES = (worker_state.LOADING, worker_state.WARMING, worker_state.READY, worker_state.FAILED)
WARMUP_STATE = "dspark_warmup_state"
WARMUP_DURATION = "dspark_warmup_duration_seconds"
WARMUP_REQUESTS = "dspark_warmup_requests"
REQUESTS = "dspark_requests"  # _total added by the exposition
SCHEMA_VIOLATIONS = "dspark_schema_violations"
GRAMMAR_REQUESTS = "dspark_grammar_requests"  # _total added by the exposition
INFO = "dspark_replica"  # _info
# State counters -> the `action` label of dspark_requests_total.
REQUEST_ACTIONS = ("json_injected", "legacy_converted", "kept", "rejected")
# State counters -> the `what` label of dspark_grammar_requests_total (the two grammar engines).
GRAMMAR_WHATS = {"engine_llguidance": "llguidance", "relaxed": "not_enforced", "second_attempts": "second_attempt",
                 "second_attempt_served": "second_attempt_served", "streams_checked": "stream_checked",
                 "oneof_narrowed": "oneof_narrowed", "oneof_narrowed_served": "oneof_narrowed_served"}

CollectorFn = Callable[[], Iterable]
_extra: List[CollectorFn] = []
_failed_once: set = set()
_registered = None


def model_label(state: Optional[worker_state.WorkerState] = None) -> str:
    """The `model_name` label value: the served model name, as vLLM's own families use."""
    state = state or worker_state.current()
    return (state.served_model_name or "") if state else ""


def register_collector(fn: CollectorFn) -> None:
    """Add a function yielding prometheus-client metric families to every scrape."""
    if fn not in _extra:
        _extra.append(fn)


def state_families(state: worker_state.WorkerState) -> Iterator:
    """The DSpark families for one replica state (pure apart from reading the state)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily

    model = model_label(state)
    phase = GaugeMetricFamily(WARMUP_STATE, "Warmup phase of this replica: 1 for the current phase, 0 for the others",
                              labels=["model_name", "phase"])
    for name in PHASES:
        phase.add_metric([model, name], 1.0 if state.phase == name else 0.0)
    yield phase
    duration = state.warmup.duration_s()
    if duration is not None:  # absent until warmup requests start (loading is not warmup)
        gauge = GaugeMetricFamily(WARMUP_DURATION, "Warmup duration: final once warm or failed, growing while warming",
                                  labels=["model_name"])
        gauge.add_metric([model], duration)
        yield gauge
    warmup = CounterMetricFamily(WARMUP_REQUESTS, "Warmup requests by outcome", labels=["model_name", "outcome"])
    warmup.add_metric([model, "succeeded"], state.warmup.succeeded)
    warmup.add_metric([model, "failed"], len(state.warmup.errors))
    yield warmup
    counters = dict(state.counters)
    requests = CounterMetricFamily(REQUESTS, "Completion requests seen by the DSpark middleware, by what it did",
                                   labels=["model_name", "action"])
    for action in REQUEST_ACTIONS:
        requests.add_metric([model, action], counters.get(action, 0))
    yield requests
    violations = CounterMetricFamily(SCHEMA_VIOLATIONS, "Finished replies withheld (HTTP 500, or a stream's error event "
                                     "in place of its end) because they broke the requested schema",
                                     labels=["model_name"])
    violations.add_metric([model], counters.get("schema_violations", 0))
    yield violations
    grammar = CounterMetricFamily(GRAMMAR_REQUESTS, "Schema requests by how the grammar engines served them: "
                                  "llguidance, not_enforced (lenient or relaxed; the reply is checked), "
                                  "second_attempt, second_attempt_served, stream_checked (streamed replies judged "
                                  "whole before their end went out), oneof_narrowed, oneof_narrowed_served (second "
                                  "attempts with a oneOf narrowed to the branch the first reply matched)", labels=["model_name", "what"])
    for key, what in GRAMMAR_WHATS.items():
        grammar.add_metric([model, what], counters.get(key, 0))
    yield grammar
    info = InfoMetricFamily(INFO, "What DSpark applied on this replica", labels=["model_name"])
    plan = state.plan
    info.add_metric([model], {"enabled": str(bool(plan.enabled)).lower(), "method": plan.method or "none",
                              "grammar_mode": plan.grammar_mode if plan.enabled else "off",
                              "speculative_length": str(plan.speculative_length or 0)})
    yield info


class DSparkWorkerCollector:
    def collect(self) -> Iterator:
        state = worker_state.current()
        if state is not None:
            yield from _guarded("dspark state", lambda: state_families(state))
        for fn in list(_extra):
            yield from _guarded(getattr(fn, "__name__", repr(fn)), fn)


def _guarded(name: str, fn: CollectorFn) -> List:
    try:
        return list(fn())
    except Exception as e:
        if name not in _failed_once:
            _failed_once.add(name)
            logger.warning("DSpark metrics collector %s failed (its metrics are left out): %s", name, e)
        return []


def install(registry=None) -> DSparkWorkerCollector:
    """Register the collector once per process (default: prometheus-client's REGISTRY)."""
    global _registered
    if _registered is None:
        if registry is None:
            from prometheus_client import REGISTRY as registry
        _registered = DSparkWorkerCollector()
        registry.register(_registered)
    return _registered
