"""The per-step speculation budget: how many draft tokens each request gets this step. Pure.

Each step the drafting layer has built one draft per running request (up to the configured
maximum). This module decides how much of each draft is worth verifying, so that expected
accepted tokens per unit of step time is highest (the rule of vLLM's adaptive verification
for the `dspark` method and of SmartSpec, arXiv 2406.14066, ported to the scheduler):

- **Survival** of draft position j of a request = the product over positions 1..j of each
  token's own confidence (grammar-forced 1, statistical its frequency estimate, vLLM's own
  drafter 1) times a live correction per (kind, position): observed acceptance over the
  confidence predicted for the tokens the verifier reached there (`AcceptanceModel`). So a
  forced token that the model spells differently, or n-gram guesses that keep failing, lose
  survival from what was measured, not from a rule.
- **Step time** T(tokens) = a + b * tokens, fitted by exponentially weighted least squares
  on this replica's own steps (warmup steps count; `StepTimeModel`), without the layer's own
  drafting time: that is **drafting cost** D, measured apart per request drafted
  (`DraftingCost`) and paid only while speculating (while off, drafts are built only on probe
  steps). Folded into T, it was charged to steps without drafts too.
- **Choice**: rank every (request, position) slot by survival; verifying the top K slots
  yields R + sum(survival) tokens in T(base + K) + D seconds, where R is the number of
  decoding requests and base the tokens scheduled anyway (one per decoding request plus
  waiting prefills); K = 0 (speculation off) yields R in T(base). The K with the highest rate
  wins. Survival is non-increasing along a draft, so the top K slots are a prefix of each
  draft.
- **Waiting prefills keep their budget**: K never exceeds the step's token budget minus what
  running requests and admissible waiting prefills need.
- **Hysteresis**: the decision is kept as a survival cutoff; a new cutoff replaces the
  current one only when it is expected to be better by more than `hysteresis` (a share).
- **Sampled drafts are cut by the cutoff decided before they were drawn.** A sampled token
  (draft_builder, temperature > 0) is verified against the distribution it was drawn from,
  which is exact only if whether its position is verified does not depend on the token drawn
  there. This step's cutoff depends on every slot's survival, a sampled draft's later slots
  included, and those follow from its earlier draws. The previous step's cutoff does not, nor
  does the rank of a slot among the `slot_cap` best (only slots at least as good, earlier
  positions of its own draft among them, decide it). So a draft with sampled tokens keeps its
  leading slots at or above the previous cutoff that also rank within the cap.

No vLLM here: the scheduler (scheduler.py) feeds it numbers and applies the lengths.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

SAMPLED = "sampled"
KINDS = ("forced", "spelled", "statistical", "sampled", "base")


@dataclass(frozen=True)
class BudgetConfig:
    max_length: int = 8             # the most draft tokens per request per step
    hysteresis: float = 0.03        # a new cutoff must beat the current one by this share
    min_steps: int = 8              # steps profiled before the time model is used
    forgetting: float = 0.99        # weight kept per new step sample (≈ the last 100 steps)
    acceptance_forgetting: float = 0.995
    prior_tokens: float = 8.0       # pseudo-observations at calibration 1 per (kind, position)
    probe_every: int = 16           # while off, build drafts on one step in this many at first,
    probe_max: int = 128            # doubling after each probe that stays off, up to this


class StepTimeModel:
    """T(tokens) = a + b * tokens by exponentially weighted least squares (a, b >= 0).

    Once `settle_steps` steps are in, a step of a size within the sizes already seen counts as
    at most `clip` times what the line predicts for it (a larger step is taken as it is: the
    line is not extrapolated): on CPU a batch shape's first step is several times slower
    (oneDNN builds its kernels), and a few such steps had put a at 14 ms where steady steps
    cost about 5-7 ms at concurrency 8. A lasting change of cost still moves the line, by up
    to `clip` per step."""

    def __init__(self, forgetting: float = 0.99, clip: float = 2.0, settle_steps: int = 16) -> None:
        self.forgetting = forgetting
        self.clip = clip
        self.settle_steps = settle_steps
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.steps = 0
        self.clipped = 0
        self.max_tokens = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not (seconds > 0.0) or not math.isfinite(seconds):
            return
        if self.steps >= self.settle_steps and self.clip > 1.0 and tokens <= self.max_tokens:
            fitted = self.fit()
            if fitted is not None:
                limit = self.clip * _time(fitted[0], fitted[1], tokens)
                if seconds > limit:
                    seconds = limit
                    self.clipped += 1
        self.max_tokens = max(self.max_tokens, tokens)
        f = self.forgetting
        x, y = float(tokens), float(seconds)
        self.w = self.w * f + 1.0
        self.sx = self.sx * f + x
        self.sy = self.sy * f + y
        self.sxx = self.sxx * f + x * x
        self.sxy = self.sxy * f + x * y
        self.steps += 1

    def fit(self) -> Optional[Tuple[float, float]]:
        if self.w <= 0.0:
            return None
        mx, my = self.sx / self.w, self.sy / self.w
        var = self.sxx / self.w - mx * mx
        cov = self.sxy / self.w - mx * my
        # Without spread in the token counts the slope is unknown: all cost is per step.
        b = cov / var if var > 1e-9 * max(1.0, mx * mx) else 0.0
        b = max(b, 0.0)
        a = my - b * mx
        if a < 0.0:  # the line through the origin would be steeper: refit b with a = 0
            a, b = 0.0, (self.sxy / self.sxx if self.sxx > 0 else 0.0)
        return a, b


class DraftingCost:
    """EWMA of the layer's drafting time (building and checking drafts) per request drafted."""

    def __init__(self, alpha: float = 0.1) -> None:
        self.alpha = alpha
        self.per_request: Optional[float] = None

    def observe(self, seconds: float, requests: int) -> None:
        if requests <= 0 or not (seconds >= 0.0) or not math.isfinite(seconds):
            return
        sample = seconds / requests
        self.per_request = sample if self.per_request is None else (
            self.per_request + self.alpha * (sample - self.per_request))

    def for_requests(self, requests: int) -> float:
        return (self.per_request or 0.0) * max(requests, 0)


