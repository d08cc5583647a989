"""What the replica knows about itself: the launch plan, the default schema, the warmup state.

One instance per process, set by the launcher before vLLM starts; the middleware (inside
vLLM's app) and the warmup thread read and update it. Phases only move forward:
loading -> warming -> ready, or -> failed (with the reason).
"""

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from gpustack_dspark.knobs import DSparkKnobs
from gpustack_dspark.translate import LaunchPlan
from gpustack_dspark.worker.redact import redact_argv

LOADING, WARMING, READY, FAILED = "loading", "warming", "ready", "failed"


@dataclass
class WarmupProgress:
    requests: int = 0
    concurrency: int = 1
    timeout_s: float = 0.0
    sent: int = 0
    succeeded: int = 0
    errors: List[str] = field(default_factory=list)
    started_at: Optional[float] = None
    finished_at: Optional[float] = None
    schemas_compiled: int = 0

    def duration_s(self) -> Optional[float]:
        if self.started_at is None:
            return None
        end = self.finished_at if self.finished_at is not None else time.time()
        return round(end - self.started_at, 3)


@dataclass
class WorkerState:
    plan: LaunchPlan
    knobs: DSparkKnobs
    default_schema: Optional[Dict[str, Any]] = None
    served_model_name: Optional[str] = None
    method_note: str = ""
    phase: str = LOADING
    reason: str = "vLLM is loading the model"
    warmup: WarmupProgress = field(default_factory=WarmupProgress)
    started_at: float = field(default_factory=time.time)
    counters: Dict[str, int] = field(default_factory=lambda: {
        "json_injected": 0, "legacy_converted": 0, "kept": 0, "rejected": 0, "schema_violations": 0,
        "relaxed": 0, "engine_llguidance": 0, "second_attempts": 0, "second_attempt_served": 0,
        "sampling_refused": 0, "streams_checked": 0, "oneof_narrowed": 0, "oneof_narrowed_served": 0})
    # vLLM's --api-key values (or VLLM_API_KEY): /dspark/info then needs one. Never shown.
    api_keys: Tuple[str, ...] = field(default=(), repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def grammar_engines(self) -> Tuple[str, ...]:
        """The engines requests are planned for (a user's own structured-outputs config: xgrammar's rules)."""
        return self.plan.grammar_engines or ("xgrammar",)

    @property
    def json_default(self) -> bool:
        return self.plan.enabled and self.plan.grammar_mode == "json"

    def move(self, phase: str, reason: str) -> None:
        with self._lock:
            if self.phase in (READY, FAILED) and phase != FAILED:
                return
            self.phase, self.reason = phase, reason

    def count(self, name: str) -> None:
        with self._lock:
            self.counters[name] = self.counters.get(name, 0) + 1

    def drafting_info(self) -> Dict[str, Any]:
        from gpustack_dspark.worker.drafting.stats import read_budget, read_counters

        out: Dict[str, Any] = {"mode": "off", **self.plan.drafting}
        counters = read_counters() if self.plan.drafting_layer_on else None
        out["counters"] = counters.summary() if counters else None
        # The per-step speculation budget: time model, cutoff, per-position acceptance, why off.
        out["budget"] = read_budget() if self.plan.drafting.get("budget") else None
        return out

    def info(self) -> Dict[str, Any]:
        plan = self.plan
        return {
            "phase": self.phase,
            "reason": self.reason,
            "enabled": plan.enabled,
            "knobs": self.knobs.as_dict(),
            "knobs_given": list(self.knobs.given),
            "method": plan.method,
            "method_reason": plan.method_reason,
            "speculative_length": plan.speculative_length,
            "speculative_config": plan.speculative_config,
            "grammar_mode": plan.grammar_mode if plan.enabled else "off",
            "grammar_engines": list(plan.grammar_engines),
            "default_format": (("json_schema" if self.default_schema is not None else "json_object")
                               if self.json_default else None),
            "accept_threshold": plan.threshold,
            "drafting": self.drafting_info(),
            "warnings": list(plan.warnings),
            "notes": list(plan.notes),
            "warmup": {
                "requests": self.warmup.requests,
                "concurrency": self.warmup.concurrency,
                "timeout_s": self.warmup.timeout_s,
                "sent": self.warmup.sent,
                "succeeded": self.warmup.succeeded,
                "errors": self.warmup.errors[:10],
                "schemas_compiled": self.warmup.schemas_compiled,
                "duration_s": self.warmup.duration_s(),
                # epoch seconds: lets a caller order the warmup against outside events
                "started_at": self.warmup.started_at,
                "finished_at": self.warmup.finished_at,
            },
            "requests": dict(self.counters),
            "tool_calls": dict(plan.tool_calls),
            "auth": {"api_key_required": bool(self.api_keys)},
            "vllm_argv": redact_argv(plan.vllm_argv),
            "startup_line": plan.startup_line(),
            "uptime_s": round(time.time() - self.started_at, 1),
        }


_current: Optional[WorkerState] = None


def install(state: WorkerState) -> None:
    global _current
    _current = state


def current() -> Optional[WorkerState]:
    return _current
