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
from typing import Any, Callable, Dict, Iterable, Optional

from gpustack_dspark import bounded
from gpustack_dspark.drafting_metrics import BUDGET_GAUGES, METRICS
from gpustack_dspark.worker.drafting.ngram_index import SOURCES

STATS_FILE_ENV = "DSPARK_DRAFTING_STATS_FILE"
WRITE_INTERVAL_S = 0.5


@dataclass
class DraftingCounters:
    # proposed: every draft token verified; accepted: kept; rejected: the first token the
    # target model refused (the tokens after it were never reached, so they count for neither).
    forced_proposed: int = 0
    forced_accepted: int = 0
    forced_rejected: int = 0
    spelled_proposed: int = 0       # tokens of forced text where other spellings were allowed too
    spelled_accepted: int = 0
    spelled_rejected: int = 0
    statistical_proposed: int = 0
    statistical_accepted: int = 0
    statistical_rejected: int = 0
    sampled_proposed: int = 0       # statistical tokens drawn from their counts (temperature > 0)
    sampled_accepted: int = 0
    sampled_rejected: int = 0
    verifier_rows: int = 0          # the verifier's distributions at sampled positions, learned as q
    # The statistical and sampled tokens again, by the index they came from (ngram_index.source):
    prompt_proposed: int = 0        # seen in the request's prompt (a value copied from it)
    prompt_accepted: int = 0
    prompt_rejected: int = 0
    reply_proposed: int = 0         # seen earlier in the same reply
    reply_accepted: int = 0
    reply_rejected: int = 0
    history_proposed: int = 0       # seen in recent requests' replies on this replica
    history_accepted: int = 0
    history_rejected: int = 0
    learned_proposed: int = 0       # in no index: drawn from the verifier's rows
    learned_accepted: int = 0
    learned_rejected: int = 0
    base_proposed: int = 0          # vLLM's own drafter's tokens, passed through
    base_accepted: int = 0
    base_rejected: int = 0
    drafts: int = 0                 # drafts the layer built
    drafts_cut_by_threshold: int = 0
    grammar_trimmed_tokens: int = 0  # layer tokens vLLM's grammar check removed (expected 0)
    layer_errors: int = 0            # drafts that fell back to vLLM's own after an error
    requests_with_grammar: int = 0
    requests_without_grammar: int = 0
    requests_drafted_over_llguidance: int = 0  # of requests_with_grammar, drafts built over llguidance
    grammar_compiles: int = 0  # of requests_with_grammar, the first of their schema on this replica
    grammar_reuses: int = 0    # the others: their grammar came from the compiler's cache
    target_forward_passes: int = 0  # request-steps that produced tokens
    output_tokens: int = 0
    # The per-step speculation budget (--dspark-speculative-length auto; budget.py).
    budget_steps: int = 0                    # steps it decided
    budget_steps_off: int = 0                # of them, steps where it verified no draft token
    budget_tokens_offered: int = 0           # draft tokens built
    budget_tokens_kept: int = 0              # of them, kept for verification
    budget_steps_capped_by_prefill: int = 0  # steps where waiting prefills limited the drafts
    # Where an engine step's time goes (microseconds, summed over profiled steps: schedule
    # start to drafts built). The rest of a step is the target forward and sampling.
    profile_steps: int = 0
    step_us: int = 0
    layer_us: int = 0         # the layer's own code: budget trim, verify bookkeeping, drafting
    draft_check_us: int = 0   # vLLM's grammar check of the drafts (validate_tokens)
    mask_us: int = 0          # vLLM's grammar bitmasks, draft positions included (get_grammar_bitmask)
    vllm_scheduler_us: int = 0  # vLLM's own schedule() and update_from_output()

    def tokens_per_forward(self) -> Optional[float]:
        if not self.target_forward_passes:
            return None
        return round(self.output_tokens / self.target_forward_passes, 4)

    def acceptance(self, kind: str) -> Optional[float]:
        """Of this kind's tokens the verifier reached, the share it kept."""
        accepted = getattr(self, f"{kind}_accepted")
        reached = accepted + getattr(self, f"{kind}_rejected")
        return round(accepted / reached, 4) if reached else None

    def step_profile(self) -> Optional[Dict[str, Any]]:
        """Mean milliseconds per profiled engine step, per part, and each part's share."""
        if not self.profile_steps or not self.step_us:
            return None
        parts = {"layer": self.layer_us, "draft_check": self.draft_check_us, "grammar_masks": self.mask_us,
                 "vllm_scheduler": self.vllm_scheduler_us}
        parts["forward_and_rest"] = max(self.step_us - sum(parts.values()), 0)
        return {"steps": self.profile_steps, "step_ms": round(self.step_us / self.profile_steps / 1e3, 3),
                "ms_per_step": {k: round(v / self.profile_steps / 1e3, 3) for k, v in parts.items()},
                "share": {k: round(v / self.step_us, 4) for k, v in parts.items()}}

    def summary(self) -> Dict[str, Any]:
        out: Dict[str, Any] = asdict(self)
        out["tokens_per_forward"] = self.tokens_per_forward()
        out["step_profile"] = self.step_profile()
        for kind in ("forced", "spelled", "statistical", "sampled", "base", *SOURCES):
            out[f"{kind}_acceptance"] = self.acceptance(kind)
        return out


