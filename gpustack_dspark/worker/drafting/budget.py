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
- **Step time**, two lines fitted by exponentially weighted least squares on this replica's
  own steps (warmup steps count; `StepTimeModel`): T_verify(tokens) = a + b * tokens for steps
  that verify drafts (their time includes building the next drafts), and T_plain for steps
  that verify none and build none. They differ by more than the tokens: a verifying step
  pays the rejection sampler, the drafts' logits and the layer's own drafting (on the
  3 M-parameter fixture at temperature 1 and 8 requests, 24-26 ms against ~8 ms for 9x fewer
  tokens), which one line through both kinds of steps cannot see: fitted only on verifying
  steps it priced "no drafts" at a verifying step's cost, and speculation never turned off
  where it lost (0.74x at concurrency 8, issue 26). So each line is measured: while
  speculating, one step in `explore_every` verifies and builds nothing (the plain line's
  sample); while off, every step is a plain sample, and one probe in `reverify_every`
  verifies its drafts whatever the decision (the verifying line's sample). Until the plain
  line has samples, the verifying line prices both, as before.
- **Choice**: rank every (request, position) slot by survival; verifying the top K > 0 slots
  yields R + sum(survival) tokens in T_verify(base + K) seconds, K = 0 R in T_plain(base), where R is the number of decoding
  requests and base the tokens scheduled anyway (one per decoding request plus waiting
  prefills). The K with the highest rate wins, K = 0 (speculation off) included. Survival is
  non-increasing along a draft, so the top K slots are a prefix of each draft.
- **Waiting prefills keep their budget**: K never exceeds the step's token budget minus what
  running requests and admissible waiting prefills need.
- **Hysteresis**: the decision is kept as a survival cutoff; a new cutoff replaces the
  current one only when it is expected to be better by more than `hysteresis` (a share).

No vLLM here: the scheduler (scheduler.py) feeds it numbers and applies the lengths.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

KINDS = ("forced", "spelled", "statistical", "base")


@dataclass(frozen=True)
class BudgetConfig:
    max_length: int = 8             # the most draft tokens per request per step
    hysteresis: float = 0.03        # a new cutoff must beat the current one by this share
    min_steps: int = 8              # steps profiled before the time model is used
    forgetting: float = 0.99        # weight kept per new step sample (≈ the last 100 steps)
    acceptance_forgetting: float = 0.995
    prior_tokens: float = 8.0       # pseudo-observations at calibration 1 per (kind, position)
    probe_every: int = 16           # while off, build drafts on one step in this many
    reverify_every: int = 4         # while off, verify the drafts of one probe in this many
    explore_every: int = 64         # while on, one step in this many verifies and builds nothing
    plain_forgetting: float = 0.8   # weight kept per plain-step sample (they are sparse while on)
    min_plain_steps: int = 2        # plain steps measured before their line prices K = 0


class StepTimeModel:
    """T(tokens) = a + b * tokens by exponentially weighted least squares (a, b >= 0)."""

    def __init__(self, forgetting: float = 0.99) -> None:
        self.forgetting = forgetting
        self.w = self.sx = self.sy = self.sxx = self.sxy = 0.0
        self.steps = 0

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or not (seconds > 0.0) or not math.isfinite(seconds):
            return
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
               a: float, b: float, slot_cap: int, plain: Optional[Tuple[float, float]] = None
               ) -> Tuple[int, List[float], List[float]]:
    """(best K, the ranked slot survivals, rate for every K = 0..len) for a verifying step's
    time model (a, b) and a plain step's (`plain`; None: the verifying one)."""
    ranked = sorted((s for draft in survivals for s in draft), reverse=True)[: max(slot_cap, 0)]
    rates, gained = [], base_output
    rates.append(gained / _time(*(plain or (a, b)), base_tokens))
    for k, s in enumerate(ranked, start=1):
        gained += s
        rates.append(gained / _time(a, b, base_tokens + k))
    best = max(range(len(rates)), key=lambda k: (rates[k], -k))
    return best, ranked, rates


def _time(a: float, b: float, tokens: int) -> float:
    return max(a + b * tokens, 1e-12)


def decide(survivals: Sequence[Sequence[float]], base_tokens: int, base_output: float,
           model: Optional[Tuple[float, float]], slot_cap: int, previous_cutoff: Optional[float],
           hysteresis: float, plain: Optional[Tuple[float, float]] = None) -> Decision:
    """The draft length per request (a prefix of each draft) for this step."""
    full = [len(s) for s in survivals]
    if model is None:
        return Decision(full, 0.0, None, None, "step-time model not profiled yet: drafts as built")
    a, b = model
    k_best, ranked, rates = best_slots(survivals, base_tokens, base_output, a, b, slot_cap, plain)
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
            plain_line = "" if plain is None else (f"; plain T = {plain[0] * 1e3:.2f} ms + "
                                                   f"{plain[1] * 1e3:.3f} ms/token")
            reason = (f"off: expected {rates[0]:.1f} tok/s without drafts >= with them "
                      f"(best {max(rates[1:]) if len(rates) > 1 else 0:.1f}; T = {a * 1e3:.2f} ms + "
                      f"{b * 1e3:.3f} ms/token{plain_line})")
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
    plain_steps_measured: int = 0       # steps timed for the plain line (explored while on, or off)
    probes_verified: int = 0            # while off, probes whose drafts were verified to re-time them


