"""Prometheus metrics for routing, read from the live tracker and counters at scrape time.

GPUStack's server exporter (`--metrics-port`, path `/metrics`) serves prometheus-client's
default registry, so registering here is all it takes. Names:

- `dspark_routing_in_flight_requests{instance_id, model_id}` gauge: requests a model
  instance is serving now, as counted by the plugin's proxy middleware.
- `dspark_routing_instance_weight{instance_id, model_id}` gauge: the instance's slow-start
  weight (1 = full share; below 1 while it ramps in after turning RUNNING).
- `dspark_routing_seconds_per_token{instance_id, model_id}` gauge: the live estimate of the
  instance's service time per output token that expected-finish-time balancing uses.
- `dspark_routing_decisions_total{decision}` counter: JSON-aware target choices;
  decision is json / general / json_only / refused / unchanged.
- `dspark_routing_retries_total{outcome}` counter: outcome retried (sent to another
  instance), no_other_instance (nothing to retry on), broken_streams or silent_given_up (a
  try whose replica sent nothing for `proxy.silence_timeout_s` and failed its health check).
- `dspark_routing_affinity_total{outcome}` counter: requests with an affinity key sent to their
  key's home replica (home), elsewhere past a full home or to one far below it (spilled), by load
  because every replica was at its bound (all_full); unkeyed: no schema or shared prefix.
- `dspark_routing_affinity_keys{instance_id}` gauge: affinity keys living on the instance (where
  a key's first request went, or where the load bound's other side moved it; of the last 4,096).
- `dspark_json_responses_checked_total{model_name, model_instance_id, result}` counter: JSON replies
  checked in the proxy (format_check.py); result ok / not_json / schema_mismatch /
  truncated / unchecked.
- `dspark_json_format_errors_total{model_name, model_instance_id, reason}` counter: the not_json and
  schema_mismatch part of the above, for alerts.
"""

import logging
from typing import Callable, Dict, Iterator, Optional, Tuple

from gpustack_dspark.routing.inflight import InFlightTracker

logger = logging.getLogger(__name__)

IN_FLIGHT = "dspark_routing_in_flight_requests"
WEIGHT = "dspark_routing_instance_weight"
SERVICE_TIME = "dspark_routing_seconds_per_token"
DECISIONS = "dspark_routing_decisions"
RETRIES = "dspark_routing_retries"
AFFINITY = "dspark_routing_affinity"
AFFINITY_KEYS = "dspark_routing_affinity_keys"
JSON_CHECKED = "dspark_json_responses_checked"
JSON_FORMAT_ERRORS = "dspark_json_format_errors"
FORMAT_ERROR_RESULTS = ("not_json", "schema_mismatch")

_registered = None  # one collector per process; a second plugin instance swaps its sources in


class RoutingCollector:
    def __init__(self, tracker: InFlightTracker, decisions: Callable[[], Dict[str, int]],
                 retries: Callable[[], Dict[str, int]],
                 format_checks: Optional[Callable[[], Dict[Tuple[str, str, str], int]]] = None):
        self.tracker = tracker
        self.decisions = decisions
        self.retries = retries
        self.format_checks = format_checks or dict

    def collect(self) -> Iterator:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        in_flight = GaugeMetricFamily(IN_FLIGHT, "In-flight requests per model instance (DSpark routing)",
                                      labels=["instance_id", "model_id"])
        weight = GaugeMetricFamily(WEIGHT, "Slow-start weight per model instance (1 = full share)",
                                   labels=["instance_id", "model_id"])
        service = GaugeMetricFamily(SERVICE_TIME, "Estimated seconds per output token per model instance",
                                    labels=["instance_id", "model_id"])
        for instance_id, entry in self.tracker.snapshot().items():
            labels = [str(instance_id), str(entry["model_id"] or "")]
            in_flight.add_metric(labels, entry["in_flight"])
            weight.add_metric(labels, entry["weight"])
            if entry["seconds_per_token"] is not None:
                service.add_metric(labels, entry["seconds_per_token"])
        yield in_flight
        yield weight
        yield service
        decisions = CounterMetricFamily(DECISIONS, "JSON-aware routing decisions", labels=["decision"])
        for decision, count in sorted(self.decisions().items()):
            decisions.add_metric([decision], count)
        yield decisions
        retries = CounterMetricFamily(RETRIES, "Proxy retries on another instance", labels=["outcome"])
        for outcome, count in sorted(self.retries().items()):
            retries.add_metric([outcome], count)
        yield retries
        affinity = self.tracker.affinity_snapshot()
        outcomes = CounterMetricFamily(AFFINITY, "Requests by affinity outcome (home, spilled, all_full, unkeyed)",
                                       labels=["outcome"])
        for outcome, count in sorted(affinity["outcomes"].items()):
            outcomes.add_metric([outcome], count)
        yield outcomes
        keys = GaugeMetricFamily(AFFINITY_KEYS, "Affinity keys living on the instance",
                                 labels=["instance_id"])
        for instance_id, entry in affinity["instances"].items():
            keys.add_metric([str(instance_id)], entry["keys"])
        yield keys
        checked = CounterMetricFamily(JSON_CHECKED, "JSON replies checked in the proxy, by result",
                                      labels=["model_name", "model_instance_id", "result"])
        errors = CounterMetricFamily(JSON_FORMAT_ERRORS, "JSON replies that do not parse or break the requested schema",
                                     labels=["model_name", "model_instance_id", "reason"])
        for (model, instance_id, result), count in sorted(self.format_checks().items()):
            checked.add_metric([model, instance_id, result], count)
            if result in FORMAT_ERROR_RESULTS:
                errors.add_metric([model, instance_id, result], count)
        yield checked
        yield errors


def register(tracker: InFlightTracker, decisions, retries, format_checks=None) -> RoutingCollector:
    global _registered
    if _registered is not None:
        _registered.tracker, _registered.decisions, _registered.retries = tracker, decisions, retries
        _registered.format_checks = format_checks or dict
        return _registered
    from prometheus_client import REGISTRY

    collector = RoutingCollector(tracker, decisions, retries, format_checks)
    REGISTRY.register(collector)
    _registered = collector
    return collector
