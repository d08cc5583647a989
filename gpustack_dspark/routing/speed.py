"""Expected finish time and slow start: what each instance's next request would cost (pure).

Three pieces, all fed only by what the proxy already sees (no probes):

- `ServiceTimes`: per instance, an EWMA of seconds per output token of its successful
  answers (whole request time over `usage.completion_tokens`, or SSE events when a stream
  carries no usage). An estimate not refreshed decays towards the model's average with
  `stale_tau_s`, so a replica that was slow once is tried again and a cold one starts at
  the average. One answer moves an estimate at most `SAMPLE_CLIP` (2x) from where it stood
  (a first answer: from the model's average): a CPU replica's first answers at a new batch
  shape took 10x its usual time, and that one sample (0.021 against 0.0022 s/token) kept an
  equal replica out of a burst of 16 and out of traffic for minutes. A replica that stays
  slow still gets there, by up to 2x per answer.
- `SlowStart`: an instance that turned RUNNING within the last `ramp_s` gets a weight
  that grows over that window (Envoy's slow-start curve: `max(min_weight,
  (age / ramp_s) ** (1 / aggression))`). "Turned RUNNING" is seen at the choice: a new
  instance of a model already routed, an instance whose `restart_count` changed, or one
  that was missing from the RUNNING candidates of an earlier choice. The instances of a
  model seen at its first choice after the server started do not ramp. An instance that
  received nothing (the proxy's retry case) ramps again too: a dead replica GPUStack still
  lists as RUNNING gets a probe's share until it answers.
- `pick`: the candidate with the lowest `estimate x (in_flight + 1) / weight` (peak-EWMA
  style, as Finagle's and Linkerd's balancers); exact ties round-robin by turn. Estimates
  within `SAME_SPEED_BAND` (1.25x) of the fastest count as equal to it, so replicas of about
  the same speed are balanced by in-flight alone. With no estimates it is
  least-connections weighted by slow start.
"""

import math
from dataclasses import dataclass, field
from typing import Dict, Iterable, Mapping, Optional, Sequence, Set, Tuple

# Balancing modes (policies/routing.yaml `proxy.balance`).
EXPECTED_FINISH_TIME = "expected_finish_time"
LEAST_CONNECTIONS = "least_connections"
ROUND_ROBIN = "round_robin"
MODES = (EXPECTED_FINISH_TIME, LEAST_CONNECTIONS, ROUND_ROBIN)


# Estimates within this factor of the fastest candidate's count as equal to it: replicas of
# about the same speed are balanced by in-flight alone, not by their estimates' noise.
SAME_SPEED_BAND = 1.25

# One answer's seconds per token counts as at most this factor above or below the estimate it
# updates (for an instance's first answer: the model's average over its other instances).
SAMPLE_CLIP = 2.0


def pick(candidates: Sequence[int], counts: Mapping[int, int], turn: int,
         estimates: Optional[Mapping[int, Optional[float]]] = None, weights: Optional[Mapping[int, float]] = None,
         band: float = SAME_SPEED_BAND) -> int:
    """Lowest `estimate x (in_flight + 1) / weight`; ties (within float noise) by `turn`.
    A candidate without an estimate is costed at the mean of the others' (1.0 if none)."""
    if not candidates:
        raise ValueError("no candidate instances")
    known = {c: estimates[c] for c in candidates if estimates and estimates.get(c) is not None}
    if known:
        fastest = min(known.values())
        known = {c: fastest if v <= fastest * band else v for c, v in known.items()}
    default = sum(known.values()) / len(known) if known else 1.0

    def cost(c: int) -> float:
        weight = weights.get(c, 1.0) if weights else 1.0
        return known.get(c, default) * (counts.get(c, 0) + 1) / max(weight, 1e-6)

    costs = {c: cost(c) for c in candidates}
    lowest = min(costs.values())
    tied = sorted(c for c, v in costs.items() if v <= lowest * (1 + 1e-9))
    return tied[turn % len(tied)]


@dataclass
class _Estimate:
    value: float
    at: float
    samples: int = 1