class AcceptanceModel:
    """Per (kind, position): decayed sums of the confidence predicted for the tokens the
    verifier reached there and of the ones it kept. calibration = (kept + prior) /
    (predicted + prior)."""

    def __init__(self, max_length: int, forgetting: float = 0.995, prior: float = 8.0) -> None:
        self.max_length, self.forgetting, self.prior = max_length, forgetting, prior
        self.predicted: Dict[str, List[float]] = {k: [0.0] * max_length for k in KINDS}
        self.kept: Dict[str, List[float]] = {k: [0.0] * max_length for k in KINDS}
        self.reached: Dict[str, List[float]] = {k: [0.0] * max_length for k in KINDS}

    def observe(self, kinds: Sequence[str], confidences: Sequence[float], num_scheduled: int,
                num_accepted: int) -> None:
        """One verified draft: `num_accepted` of its first `num_scheduled` tokens were kept."""
        f = self.forgetting
        for pos in range(min(num_scheduled, len(kinds), self.max_length)):
            if pos > num_accepted:
                break  # never reached: the verifier stopped at the first refusal
            kind = kinds[pos] if kinds[pos] in self.kept else "base"
            self.predicted[kind][pos] = self.predicted[kind][pos] * f + _conf(confidences, pos)
            self.kept[kind][pos] = self.kept[kind][pos] * f + (1.0 if pos < num_accepted else 0.0)
            self.reached[kind][pos] = self.reached[kind][pos] * f + 1.0

    def calibration(self, kind: str, pos: int) -> float:
        kind = kind if kind in self.kept else "base"
        pos = min(pos, self.max_length - 1)
        return (self.kept[kind][pos] + self.prior) / (self.predicted[kind][pos] + self.prior)

    def survival(self, kinds: Sequence[str], confidences: Sequence[float]) -> List[float]:
        out, s = [], 1.0
        for pos, kind in enumerate(kinds):
            s *= min(1.0, max(0.0, _conf(confidences, pos) * self.calibration(kind, pos)))
            out.append(s)
        return out

    def per_position(self) -> Dict[str, List[Optional[float]]]:
        """Observed acceptance per position (kept / reached), None where nothing was reached."""
        return {k: [round(self.kept[k][p] / self.reached[k][p], 4) if self.reached[k][p] >= 0.5 else None
                    for p in range(self.max_length)] for k in KINDS}


def _conf(confidences: Sequence[float], pos: int) -> float:
    return float(confidences[pos]) if pos < len(confidences) else 1.0


