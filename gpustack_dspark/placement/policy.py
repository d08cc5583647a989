"""The placement policy: its file format, loading, and the decisions it makes (pure).

`policies/placement.yaml` (in the directory given by `--dspark-policy-dir`):

    json_label: role=json-inference   # optional; default: --dspark-json-label
    isolation: true                   # labelled workers take only JSON workloads
    json_backends: [DSpark-custom]    # backends whose models are JSON workloads
    clusters:                         # per-cluster overrides, by cluster name
      lab:
        isolation: false

A JSON workload (a model on one of `json_backends`) is placed only on workers carrying
the JSON label, on top of its own `worker_selector`. Opt-out: a model whose
`worker_selector` names the label key itself (any value) gets exactly its own selector.
With isolation on, workers carrying the JSON label take nothing but JSON workloads.

Nothing here touches GPUStack: the scheduler glue (`enforce.py`) hands in plain views of
workers and models and gets back which workers to keep and what to tell the user.
"""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from pydantic import BaseModel, ConfigDict, StrictBool, field_validator

from gpustack_dspark.backend import BACKEND_NAME
from gpustack_dspark.labels import parse_label
from gpustack_dspark.policy_file import PolicyError, read_policy_yaml, validate

POLICY_FILE = "placement.yaml"
DEFAULT_ISOLATION = True
DEFAULT_JSON_BACKENDS = (BACKEND_NAME,)
LABEL_COMMAND = "gpustack-dspark label <worker> {label}"


def _check_label(value: Optional[str]) -> Optional[str]:
    if value is not None:
        parse_label(value)
    return value


def _check_backends(value: Optional[List[str]]) -> Optional[List[str]]:
    if value is None:
        return value
    if not value:
        raise ValueError("must name at least one backend (for example [DSpark-custom])")
    for name in value:
        if not name.strip():
            raise ValueError(f"backend name {name!r} is empty")
    return value


class _ClusterOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_label: Optional[str] = None
    isolation: Optional[StrictBool] = None
    json_backends: Optional[List[str]] = None

    _label = field_validator("json_label")(_check_label)
    _backends = field_validator("json_backends")(_check_backends)


class _PolicyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    json_label: Optional[str] = None
    isolation: StrictBool = DEFAULT_ISOLATION
    json_backends: List[str] = list(DEFAULT_JSON_BACKENDS)
    clusters: Dict[str, _ClusterOverride] = {}

    _label = field_validator("json_label")(_check_label)
    _backends = field_validator("json_backends")(_check_backends)


@dataclass(frozen=True)
class ClusterPolicy:
    label: Tuple[str, str]
    isolation: bool = DEFAULT_ISOLATION
    json_backends: FrozenSet[str] = frozenset(DEFAULT_JSON_BACKENDS)

    @property
    def label_text(self) -> str:
        return f"{self.label[0]}={self.label[1]}"

    def as_dict(self) -> Dict[str, object]:
        return {"json_label": self.label_text, "isolation": self.isolation,
                "json_backends": sorted(self.json_backends)}


@dataclass(frozen=True)
class PlacementPolicy:
    default: ClusterPolicy
    clusters: Mapping[str, ClusterPolicy] = field(default_factory=dict)
    source: str = "built-in defaults"

    def for_cluster(self, name: Optional[str]) -> ClusterPolicy:
        return self.clusters.get(name, self.default) if name is not None else self.default

    def as_dict(self) -> Dict[str, object]:
        return {"source": self.source, **self.default.as_dict(),
                "clusters": {name: p.as_dict() for name, p in sorted(self.clusters.items())}}


def default_policy(default_label: Tuple[str, str]) -> PlacementPolicy:
    return PlacementPolicy(ClusterPolicy(default_label))


def _allowed_keys(loc: Tuple) -> List[str]:
    schema = _ClusterOverride if len(loc) >= 3 and loc[0] == "clusters" else _PolicyFile
    return list(schema.model_fields)


def parse_policy(data: object, default_label: Tuple[str, str], source: str) -> PlacementPolicy:
    """A loaded YAML document -> PlacementPolicy; PolicyError names the source and the key."""
    parsed = validate(_PolicyFile, data, source, "placement", _allowed_keys)
    default = ClusterPolicy(
        label=parse_label(parsed.json_label) if parsed.json_label else default_label,
        isolation=parsed.isolation,
        json_backends=frozenset(parsed.json_backends),
    )
    clusters = {
        name: ClusterPolicy(
            label=parse_label(o.json_label) if o.json_label else default.label,
            isolation=default.isolation if o.isolation is None else o.isolation,
            json_backends=frozenset(o.json_backends) if o.json_backends else default.json_backends,
        )
        for name, o in parsed.clusters.items()
    }
    return PlacementPolicy(default, clusters, source)