class ServiceTimes:
    """EWMA of seconds per output token per instance, grouped by model."""

    def __init__(self, alpha: float = 0.3, stale_tau_s: float = 60.0, clip: float = SAMPLE_CLIP) -> None:
        self.alpha = alpha
        self.stale_tau_s = stale_tau_s
        self.clip = clip
        self._by_instance: Dict[int, _Estimate] = {}
        self._model_of: Dict[int, Optional[int]] = {}

    def observe(self, instance_id: int, model_id: Optional[int], seconds: float, tokens: int, now: float) -> None:
        if seconds < 0 or not math.isfinite(seconds):
            return
        sample = seconds / max(1, int(tokens))
        current = self._by_instance.get(instance_id)
        if current is None:
            mean = self.model_mean(model_id, exclude=[instance_id])
            self._by_instance[instance_id] = _Estimate(self._clipped(sample, mean), now)
        else:
            base = self._decayed(instance_id, current, now)
            current.value = base + self.alpha * (self._clipped(sample, base) - base)
            current.at = now
            current.samples += 1
        self._model_of[instance_id] = model_id

    def _clipped(self, sample: float, around: Optional[float]) -> float:
        if around is None or around <= 0 or self.clip <= 1:
            return sample
        return min(max(sample, around / self.clip), around * self.clip)

    def model_mean(self, model_id: Optional[int], exclude: Iterable[int] = ()) -> Optional[float]:
        skip = set(exclude)
        values = [e.value for i, e in self._by_instance.items() if self._model_of.get(i) == model_id and i not in skip]
        return sum(values) / len(values) if values else None

    def _decayed(self, instance_id: int, current: _Estimate, now: float) -> float:
        mean = self.model_mean(self._model_of.get(instance_id), exclude=[instance_id])
        if mean is None or self.stale_tau_s <= 0:
            return current.value
        keep = math.exp(-max(0.0, now - current.at) / self.stale_tau_s)
        return mean + (current.value - mean) * keep

    def estimate(self, instance_id: int, now: float) -> Optional[float]:
        current = self._by_instance.get(instance_id)
        return None if current is None else self._decayed(instance_id, current, now)

    def samples(self, instance_id: int) -> int:
        current = self._by_instance.get(instance_id)
        return current.samples if current else 0

    def forget(self, keep: Set[int]) -> None:
        for instance_id in [i for i in self._by_instance if i not in keep]:
            self._by_instance.pop(instance_id, None)
            self._model_of.pop(instance_id, None)

    def __len__(self) -> int:
        return len(self._by_instance)


@dataclass(frozen=True)
class SlowStartConfig:
    ramp_s: float = 30.0
    min_weight: float = 0.1
    aggression: float = 1.0


def ramp_weight(age_s: float, config: SlowStartConfig) -> float:
    if config.ramp_s <= 0 or age_s >= config.ramp_s:
        return 1.0
    fraction = max(0.0, age_s) / config.ramp_s
    return max(config.min_weight, fraction ** (1.0 / config.aggression))


@dataclass
class _Seen:
    restart_count: Optional[int]
    warm_since: Optional[float]  # None: established (no ramp)
    last_seen: float


@dataclass
class SlowStart:
    config: SlowStartConfig = field(default_factory=SlowStartConfig)
    _instances: Dict[int, _Seen] = field(default_factory=dict)
    _groups: Dict[int, Set[int]] = field(default_factory=dict)  # model -> ids at its last choice
    ramps_started: int = 0

    def see(self, group: int, instances: Sequence[Tuple[int, Optional[int]]], now: float) -> None:
        """Note the RUNNING candidates `(id, restart_count)` offered at one choice."""
        previous = self._groups.get(group)
        ids = set()
        for instance_id, restart_count in instances:
            ids.add(instance_id)
            seen = self._instances.get(instance_id)
            if seen is None:
                # New since the last choice of this model, or the model's first choice since start.
                self._instances[instance_id] = _Seen(restart_count, None if previous is None else now, now)
                if previous is not None:
                    self.ramps_started += 1
                continue
            restarted = restart_count is not None and seen.restart_count is not None and restart_count != seen.restart_count
            came_back = previous is not None and instance_id not in previous
            if restarted or came_back:
                seen.warm_since = now
                self.ramps_started += 1
            seen.restart_count = restart_count
            seen.last_seen = now
        self._groups[group] = ids

    def failed(self, instance_id: int, now: float) -> None:
        """The instance received nothing (refused, reset): ramp it in again from `min_weight`,
        so a dead replica GPUStack still lists RUNNING gets a probe's share, not a full one."""
        if self.config.ramp_s <= 0:
            return
        seen = self._instances.get(instance_id)
        if seen is None:
            self._instances[instance_id] = _Seen(None, now, now)
        else:
            seen.warm_since = now
        self.ramps_started += 1

    def weight(self, instance_id: int, now: float) -> float:
        seen = self._instances.get(instance_id)
        if seen is None or seen.warm_since is None:
            return 1.0
        weight = ramp_weight(now - seen.warm_since, self.config)
        if weight >= 1.0:
            seen.warm_since = None
        return weight

    def ramping(self, now: float) -> Dict[int, Dict[str, float]]:
        out = {}
        for instance_id, seen in self._instances.items():
            if seen.warm_since is not None and now - seen.warm_since < self.config.ramp_s:
                out[instance_id] = {"weight": round(self.weight(instance_id, now), 4),
                                    "warm_for_s": round(now - seen.warm_since, 2),
                                    "ramp_left_s": round(self.config.ramp_s - (now - seen.warm_since), 2)}
        return out

    def forget(self, keep: Set[int]) -> None:
        for instance_id in [i for i in self._instances if i not in keep]:
            self._instances.pop(instance_id, None)
        for group, ids in self._groups.items():
            ids.intersection_update(keep)
