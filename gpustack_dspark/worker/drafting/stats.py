"""The drafting layer's counters, and how they cross from vLLM's engine process to the API.

The layer runs in vLLM's engine-core process; `/metrics` and `/dspark/info` are served by
the API process. The engine side writes its counters to a small JSON file (atomic rename,
at most every WRITE_INTERVAL_S); the API side reads it when asked. The file path comes from
the launcher through STATS_FILE_ENV, which the engine process inherits.
"""

import json
import os
import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Dict, Iterable, Optional

from gpustack_dspark.drafting_metrics import METRICS

STATS_FILE_ENV = "DSPARK_DRAFTING_STATS_FILE"
WRITE_INTERVAL_S = 0.5


@dataclass
class DraftingCounters:
    # proposed: every draft token verified; accepted: kept; rejected: the first token the
    # target model refused (the tokens after it were never reached, so they count for neither).
    forced_proposed: int = 0
    forced_accepted: int = 0
    forced_rejected: int = 0
    statistical_proposed: int = 0
    statistical_accepted: int = 0
    statistical_rejected: int = 0
    base_proposed: int = 0          # vLLM's own drafter's tokens, passed through
    base_accepted: int = 0
    base_rejected: int = 0
    drafts: int = 0                 # drafts the layer built
    drafts_cut_by_threshold: int = 0
    grammar_trimmed_tokens: int = 0  # layer tokens vLLM's grammar check removed (expected 0)
    layer_errors: int = 0            # drafts that fell back to vLLM's own after an error
    requests_with_grammar: int = 0
    requests_without_grammar: int = 0
    target_forward_passes: int = 0  # request-steps that produced tokens
    output_tokens: int = 0

    def tokens_per_forward(self) -> Optional[float]:
        if not self.target_forward_passes:
            return None
        return round(self.output_tokens / self.target_forward_passes, 4)

    def acceptance(self, kind: str) -> Optional[float]:
        """Of this kind's tokens the verifier reached, the share it kept."""
        accepted = getattr(self, f"{kind}_accepted")
        reached = accepted + getattr(self, f"{kind}_rejected")
        return round(accepted / reached, 4) if reached else None

    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = asdict(self)
        out["tokens_per_forward"] = self.tokens_per_forward()
        for kind in ("forced", "statistical", "base"):
            out[f"{kind}_acceptance"] = self.acceptance(kind)
        return out


class StatsWriter:
    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._last = 0.0

    def maybe_write(self, counters: DraftingCounters, force: bool = False) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now - self._last < WRITE_INTERVAL_S:
            return
        self._last = now
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump(asdict(counters), f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # metrics must never break decoding


def read_counters(path: Optional[str] = None) -> Optional[DraftingCounters]:
    path = path or os.environ.get(STATS_FILE_ENV)
    if not path:
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    known = {f.name for f in fields(DraftingCounters)}
    return DraftingCounters(**{k: int(v) for k, v in raw.items() if k in known})


def metric_families(counters: DraftingCounters, model: str) -> Iterable[Any]:
    """prometheus_client metric families, added to the replica's /metrics by worker/metrics.py."""
    from prometheus_client.core import CounterMetricFamily

    for name, help_text, attr in METRICS:
        family = CounterMetricFamily(name[: -len("_total")], help_text, labels=["model_name"])
        family.add_metric([model], getattr(counters, attr))
        yield family

