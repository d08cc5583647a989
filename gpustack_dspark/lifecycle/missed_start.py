"""When to re-announce a STARTING replica (pure): the repair for a missed STARTING event.

GPUStack 2.3's worker runs each replica's backend in a subprocess that first waits for its
instance to turn STARTING (`InferenceServer._until_model_instance_starting`). It waits by
watching the instance's events, and the watch sends only events that happen after it has
subscribed. Suppose the server moves the instance to STARTING first: the model files are
already there, and the subprocess is still starting. Then the subprocess waits forever. It
has logged "Preparing model files..." and never starts the replica, and GPUStack shows the
instance STARTING with no end. This was seen here: the instance turned STARTING 3 ms before
its subprocess logged that line and 27 ms before its watch subscribed.

The repair: a DSpark instance that stays STARTING is re-announced. Its row is saved
unchanged, so GPUStack publishes an UPDATED event with the same data. A waiting subprocess
takes it and goes on. Everyone else ignores it: the worker acts on UPDATED only for ERROR,
RUNNING and SCHEDULED, and the server's controllers recompute the same state. This happens
a bounded number of times per instance (NUDGE_AFTER_S after it is first seen STARTING), since
a large model may legitimately stay STARTING for minutes while it loads.
"""

from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Tuple

NUDGE_AFTER_S = (20.0, 60.0, 180.0)  # seconds after an instance is first seen STARTING
INTERVAL_S = 5.0


@dataclass
class MissedStart:
    first_seen: Dict[int, float] = field(default_factory=dict)  # instance id -> when first seen STARTING
    nudged: Dict[int, int] = field(default_factory=dict)         # instance id -> re-announcements so far
    total: int = 0

    def due(self, starting: Iterable[int], now: float) -> List[int]:
        """The instances to re-announce now, of those STARTING now (the others are forgotten)."""
        starting = set(starting)
        for gone in [i for i in self.first_seen if i not in starting]:
            self.first_seen.pop(gone, None)
            self.nudged.pop(gone, None)
        out = []
        for instance_id in sorted(starting):
            since = self.first_seen.setdefault(instance_id, now)
            done = self.nudged.get(instance_id, 0)
            if done < len(NUDGE_AFTER_S) and now - since >= NUDGE_AFTER_S[done]:
                out.append(instance_id)
        return out

    def done(self, instance_id: int) -> None:
        self.nudged[instance_id] = self.nudged.get(instance_id, 0) + 1
        self.total += 1

    def snapshot(self) -> Dict[str, object]:
        return {"re_announced": self.total, "starting": sorted(self.first_seen),
                "schedule_s": list(NUDGE_AFTER_S)}


def starting_ids(rows: Iterable[Tuple[int, str, str]], backend_name: str) -> List[int]:
    """(id, state, backend) rows -> the ids of this backend's STARTING instances."""
    return [i for i, state, backend in rows if str(state).lower() == "starting" and backend == backend_name]
