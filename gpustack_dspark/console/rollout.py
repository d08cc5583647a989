"""The rolling change's planner (pure): given a deployment's replicas, which to restart
next so that the new settings reach every replica one at a time and never fewer than N-1
replicas are warm (N = the replicas the deployment wants).

A replica is "old" while it was started before the change (its id is in the rollout's
`old_ids`); GPUStack's replica convergence replaces a deleted instance with a new one.
"""

from dataclasses import dataclass
from typing import Iterable, List, Optional, Sequence, Set

WAIT, RESTART, DONE = "wait", "restart", "done"


@dataclass(frozen=True)
class Replica:
    id: int
    warm: bool  # GPUStack says RUNNING and the replica's own phase is warm (ready)


@dataclass(frozen=True)
class Step:
    action: str                     # wait | restart | done
    instance_id: Optional[int] = None
    why: str = ""


def next_step(replicas: Sequence[Replica], wanted: int, old_ids: Iterable[int]) -> Step:
    old: Set[int] = set(old_ids)
    present_old = sorted(r.id for r in replicas if r.id in old)
    warm = [r for r in replicas if r.warm]
    if len(warm) < wanted or len(warm) < len(replicas):
        return Step(WAIT, None, f"{len(warm)} of {max(wanted, len(replicas))} replicas warm")
    if not present_old:
        return Step(DONE, None, f"all {len(replicas)} replicas run the new settings and are warm")
    if len(warm) - 1 < wanted - 1:  # cannot happen with the check above; the rule, spelled out
        return Step(WAIT, None, "restarting one would leave fewer than N-1 warm")
    return Step(RESTART, present_old[0], f"replica {present_old[0]} runs the old settings")


def cannot_start(replicas: Sequence[Replica], wanted: int) -> Optional[str]:
    """Why a rolling change may not start now (None: it may): restarting one of N replicas
    keeps N-1 warm only if all N are warm to begin with."""
    cold = sorted(r.id for r in replicas if not r.warm)
    if cold:
        return (f"replica(s) {', '.join(map(str, cold))} not warm: a rolling change starts with every replica "
                f"warm, so that N-1 stay warm")
    if len(replicas) < wanted:
        return f"{len(replicas)} of {wanted} replicas exist: wait until GPUStack has started them all"
    return None


def progress(replicas: Sequence[Replica], old_ids: Iterable[int]) -> List[dict]:
    old = set(old_ids)
    return [{"id": r.id, "warm": r.warm, "settings": "old" if r.id in old else "new"} for r in replicas]
