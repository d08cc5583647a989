"""vLLM glue of the speculation budget (budget.py): read the step's numbers off vLLM's
scheduler, trim each running request's draft before vLLM schedules it, and time the steps.

Called from DSparkDraftingScheduler (scheduler.py) at four points of one engine step (V1,
synchronous scheduling: schedule -> model -> update_from_output -> update_draft_token_ids):
`before_schedule` (trim the drafts built last step), `after_schedule` (tokens scheduled),
`after_update` and `after_drafts`. A step's time is its whole period, from its schedule() to
the next one's, when requests were still running then (the engine went straight on); else,
after an idle gap, from schedule() to its drafts built. Both less the layer's own drafting
time, which the budget prices apart (paid only while speculating). The period is what a step
costs the replica: with the engine in the API server's process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`)
the output processing and HTTP work between two steps are paid per step, outside the window
from schedule() to the drafts. (On the fixture at concurrency 8 the two fits came out close:
a ≈ 5 ms, b ≈ 0.06-0.07 ms/token either way.)

vLLM internals used here (instance attributes, checked by `check_scheduler` at start, the
class attributes are in the vLLM seam, worker/vllm_seam/names.py): Scheduler.running / .waiting /
.max_num_scheduled_tokens / .max_num_running_reqs, Request.spec_token_ids /
.num_computed_tokens / .num_tokens / .is_prefill_chunk, SchedulerOutput.total_num_scheduled_tokens.
"""

import itertools
import time
from typing import Dict, List, Optional, Sequence, Tuple

from gpustack_dspark.worker.drafting.budget import BudgetConfig, SpeculationBudget

SCHEDULER_ATTRS = ("running", "waiting", "max_num_scheduled_tokens", "max_num_running_reqs")
REQUEST_ATTRS = ("spec_token_ids", "num_computed_tokens", "num_tokens", "is_prefill_chunk")


def check_scheduler(scheduler) -> List[str]:
    """What this glue needs from a constructed vLLM scheduler and its Request that is missing."""
    import inspect

    from gpustack_dspark.worker import vllm_seam

    Request = vllm_seam.resolve("Request")
    problems = [f"Scheduler.{a} is missing" for a in SCHEDULER_ATTRS if not hasattr(scheduler, a)]
    if not isinstance(getattr(Request, "num_tokens", None), property):
        problems.append("vllm.v1.request.Request.num_tokens is missing")
    try:  # instance attributes: set in Request.__init__
        source = inspect.getsource(Request.__init__)
    except (OSError, TypeError):
        source = ""
    problems += [f"vllm.v1.request.Request.{a} is missing" for a in REQUEST_ATTRS
                 if a != "num_tokens" and f"self.{a}" not in source]
    return problems


def step_numbers(running: Sequence, waiting, token_budget: int, max_running: int
                 ) -> Tuple[int, int, int]:
    """(decoding requests, tokens scheduled without drafts, draft-token cap) of this step.

    Waiting prefills keep their budget: the cap is what is left of the step's token budget
    after one token per decoding request, the running prefill chunks and the waiting requests
    that can be admitted (their remaining prompt)."""
    decoding, base = 0, 0
    for request in running:
        remaining = max(request.num_tokens - request.num_computed_tokens, 0)
        if request.is_prefill_chunk or remaining > 1:
            base += remaining
        else:
            decoding += 1
            base += 1
    free_slots = max(max_running - len(running), 0)
    for request in itertools.islice(iter(waiting), free_slots):
        base += max(request.num_tokens - request.num_computed_tokens, 0)
    scheduled_base = min(base, token_budget)
    return decoding, scheduled_base, max(token_budget - base, 0)


class BudgetGlue:
    def __init__(self, max_length: int) -> None:
        self.budget = SpeculationBudget(BudgetConfig(max_length=max_length))
        self._t0: Optional[float] = None
        self._tokens = 0
        # (tokens, schedule start, end of update_from_output or of the drafts, drafting seconds)
        self._pending: Optional[Tuple[int, float, float, float]] = None

    def build_length(self) -> int:
        return self.budget.build_length()

    def before_schedule(self, scheduler, confidences: Dict[str, List[float]], kinds: Dict[str, List[str]]) -> None:
        now = time.perf_counter()
        running = list(scheduler.running)
        self._close(now if running else None)
        self._t0 = now
        drafted = [r for r in running if r.spec_token_ids]
        decoding, base, cap = step_numbers(running, scheduler.waiting, scheduler.max_num_scheduled_tokens,
                                           scheduler.max_num_running_reqs)
        if not drafted:
            return
        drafts = []
        for request in drafted:
            rid = request.request_id
            n = len(request.spec_token_ids)
            drafts.append(((kinds.get(rid) or ["base"] * n)[:n], (confidences.get(rid) or [1.0] * n)[:n]))
        decision = self.budget.step(drafts, base_tokens=base, base_output=max(decoding, 1), slot_cap=cap)
        for request, length in zip(drafted, decision.lengths):
            if length < len(request.spec_token_ids):
                request.spec_token_ids = request.spec_token_ids[:length]
                rid = request.request_id
                if rid in kinds:
                    kinds[rid] = kinds[rid][:length]
                if rid in confidences:
                    confidences[rid] = confidences[rid][:length]

    def after_schedule(self, scheduler_output) -> None:
        self._tokens = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)

    def after_update(self) -> None:
        if self._t0 is not None:
            self._pending = (self._tokens, self._t0, time.perf_counter(), 0.0)
            self._t0 = None

    def after_drafts(self, drafting_s: float = 0.0, drafted: int = 0) -> None:
        """The layer built (and checked) drafts for `drafted` requests in `drafting_s`."""
        if drafted > 0:
            self.budget.drafting.observe(drafting_s, drafted)
        if self._pending is not None:
            tokens, t0, _, _ = self._pending
            self._pending = (tokens, t0, time.perf_counter(), drafting_s)

    def _close(self, next_start: Optional[float]) -> None:
        """Record the pending step, less its drafting time: up to `next_start` (the next
        step's schedule(), the engine having gone straight on), else up to its own end."""
        if self._pending is None:
            return
        tokens, t0, end, drafting_s = self._pending
        self.budget.time.observe(tokens, (next_start if next_start is not None else end) - t0 - drafting_s)
        self._pending = None

    def sync(self, counters) -> None:
        """Copy the budget's counters into the layer's (DraftingCounters.budget_*)."""
        c = self.budget.counters
        counters.budget_steps = c.steps
        counters.budget_steps_off = c.steps_off
        counters.budget_tokens_offered = c.tokens_offered
        counters.budget_tokens_kept = c.tokens_kept
        counters.budget_steps_capped_by_prefill = c.steps_capped_by_prefill

    def extra(self) -> Dict[str, object]:
        """What the stats file carries beside the counters: the budget's snapshot."""
        return {"budget": self.budget.snapshot()}