@dataclass
class SpeculationBudget:
    """The controller's state across steps: the two models, the cutoff, the counters."""

    config: BudgetConfig = field(default_factory=BudgetConfig)

    def __post_init__(self) -> None:
        self.time = StepTimeModel(self.config.forgetting)
        self.acceptance = AcceptanceModel(self.config.max_length, self.config.acceptance_forgetting,
                                          self.config.prior_tokens)
        self.plain = StepTimeModel(self.config.plain_forgetting)
        self.cutoff: Optional[float] = None
        self.counters = BudgetCounters()
        self.last: Optional[Decision] = None
        self.last_kept = 0
        self._since_probe = 0
        self._probes = 0
        self._verify_probe = False
        self._since_explore = 0
        self._exploring = 0

    def model(self) -> Optional[Tuple[float, float]]:
        return self.time.fit() if self.time.steps >= self.config.min_steps else None

    def plain_model(self) -> Optional[Tuple[float, float]]:
        return self.plain.fit() if self.plain.steps >= self.config.min_plain_steps else None

    def observe_step(self, tokens: int, seconds: float, verified: bool, built_after: int) -> None:
        """One step's time, to the line of its kind: verifying (drafts were verified), plain
        (none verified, none built after it), or neither (a plain step that built drafts)."""
        if verified:
            self.time.observe(tokens, seconds)
        elif built_after == 0:
            self.plain.observe(tokens, seconds)
            self.counters.plain_steps_measured += 1

    def build_length(self) -> int:
        """How long the layer should build drafts next step: all the way while speculation is
        on (or not decided yet), except twice in a row every `explore_every` steps once the
        model is in use (the step after the first verifies nothing and builds nothing: a plain
        sample); while off, only on a probe step, so the decision is revisited without paying
        the drafting cost every step."""
        if self.last is None or self.cutoff is None or math.isfinite(self.cutoff):
            if self._exploring:
                self._exploring -= 1
                return 0
            self._since_explore += 1
            if self.model() is not None and self._since_explore >= self.config.explore_every:
                self._since_explore, self._exploring = 0, 1
                return 0
            return self.config.max_length
        self._since_probe += 1
        if self._since_probe >= self.config.probe_every:
            self._since_probe = 0
            self._probes += 1
            self._verify_probe = self._probes % self.config.reverify_every == 0
            return self.config.max_length
        return 0

    def step(self, drafts: Sequence[Tuple[Sequence[str], Sequence[float]]], base_tokens: int,
             base_output: float, slot_cap: int) -> Decision:
        """Decide this step's lengths for drafts given as (kinds, per-token confidences)."""
        survivals = [self.acceptance.survival(kinds, confs)[: self.config.max_length]
                     for kinds, confs in drafts]
        offered = sum(len(s) for s in survivals)
        decision = decide(survivals, base_tokens, base_output, self.model(), slot_cap, self.cutoff,
                          self.config.hysteresis, self.plain_model())
        if self._verify_probe and offered:
            # While off, the verifying line gets no samples: this probe's drafts are verified
            # whatever the decision (the cutoff stays off unless the decision itself says on).
            self._verify_probe = False
            self.counters.probes_verified += 1
            forced, room = [], max(slot_cap, 0)
            for survival in survivals:
                forced.append(min(len(survival), room))
                room -= forced[-1]
            decision = Decision(forced, decision.cutoff, decision.expected_rate, decision.rate_without,
                                "probe: verifying the drafts to re-time a verifying step; " + decision.reason)
        c = self.counters
        c.steps += 1
        c.tokens_offered += offered
        kept = sum(decision.lengths)
        c.tokens_kept += kept
        c.steps_off += int(offered > 0 and kept == 0)
        c.steps_capped_by_prefill += int(slot_cap < offered)
        if decision.expected_rate is not None and offered:
            self.cutoff = decision.cutoff
        self.last, self.last_kept = decision, kept
        return decision

    def snapshot(self) -> Dict[str, object]:
        model, plain = self.time.fit(), self.plain.fit()
        last = self.last
        return {
            "max_length": self.config.max_length,
            "time_model": None if model is None else {
                "a_ms": round(model[0] * 1e3, 4), "b_ms_per_token": round(model[1] * 1e3, 5),
                "steps": self.time.steps, "in_use": self.model() is not None},
            "plain_time_model": None if plain is None else {
                "a_ms": round(plain[0] * 1e3, 4), "b_ms_per_token": round(plain[1] * 1e3, 5),
                "steps": self.plain.steps, "in_use": self.plain_model() is not None},
            "cutoff": None if self.cutoff is None else (None if math.isinf(self.cutoff) else round(self.cutoff, 4)),
            "speculating": None if self.cutoff is None else math.isfinite(self.cutoff),
            "last_step_draft_tokens": self.last_kept,
            "last_reason": last.reason if last else None,
            "acceptance_per_position": self.acceptance.per_position(),
            "counters": dict(vars(self.counters)),
        }
