"""What `apply` will do, from GPUStack's own import plan (pure).

`POST /v2/models/import` with `dry_run: true` answers per document: create / update /
unchanged, the field changes, and every error. GPUStack's import overwrites only stopped
deployments (replicas 0, no instances) — a guard against applying a file by accident.
`apply` is the explicit command, so an update of a running deployment goes through
`PUT /v2/models/{id}` with exactly the changed fields instead; those blockers are
therefore not errors here.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List

# GPUStack 2.3's wording for "this deployment is not stopped" (routes/models.py).
_RUNNING_BLOCKERS = ("already exists and is running", "already exists and still has")


@dataclass
class Step:
    index: int  # 1-based document number
    name: str
    action: str  # create | update | unchanged
    changes: List[Dict[str, Any]] = field(default_factory=list)
    running: bool = False  # an update of a deployment that is not stopped: PUT, not import
    errors: List[str] = field(default_factory=list)


def read_plan(result: Dict[str, Any]) -> List[Step]:
    steps = []
    for entry in result.get("entries") or []:
        errors = list(entry.get("errors") or [])
        running = any(e.startswith(_RUNNING_BLOCKERS) for e in errors)
        errors = [e for e in errors if not e.startswith(_RUNNING_BLOCKERS)]
        steps.append(Step(int(entry["index"]) + 1, entry.get("name") or "", entry.get("action") or "invalid",
                          list(entry.get("changes") or []), running, errors))
    return steps


# Fields GPUStack fills in itself when a document leaves them out (categories: derived from the
# model's config, asynchronously after the model is created).
SERVER_DERIVED = ("categories",)


def without_derived(steps: List[Step], mentioned: Dict[str, Any]) -> List[Step]:
    """The plan without changes to SERVER_DERIVED fields a document did not mention
    (`mentioned`: document name -> the fields it sets); an update left with nothing to change
    is "unchanged". Without it, applying a file twice right after the first create could read
    as an update: GPUStack had derived the categories between our read and its plan."""
    out = []
    for step in steps:
        if step.action == "update":
            kept = [c for c in step.changes
                    if c.get("field") not in SERVER_DERIVED or c.get("field") in mentioned.get(step.name, ())]
            if not kept and step.changes and not step.errors:
                step = Step(step.index, step.name, "unchanged", [], step.running, [])
            else:
                step = Step(step.index, step.name, step.action, kept, step.running, step.errors)
        out.append(step)
    return out


def _show(value: Any) -> str:
    return "(unset)" if value is None else json.dumps(value, ensure_ascii=False)


def render_change(change: Dict[str, Any]) -> List[str]:
    name, before, after = change["field"], change.get("current"), change.get("desired")
    if isinstance(before, list) or isinstance(after, list):
        before, after = list(before or []), list(after or [])
        lines = [f"  ~ {name}:"]
        lines += [f"      - {_show(item)}" for item in before if item not in after]
        lines += [f"      + {_show(item)}" for item in after if item not in before]
        if len(lines) == 1:
            lines[0] += " (order changed)"
        return lines
    if isinstance(before, dict) or isinstance(after, dict):
        before, after = dict(before or {}), dict(after or {})
        lines = [f"  ~ {name}:"]
        for key in dict.fromkeys([*before, *after]):
            if before.get(key) != after.get(key):
                lines.append(f"      {key}: {_show(before.get(key))} -> {_show(after.get(key))}")
        return lines
    return [f"  ~ {name}: {_show(before)} -> {_show(after)}"]


def render_plan(steps: List[Step]) -> str:
    lines = []
    for step in steps:
        if step.action == "update":
            how = " (running: updated in place)" if step.running else ""
            lines.append(f"update {step.name}{how}")
            for change in step.changes:
                lines.extend(render_change(change))
        else:
            lines.append(f"{step.action} {step.name}")
    counts = {a: sum(s.action == a for s in steps) for a in ("create", "update", "unchanged")}
    lines.append(f"{counts['create']} to create, {counts['update']} to update, {counts['unchanged']} unchanged")
    return "\n".join(lines)


def sparse_update(changes: List[Dict[str, Any]], desired: bool = True) -> Dict[str, Any]:
    """The PUT body for a running deployment: only the changed fields (desired or, for a
    rollback, current values). `enable_model_route` and `cluster_name` are not columns."""
    key = "desired" if desired else "current"
    return {c["field"]: c.get(key) for c in changes if c["field"] not in ("enable_model_route", "cluster_name")}


def unsupported_running_changes(step: Step) -> List[str]:
    """Changes an in-place update cannot make (GPUStack's import does them only when stopped)."""
    return [c["field"] for c in step.changes if c["field"] in ("enable_model_route", "cluster_name")]
