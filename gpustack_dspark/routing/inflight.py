"""In-flight requests per model instance and the balancing choice over them.

All counting happens on the server's event loop; the lock only guards readers on other
threads (the Prometheus exporter, the status API). The cost model (expected finish time,
slow start) is pure, in `speed.py`; this class holds its per-instance state next to the
counts so that one place prunes instances that went away.
"""

import threading
import time
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple

from gpustack_dspark.routing import affinity
from gpustack_dspark.routing.speed import (
    EXPECTED_FINISH_TIME, LEAST_CONNECTIONS, ROUND_ROBIN, ServiceTimes, SlowStart, SlowStartConfig, pick,
)


def pick_least_loaded(candidates: Sequence[int], counts: Mapping[int, int], turn: int) -> int:
    """The candidate with the fewest in-flight requests; ties broken round-robin by `turn`."""
    return pick(candidates, counts, turn)


class InFlightTracker:
    # Per-instance state of instances that went away is dropped past this size.
    PRUNE_ABOVE = 512
    FORGET_AFTER_S = 3600.0

    def __init__(self, slow_start: Optional[SlowStartConfig] = None, clock: Callable[[], float] = time.monotonic,
                 ewma_alpha: float = 0.3, stale_tau_s: float = 60.0) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._counts: Dict[int, int] = {}
        self._model_of: Dict[int, int] = {}
        self._turns: Dict[int, int] = {}
        self._last_seen: Dict[int, float] = {}
        self.times = ServiceTimes(alpha=ewma_alpha, stale_tau_s=stale_tau_s)
        self.slow_start = SlowStart(slow_start or SlowStartConfig())
        self.unmatched_releases = 0  # a release with nothing to release: a bug if ever > 0
        self.affinity_config = affinity.AffinityConfig()
        self.affinity = affinity.Ledger()

    def configure(self, slow_start: SlowStartConfig,
                  affinity_config: Optional[affinity.AffinityConfig] = None) -> None:
        with self._lock:
            self.slow_start.config = slow_start
            if affinity_config is not None:
                self.affinity_config = affinity_config

    def acquire(self, instance_id: int, model_id: Optional[int]) -> None:
        with self._lock:
            self._counts[instance_id] = self._counts.get(instance_id, 0) + 1
            if model_id is not None:
                self._model_of[instance_id] = model_id
            self._last_seen[instance_id] = self._clock()

    def release(self, instance_id: int) -> None:
        with self._lock:
            current = self._counts.get(instance_id, 0)
            if current <= 0:
                self.unmatched_releases += 1
                return
            self._counts[instance_id] = current - 1
            if len(self._counts) > self.PRUNE_ABOVE:
                self._prune()

    def _prune(self) -> None:
        """Drop idle instances not chosen for an hour; if that is not enough, every idle one."""
        now = self._clock()
        idle = [k for k, v in self._counts.items() if v == 0]
        old = [k for k in idle if now - self._last_seen.get(k, now) > self.FORGET_AFTER_S]
        for key in old if len(self._counts) - len(old) <= self.PRUNE_ABOVE else idle:
            self._counts.pop(key, None)
            self._model_of.pop(key, None)
            self._last_seen.pop(key, None)
        keep = set(self._counts)
        self.times.forget(keep)
        self.slow_start.forget(keep)
        self.affinity.forget(keep)

    def record(self, instance_id: int, seconds: float, tokens: int) -> None:
        """A successful answer of `instance_id`: `seconds` from choice to last byte, `tokens` output."""
        with self._lock:
            self.times.observe(instance_id, self._model_of.get(instance_id), seconds, tokens, self._clock())

    def failed(self, instance_id: int) -> None:
        """`instance_id` received nothing: it ramps in again (slow start)."""
        with self._lock:
            self.slow_start.failed(instance_id, self._clock())

    def see(self, group: int, instances: Sequence[Tuple[int, Optional[int]]]) -> None:
        """The RUNNING candidates `(id, restart_count)` of one choice (slow start's input)."""
        with self._lock:
            self.slow_start.see(group, instances, self._clock())

    def choose(self, group: int, candidates: Sequence[int], mode: str = LEAST_CONNECTIONS,
               key: Optional[affinity.AffinityKey] = None) -> int:
        """The instance for the next request of `group` (a model) among `candidates`:
        round-robin by this group's turn, least in-flight, or earliest expected finish;
        the last two weighted by slow start. A request with an affinity `key` (and affinity
        on) goes first to its place on the ring within the load bound (affinity.py); when
        every candidate is at its bound, by the balance like any other. Round-robin is
        GPUStack's own order for every request, keyed or not."""
        with self._lock:
            turn = self._turns.get(group, 0)
            self._turns[group] = turn + 1
            if mode == ROUND_ROBIN:
                ordered = sorted(candidates)
                return ordered[turn % len(ordered)]
            now = self._clock()
            weights = {c: self.slow_start.weight(c, now) for c in candidates}
            estimates = ({c: self.times.estimate(c, now) for c in candidates}
                         if mode == EXPECTED_FINISH_TIME else None)
            if self.affinity_config.enabled:
                if key is None:
                    self.affinity.unkeyed(candidates, self._counts)
                else:
                    chosen = self.affinity.choose(key, candidates, self._counts, self.affinity_config.load_bound,
                                                  weights)
                    if chosen is not None:
                        return chosen
            return pick(candidates, self._counts, turn, estimates, weights)

    def affinity_snapshot(self) -> Dict:
        with self._lock:
            return {"enabled": self.affinity_config.enabled, "load_bound": self.affinity_config.load_bound,
                    "prefix_bytes": self.affinity_config.prefix_bytes, **self.affinity.snapshot()}

    def count(self, instance_id: int) -> int:
        with self._lock:
            return self._counts.get(instance_id, 0)

    def snapshot(self) -> Dict[int, Dict[str, Optional[float]]]:
        with self._lock:
            now = self._clock()
            out = {}
            keys = self.affinity.keys_per_instance()
            for instance_id in sorted(set(self._counts) | set(self._model_of)):
                estimate = self.times.estimate(instance_id, now)
                placed = self.affinity.per_instance.get(instance_id, {})
                out[instance_id] = {
                    "in_flight": self._counts.get(instance_id, 0), "model_id": self._model_of.get(instance_id),
                    "seconds_per_token": None if estimate is None else round(estimate, 6),
                    "samples": self.times.samples(instance_id),
                    "weight": round(self.slow_start.weight(instance_id, now), 4),
                    "affinity_keys": keys.get(instance_id, 0), "affinity_home": placed.get("home", 0),
                    "affinity_spilled_in": placed.get("spilled_in", 0),
                    # in flight averaged over recent choices (the floor's input), unrounded: replayable
                    "affinity_level": self.affinity.levels.get(instance_id),
                    # the rates of the keys living there, summed (the rates' rule's input), unrounded
                    "affinity_keyed_share": self.affinity.keyed_share(instance_id),
                }
            return out

    def ramping(self) -> Dict[int, Dict[str, float]]:
        with self._lock:
            return self.slow_start.ramping(self._clock())

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())

    def sizes(self) -> Dict[str, int]:
        """How many entries each per-instance table holds (the soak checks they stay bounded)."""
        with self._lock:
            return {"counts": len(self._counts), "turns": len(self._turns), "service_times": len(self.times),
                    "slow_start": len(self.slow_start._instances)}


__all__ = ["InFlightTracker", "pick_least_loaded", "EXPECTED_FINISH_TIME", "LEAST_CONNECTIONS", "ROUND_ROBIN"]