@dataclass
class Decision:
    lengths: List[int]              # draft tokens each request keeps, in input order
    cutoff: float                   # survival a slot needs to be verified (inf: none)
    expected_rate: Optional[float]  # expected output tokens per second with these lengths
    rate_without: Optional[float]   # ... with no drafts at all
    reason: str


def best_slots(survivals: Sequence[Sequence[float]], base_tokens: int, base_output: float,
               a: float, b: float, slot_cap: int, draft_cost: float = 0.0) -> Tuple[int, List[float], List[float]]:
    """(best K, the ranked slot survivals, rate for every K = 0..len) for a time model (a, b)
    and the drafting cost a step pays while speculating."""
    ranked = sorted((s for draft in survivals for s in draft), reverse=True)[: max(slot_cap, 0)]
    rates, gained = [], base_output
    rates.append(gained / _time(a, b, base_tokens))
    for k, s in enumerate(ranked, start=1):
        gained += s
        rates.append(gained / (_time(a, b, base_tokens + k) + max(draft_cost, 0.0)))
    best = max(range(len(rates)), key=lambda k: (rates[k], -k))
    return best, ranked, rates


def _time(a: float, b: float, tokens: int) -> float:
    return max(a + b * tokens, 1e-12)


def decide(survivals: Sequence[Sequence[float]], base_tokens: int, base_output: float,
           model: Optional[Tuple[float, float]], slot_cap: int, previous_cutoff: Optional[float],
           hysteresis: float, draft_cost: float = 0.0, held: Sequence[bool] = ()) -> Decision:
    """The draft length per request (a prefix of each draft) for this step. `held[i]`: draft i
    has sampled tokens, so it is cut by `previous_cutoff` (None: as built) within the cap."""
    decision = _decide(survivals, base_tokens, base_output, model, slot_cap, previous_cutoff, hysteresis,
                       draft_cost)
    if any(held):
        capped = _lengths(survivals, sorted((s for d in survivals for s in d), reverse=True)[: max(slot_cap, 0)])
        for i, draft in enumerate(survivals):
            if i < len(held) and held[i]:
                cutoff = -math.inf if previous_cutoff is None else previous_cutoff
                decision.lengths[i] = min(capped[i], sum(1 for s in draft if s >= cutoff))
    return decision


def _decide(survivals: Sequence[Sequence[float]], base_tokens: int, base_output: float,
            model: Optional[Tuple[float, float]], slot_cap: int, previous_cutoff: Optional[float],
            hysteresis: float, draft_cost: float = 0.0) -> Decision:
    full = [len(s) for s in survivals]
    if model is None:
        return Decision(full, 0.0, None, None, "step-time model not profiled yet: drafts as built")
    a, b = model
    k_best, ranked, rates = best_slots(survivals, base_tokens, base_output, a, b, slot_cap, draft_cost)
    cutoff = ranked[k_best - 1] if k_best else math.inf
    if previous_cutoff is not None:
        k_prev = sum(1 for s in ranked if s >= previous_cutoff)
        if rates[k_best] <= rates[k_prev] * (1.0 + hysteresis):
            k_best, cutoff = k_prev, previous_cutoff
    lengths = _lengths(survivals, ranked[:k_best])
    if k_best == 0:
        if not ranked and slot_cap <= 0 and any(full):
            reason = "off: no token budget left for drafts after running requests and waiting prefills"
        elif not any(full):
            reason = "no drafts this step"
        else:
            reason = (f"off: expected {rates[0]:.1f} tok/s without drafts >= with them "
                      f"(best {max(rates[1:]) if len(rates) > 1 else 0:.1f}; T = {a * 1e3:.2f} ms + "
                      f"{b * 1e3:.3f} ms/token, drafting {draft_cost * 1e3:.2f} ms)")
    else:
        reason = f"on: {k_best} draft tokens, expected {rates[k_best]:.1f} tok/s vs {rates[0]:.1f} without"
    return Decision(lengths, cutoff, rates[k_best], rates[0], reason)


def _lengths(survivals: Sequence[Sequence[float]], chosen: Sequence[float]) -> List[int]:
    """Per request, how many of its leading slots are among `chosen` (a multiset of values)."""
    remaining: Dict[float, int] = {}
    for s in chosen:
        remaining[s] = remaining.get(s, 0) + 1
    # Walk slots best first, as the ranking did, so ties resolve the same way.
    order = sorted(((s, i, j) for i, draft in enumerate(survivals) for j, s in enumerate(draft)),
                   key=lambda t: (-t[0], t[1], t[2]))
    lengths = [0] * len(survivals)
    for s, i, j in order:
        if remaining.get(s, 0) > 0 and lengths[i] == j:
            remaining[s] -= 1
            lengths[i] = j + 1
    return lengths