def load_policy(policy_dir: Optional[str], default_label: Tuple[str, str]) -> PlacementPolicy:
    """The placement policy for a server start. No directory: the built-in defaults.
    A directory without placement.yaml: the defaults too (it may hold other policies)."""
    if policy_dir is None:
        return default_policy(default_label)
    directory = Path(policy_dir)
    if not directory.is_dir():
        raise PolicyError(f"--dspark-policy-dir {policy_dir}: not a directory")
    path = directory / POLICY_FILE
    if not path.exists():
        return PlacementPolicy(ClusterPolicy(default_label), {}, f"{path} (absent: built-in defaults)")
    return parse_policy(read_policy_yaml(path), default_label, str(path))


# --- decisions -------------------------------------------------------------------------

KEEP_ALL = "keep-all"
JSON_ONLY = "json-only"
ISOLATED = "isolated"


@dataclass(frozen=True)
class WorkerView:
    """What the policy needs to know about a worker."""
    name: str
    cluster_id: Optional[int]
    labels: Mapping[str, str]


@dataclass(frozen=True)
class Screening:
    """Which workers the scheduler may consider for one model.

    `keep` indexes the worker list given. Workers of other clusters are always kept:
    GPUStack's own cluster filter removes them with its own message.
    """
    rule: str
    keep: Tuple[int, ...]
    excluded: Tuple[str, ...] = ()  # model's cluster, removed by the policy
    labelled: Tuple[str, ...] = ()  # model's cluster, carrying the JSON label


def is_json_workload(backend: Optional[str], policy: ClusterPolicy) -> bool:
    return backend is not None and backend in policy.json_backends


def opted_out(worker_selector: Optional[Mapping[str, str]], policy: ClusterPolicy) -> bool:
    """A JSON workload whose own selector names the label key chose its workers itself."""
    return bool(worker_selector) and policy.label[0] in worker_selector


def has_label(labels: Optional[Mapping[str, str]], policy: ClusterPolicy) -> bool:
    key, value = policy.label
    return (labels or {}).get(key) == value


def screen_workers(backend: Optional[str], worker_selector: Optional[Mapping[str, str]],
                   cluster_id: Optional[int], workers: Sequence[WorkerView],
                   policy: ClusterPolicy) -> Screening:
    in_cluster = [cluster_id is None or w.cluster_id == cluster_id for w in workers]
    labelled = [has_label(w.labels, policy) for w in workers]
    labelled_names = tuple(w.name for w, here, lab in zip(workers, in_cluster, labelled) if here and lab)
    if is_json_workload(backend, policy):
        if opted_out(worker_selector, policy):
            return Screening(KEEP_ALL, tuple(range(len(workers))), (), labelled_names)
        drop = [here and not lab for here, lab in zip(in_cluster, labelled)]
        rule = JSON_ONLY
    elif policy.isolation:
        drop = [here and lab for here, lab in zip(in_cluster, labelled)]
        rule = ISOLATED
    else:
        return Screening(KEEP_ALL, tuple(range(len(workers))), (), labelled_names)
    return Screening(
        rule,
        tuple(i for i, d in enumerate(drop) if not d),
        tuple(w.name for w, d in zip(workers, drop) if d),
        labelled_names,
    )


def _names(names: Sequence[str], limit: int = 5) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def missing_label_message(backend: Optional[str], screening: Screening, policy: ClusterPolicy) -> str:
    """Why a JSON workload found no worker: which label is missing and how to set it."""
    label = policy.label_text
    how = f"`{LABEL_COMMAND.format(label=label)}` (or GPUStack's POST /v2/workers/labels)"
    if not screening.labelled:
        return (f"DSpark placement: no worker in this cluster has the label {label}, which models "
                f"on the {backend} backend require. Label a JSON-inference worker with {how}, "
                f"or set the key '{policy.label[0]}' in the model's worker selector to choose "
                f"workers yourself.")
    return (f"DSpark placement: models on the {backend} backend run only on workers labelled "
            f"{label} ({_names(screening.labelled)}), and none of them can take this replica. "
            f"Label more workers with {how}.")


def isolation_message(screening: Screening, policy: ClusterPolicy, would_fit_on: Optional[str]) -> str:
    """Why a non-JSON model was kept off the JSON-inference workers."""
    reserved = (f"workers labelled {policy.label_text} accept only JSON models "
                f"(backends: {', '.join(sorted(policy.json_backends))})")
    if would_fit_on:
        return (f"DSpark isolation: this model would fit on {would_fit_on}, but {reserved}. "
                f"To allow it, set 'isolation: false' for this cluster in the placement policy "
                f"(placement.yaml) or remove the label from that worker.")
    return f"DSpark isolation: {len(screening.excluded)} worker(s) were not considered " \
           f"({_names(screening.excluded)}): {reserved}."
