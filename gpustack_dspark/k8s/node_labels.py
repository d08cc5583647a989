"""Which GPUStack workers get or lose the JSON label, given the Kubernetes nodes (pure).

The node-label sync's decision, apart from the Kubernetes watch and GPUStack's database
(`node_watch.py`, `gpustack_writes.py`). Rules:

- A worker belongs to a node when its name is the node's name (GPUStack's chart sets
  `GPUSTACK_WORKER_NAME` to the node name). Two workers with one name (in different
  GPUStack clusters) are ambiguous: neither is touched, and the status names them.
- A worker of a matching node gets the JSON label. If it did not carry it already (same
  value), the sync sets it together with the ownership marker (`MARKER_KEY`), which records
  that the sync put it there.
- A worker with the marker whose node no longer matches (label removed, node deleted) loses
  the JSON label (only if it still has the sync's value) and the marker.
- Everything else is left alone: workers of no known node, hand-set JSON labels (no
  marker; the sync never removes what it did not set), every other label.
"""

from collections import Counter
from dataclasses import dataclass, field
from typing import AbstractSet, Dict, List, Mapping, Optional, Sequence, Tuple

from gpustack_dspark.labels import selector_matches

MARKER_KEY = "gpustack-dspark.io/node-label-sync"
MARKER_VALUE = "managed"


@dataclass(frozen=True)
class WorkerLabels:
    id: int
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True)
class LabelChange:
    worker_id: int
    worker_name: str
    set: Dict[str, str] = field(default_factory=dict)
    remove: Tuple[str, ...] = ()

    def apply(self, labels: Mapping[str, str]) -> Dict[str, str]:
        out = {k: v for k, v in labels.items() if k not in self.remove}
        out.update(self.set)
        return out


@dataclass(frozen=True)
class SyncPlan:
    changes: Tuple[LabelChange, ...]
    labelled: Tuple[str, ...]  # workers of matching nodes (carrying the label after the plan)
    ambiguous: Tuple[str, ...]  # worker names held by more than one worker

    @property
    def added(self) -> List[str]:
        return [c.worker_name for c in self.changes if c.set]

    @property
    def removed(self) -> List[str]:
        return [c.worker_name for c in self.changes if not c.set]


def plan_labels(matching_nodes: AbstractSet[str], workers: Sequence[WorkerLabels],
                json_label: Tuple[str, str]) -> SyncPlan:
    key, value = json_label
    counts = Counter(w.name for w in workers)
    ambiguous = sorted(name for name, n in counts.items() if n > 1)
    changes: List[LabelChange] = []
    labelled: List[str] = []
    for worker in sorted(workers, key=lambda w: w.id):
        if counts[worker.name] > 1:
            continue
        labels = worker.labels or {}
        owned = labels.get(MARKER_KEY) == MARKER_VALUE
        if worker.name in matching_nodes:
            labelled.append(worker.name)
            if labels.get(key) != value:
                changes.append(LabelChange(worker.id, worker.name, set={key: value, MARKER_KEY: MARKER_VALUE}))
        elif owned:
            remove = (key, MARKER_KEY) if labels.get(key) == value else (MARKER_KEY,)
            changes.append(LabelChange(worker.id, worker.name, remove=remove))
    return SyncPlan(tuple(changes), tuple(labelled), tuple(ambiguous))


def change_for(plan: SyncPlan, worker_id: int) -> Optional[LabelChange]:
    return next((c for c in plan.changes if c.worker_id == worker_id), None)


class NodeView:
    """The matching nodes as the sync last heard of them: a full list replaces the view, watch
    events move it on (pure; the watch thread feeds it under its own lock)."""

    def __init__(self, requirements) -> None:
        self.requirements = tuple(requirements)
        self.nodes: Dict[str, Dict[str, str]] = {}
        self.resource_version: Optional[str] = None
        self.synced = False  # a list has succeeded at least once

    def _matches(self, labels: Mapping[str, str]) -> bool:
        return selector_matches(self.requirements, labels)

    def replace(self, nodes: Mapping[str, Mapping[str, str]], resource_version: Optional[str]) -> bool:
        """A LIST result; returns whether the matching set changed."""
        before = self.matching()
        self.nodes = {name: dict(labels) for name, labels in nodes.items()}
        self.resource_version = resource_version
        self.synced = True
        return self.matching() != before

    def event(self, kind: str, name: str, labels: Mapping[str, str], resource_version: Optional[str]) -> bool:
        """A WATCH event (ADDED, MODIFIED, DELETED); returns whether the matching set changed.
        A watch with a label selector sends DELETED for a node that stops matching."""
        before = self.matching()
        if kind == "DELETED":
            self.nodes.pop(name, None)
        elif kind in ("ADDED", "MODIFIED"):
            self.nodes[name] = dict(labels)
        if resource_version:
            self.resource_version = resource_version
        return self.matching() != before

    def matching(self) -> frozenset:
        return frozenset(name for name, labels in self.nodes.items() if self._matches(labels))