@dataclass
class BudgetCounters:
    steps: int = 0
    steps_off: int = 0                  # steps where drafts were there and none was verified
    tokens_offered: int = 0             # draft tokens built
    tokens_kept: int = 0                # of them, kept for verification
    steps_capped_by_prefill: int = 0    # steps where waiting prefills limited the drafts


@dataclass
class SpeculationBudget:
    """The controller's state across steps: the two models, the cutoff, the counters."""

    config: BudgetConfig = field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        self.time = StepTimeModel(self.config.forgetting)
        self.acceptance = AcceptanceModel(self.config.max_length, self.config.acceptance_forgetting,
                                          self.config.prior_tokens)
        self.drafting = DraftingCost()
        self.cutoff: Optional[float] = None
        self.counters = BudgetCounters()
        self.last: Optional[Decision] = None
        self.last_kept = 0
        self._since_probe = 0
        self._probe_interval = self.config.probe_every

    def model(self) -> Optional[Tuple[float, float]]:
        return self.time.fit() if self.time.steps >= self.config.min_steps else None

    def build_length(self) -> int:
        """How long the layer should build drafts next step: all the way while speculation is
        on (or not decided yet); while off, only on a probe step, so the decision is revisited
        without paying the drafting cost every step. Probes that find "off" again space out
        (x2 up to `probe_max`); turning on resets the spacing."""
        if self.last is None or self.cutoff is None or math.isfinite(self.cutoff):
            return self.config.max_length
        self._since_probe += 1
        if self._since_probe >= self._probe_interval:
            self._since_probe = 0
            return self.config.max_length
        return 0

    def step(self, drafts: Sequence[Tuple[Sequence[str], Sequence[float]]], base_tokens: int,
             base_output: float, slot_cap: int) -> Decision:
        """Decide this step's lengths for drafts given as (kinds, per-token confidences)."""
        survivals = [self.acceptance.survival(kinds, confs)[: self.config.max_length]
                     for kinds, confs in drafts]
        offered = sum(len(s) for s in survivals)
        held = [SAMPLED in kinds for kinds, _ in drafts]
        decision = decide(survivals, base_tokens, base_output, self.model(), slot_cap, self.cutoff,
                          self.config.hysteresis, self.drafting.for_requests(len(drafts)), held)
        c = self.counters
        c.steps += 1
        c.tokens_offered += offered
        kept = sum(decision.lengths)
        c.tokens_kept += kept
        c.steps_off += int(offered > 0 and kept == 0)
        c.steps_capped_by_prefill += int(slot_cap < offered)
        if decision.expected_rate is not None and offered:
            was_off = self.cutoff is not None and math.isinf(self.cutoff)
            self.cutoff = decision.cutoff
            if math.isinf(self.cutoff):
                if was_off:  # a probe found it off again
                    self._probe_interval = min(self._probe_interval * 2, max(self.config.probe_max,
                                                                             self.config.probe_every))
            else:
                self._probe_interval = self.config.probe_every
        self.last, self.last_kept = decision, kept
        return decision

    def snapshot(self) -> Dict[str, object]:
        model = self.time.fit()
        last = self.last
        return {
            "max_length": self.config.max_length,
            "time_model": None if model is None else {
                "a_ms": round(model[0] * 1e3, 4), "b_ms_per_token": round(model[1] * 1e3, 5),
                "steps": self.time.steps, "clipped_steps": self.time.clipped, "in_use": self.model() is not None},
            "drafting_ms_per_request": (None if self.drafting.per_request is None
                                        else round(self.drafting.per_request * 1e3, 4)),
            "cutoff": None if self.cutoff is None else (None if math.isinf(self.cutoff) else round(self.cutoff, 4)),
            "speculating": None if self.cutoff is None else math.isfinite(self.cutoff),
            "last_step_draft_tokens": self.last_kept,
            "last_reason": last.reason if last else None,
            "acceptance_per_position": self.acceptance.per_position(),
            "counters": dict(vars(self.counters)),
        }
