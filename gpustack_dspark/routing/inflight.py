"""In-flight requests per model instance, and the least-connections choice (pure).

All counting happens on the server's event loop; the lock only guards readers on other
threads (the Prometheus exporter, the status API).
"""

import threading
from typing import Dict, Mapping, Optional, Sequence


def pick_least_loaded(candidates: Sequence[int], counts: Mapping[int, int], turn: int) -> int:
    """The candidate with the fewest in-flight requests; ties broken round-robin by `turn`."""
    if not candidates:
        raise ValueError("no candidate instances")
    lowest = min(counts.get(c, 0) for c in candidates)
    tied = sorted(c for c in candidates if counts.get(c, 0) == lowest)
    return tied[turn % len(tied)]


class InFlightTracker:
    # Zero entries of instances that went away are dropped past this size.
    PRUNE_ABOVE = 512

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[int, int] = {}
        self._model_of: Dict[int, int] = {}
        self._turns: Dict[int, int] = {}
        self.unmatched_releases = 0  # a release with nothing to release: a bug if ever > 0

    def acquire(self, instance_id: int, model_id: Optional[int]) -> None:
        with self._lock:
            self._counts[instance_id] = self._counts.get(instance_id, 0) + 1
            if model_id is not None:
                self._model_of[instance_id] = model_id

    def release(self, instance_id: int) -> None:
        with self._lock:
            current = self._counts.get(instance_id, 0)
            if current <= 0:
                self.unmatched_releases += 1
                return
            self._counts[instance_id] = current - 1
            if len(self._counts) > self.PRUNE_ABOVE:
                for key in [k for k, v in self._counts.items() if v == 0]:
                    self._counts.pop(key, None)
                    self._model_of.pop(key, None)

    def choose(self, group: int, candidates: Sequence[int], least: bool = True) -> int:
        """Least in-flight among `candidates` (ties by this group's turn); round-robin by
        turn when `least` is False."""
        with self._lock:
            turn = self._turns.get(group, 0)
            self._turns[group] = turn + 1
            if not least:
                ordered = sorted(candidates)
                return ordered[turn % len(ordered)]
            return pick_least_loaded(candidates, self._counts, turn)

    def count(self, instance_id: int) -> int:
        with self._lock:
            return self._counts.get(instance_id, 0)

    def snapshot(self) -> Dict[int, Dict[str, Optional[int]]]:
        with self._lock:
            return {
                instance_id: {"in_flight": count, "model_id": self._model_of.get(instance_id)}
                for instance_id, count in sorted(self._counts.items())
            }

    def total(self) -> int:
        with self._lock:
            return sum(self._counts.values())
