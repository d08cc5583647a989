"""A replica's figures from its `/metrics` text, and a deployment's rates between two
samples (pure).

The same quantities as the recording rules in `deploy/prometheus/dspark-rules.yml`:
output tokens/s (`vllm:generation_tokens_total`), acceptance rate (accepted / drafted
tokens), tokens per forward pass (1 + accepted / drafts), P50/P99 end-to-end latency from
the histogram's bucket increase; plus replies withheld for breaking the schema
(`dspark_schema_violations_total`) and the proxy's JSON format errors; and what affinity
routing saves: the prefix-cache hit rate (`vllm:prefix_cache_hits_total` / `_queries_total`,
in prompt tokens) and grammar compiles (`dspark_grammar_compiles_total`, schemas new to the
replica).
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

COUNTERS = {
    "vllm:generation_tokens_total": "output_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:e2e_request_latency_seconds_count": "requests",
    "dspark_schema_violations_total": "withheld",
    "vllm:prefix_cache_queries_total": "prefix_cache_queries",
    "vllm:prefix_cache_hits_total": "prefix_cache_hits",
    "dspark_grammar_compiles_total": "grammar_compiles",
    # where a request's time went, summed over requests (the benchmarks split prefill from decode)
    "vllm:request_prefill_time_seconds_sum": "prefill_seconds",
    "vllm:request_decode_time_seconds_sum": "decode_seconds",
}
LATENCY_BUCKET = "vllm:e2e_request_latency_seconds_bucket"


@dataclass
class Counters:
    """Cumulative counters of one replica (or a sum of replicas)."""
    values: Dict[str, float] = field(default_factory=dict)
    latency_buckets: Dict[float, float] = field(default_factory=dict)  # le -> cumulative count

    def plus(self, other: "Counters") -> "Counters":
        values = dict(self.values)
        for k, v in other.values.items():
            values[k] = values.get(k, 0.0) + v
        buckets = dict(self.latency_buckets)
        for le, v in other.latency_buckets.items():
            buckets[le] = buckets.get(le, 0.0) + v
        return Counters(values, buckets)


def parse_metrics(text: str) -> Counters:
    """The counters above from Prometheus text; families that are absent are left out.
    Raises ValueError on text the Prometheus parser refuses."""
    from prometheus_client.parser import text_string_to_metric_families

    out = Counters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = COUNTERS.get(sample.name)
            if name is not None:
                out.values[name] = out.values.get(name, 0.0) + float(sample.value)
            elif sample.name == LATENCY_BUCKET:
                le = float(sample.labels.get("le", "inf"))
                out.latency_buckets[le] = out.latency_buckets.get(le, 0.0) + float(sample.value)
    return out


def sum_counters(items: Iterable[Counters]) -> Counters:
    total = Counters()
    for item in items:
        total = total.plus(item)
    return total


def _increase(prev: float, cur: float) -> float:
    return cur if cur < prev else cur - prev  # a restarted replica starts from zero


def increase(prev: Optional[Counters], cur: Counters) -> Counters:
    """One replica's increase since its previous sample (none: all of it is new); a counter
    that went down means the replica restarted, and counts from zero."""
    prev = prev or Counters()
    return Counters({k: _increase(prev.values.get(k, 0.0), v) for k, v in cur.values.items()},
                    {le: _increase(prev.latency_buckets.get(le, 0.0), v) for le, v in cur.latency_buckets.items()})


def quantile(q: float, buckets: List[Tuple[float, float]]) -> Optional[float]:
    """Prometheus' `histogram_quantile` on cumulative (le, count) pairs; None without data."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return buckets[-1][0]


FIGURE_KEYS = ("output_tokens_per_s", "acceptance_rate", "tokens_per_forward", "latency_p50_s",
               "latency_p99_s", "requests_per_s", "withheld", "prefix_cache_hit_rate", "grammar_compiles")


def hit_rate(values: Dict[str, float]) -> Optional[float]:
    """Prefix-cache hits / queries (prompt tokens found cached), None without queries."""
    queries = values.get("prefix_cache_queries", 0.0)
    return values.get("prefix_cache_hits", 0.0) / queries if queries > 0 else None


def rates(inc: Optional[Counters], dt_s: float) -> Dict[str, Optional[float]]:
    """A deployment's figures from its replicas' summed increase over one sampling interval;
    None where there is nothing to divide (no previous sample, no drafts, no finished requests)."""
    if inc is None or dt_s <= 0:
        return dict.fromkeys(FIGURE_KEYS)
    v = inc.values
    drafted, drafts, accepted = v.get("draft_tokens", 0.0), v.get("drafts", 0.0), v.get("accepted_tokens", 0.0)
    buckets = list(inc.latency_buckets.items())
    return {
        "output_tokens_per_s": v.get("output_tokens", 0.0) / dt_s,
        "acceptance_rate": accepted / drafted if drafted > 0 else None,
        "tokens_per_forward": 1.0 + accepted / drafts if drafts > 0 else None,
        "latency_p50_s": quantile(0.5, buckets),
        "latency_p99_s": quantile(0.99, buckets),
        "requests_per_s": v.get("requests", 0.0) / dt_s,
        "withheld": v.get("withheld", 0.0),
        "prefix_cache_hit_rate": hit_rate(v),
        "grammar_compiles": v.get("grammar_compiles", 0.0),
    }


def format_errors_by_model(format_checks: Dict[Tuple[str, str, str], int]) -> Dict[str, int]:
    """The proxy's JSON format errors (not_json, schema_mismatch) summed per model name."""
    out: Dict[str, int] = {}
    for (model, _instance, result), count in format_checks.items():
        if result in ("not_json", "schema_mismatch"):
            out[model] = out.get(model, 0) + int(count)
    return out