class StatsWriter:
    def __init__(self, path: Optional[str]) -> None:
        self.path = path
        self._last = 0.0

    def maybe_write(self, counters: DraftingCounters, force: bool = False,
                    extra: Optional[Callable[[], Dict[str, Any]]] = None) -> None:
        if not self.path:
            return
        now = time.monotonic()
        if not force and now - self._last < WRITE_INTERVAL_S:
            return
        self._last = now
        tmp = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w") as f:
                json.dump({**(extra() if extra else {}), **asdict(counters)}, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # metrics must never break decoding


def read_counters(path: Optional[str] = None) -> Optional[DraftingCounters]:
    path = path or os.environ.get(STATS_FILE_ENV)
    if not path:
        return None
    raw = _read(path)
    if raw is None:
        return None
    known = {f.name for f in fields(DraftingCounters)}
    try:
        return DraftingCounters(**{k: int(v) for k, v in raw.items() if k in known})
    except (TypeError, ValueError):
        return None


def _read(path: str) -> Optional[Dict[str, Any]]:
    try:
        raw = bounded.read_json(path, bounded.SERVER_CONFIG)
    except (OSError, bounded.BoundedError):
        return None
    return raw if isinstance(raw, dict) else None


def read_budget(path: Optional[str] = None) -> Optional[Dict[str, Any]]:
    """The speculation budget's snapshot (budget.SpeculationBudget.snapshot), None when off."""
    path = path or os.environ.get(STATS_FILE_ENV)
    raw = _read(path) if path else None
    budget = raw.get("budget") if raw else None
    return budget if isinstance(budget, dict) else None


def metric_families(counters: DraftingCounters, model: str,
                    budget: Optional[Dict[str, Any]] = None) -> Iterable[Any]:
    """prometheus_client metric families, added to the replica's /metrics by worker/metrics.py."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for name, help_text, attr in METRICS:
        family = CounterMetricFamily(name[: -len("_total")], help_text, labels=["model_name"])
        family.add_metric([model], getattr(counters, attr))
        yield family
    if budget is None:
        return
    for name, help_text, value in _budget_gauges(budget):
        family = GaugeMetricFamily(name, help_text, labels=["model_name"])
        family.add_metric([model], value)
        yield family
    name, help_text = BUDGET_GAUGES["position"]
    family = GaugeMetricFamily(name, help_text, labels=["model_name", "kind", "position"])
    for kind, rates in sorted((budget.get("acceptance_per_position") or {}).items()):
        for position, rate in enumerate(rates or []):
            if isinstance(rate, (int, float)):
                family.add_metric([model, str(kind), str(position + 1)], float(rate))
    yield family


def _budget_gauges(budget: Dict[str, Any]):
    model = budget.get("time_model") or {}
    values = {
        "draft_tokens": budget.get("last_step_draft_tokens"),
        "speculating": None if budget.get("speculating") is None else float(bool(budget["speculating"])),
        "step_fixed": model.get("a_ms") / 1e3 if isinstance(model.get("a_ms"), (int, float)) else None,
        "step_per_token": (model.get("b_ms_per_token") / 1e3
                           if isinstance(model.get("b_ms_per_token"), (int, float)) else None),
    }
    for key, value in values.items():
        if isinstance(value, (int, float)):
            name, help_text = BUDGET_GAUGES[key]
            yield name, help_text, float(value)

