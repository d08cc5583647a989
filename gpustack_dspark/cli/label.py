"""`gpustack-dspark label WORKER KEY=VALUE ... [--remove KEY ...]`: set worker labels.

GPUStack 2.3 has no CLI for labels. Additions alone go through `POST /v2/workers/labels`
(merges, one transaction). Removals read the worker and write its whole label set back
with `PUT /v2/workers/{id}` (name and maintenance sent back unchanged: that endpoint
replaces every field it takes).
"""

import argparse
from typing import Dict, List, Mapping, Sequence, Tuple

from gpustack_dspark.cli.client import CLIError, GPUStack
from gpustack_dspark.labels import parse_label, parse_label_key


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "label", parents=[common], help="set or remove labels on a GPUStack worker",
        description="Set or remove labels on a GPUStack worker, e.g. "
                    "`gpustack-dspark label gpu-node-1 role=json-inference`.")
    parser.add_argument("worker", metavar="WORKER", help="worker name or id")
    parser.add_argument("labels", metavar="KEY=VALUE", nargs="*", help="labels to add or overwrite")
    parser.add_argument("--remove", metavar="KEY", action="append", default=[],
                        help="label key to remove (repeatable)")
    parser.set_defaults(run=run)


def parse_changes(assignments: Sequence[str], removals: Sequence[str]) -> Tuple[Dict[str, str], List[str]]:
    """Validate the command line's label changes (pure)."""
    if not assignments and not removals:
        raise CLIError("nothing to do: give KEY=VALUE labels and/or --remove KEY")
    add: Dict[str, str] = {}
    for text in assignments:
        try:
            key, value = parse_label(text)
        except ValueError as e:
            raise CLIError(str(e)) from None
        add[key] = value
    for key in removals:
        try:
            parse_label_key(key)
        except ValueError as e:
            raise CLIError(f"--remove: {e}") from None
        if key in add:
            raise CLIError(f"label key {key!r} is both set and removed")
    return add, list(dict.fromkeys(removals))


def apply_changes(current: Mapping[str, str], add: Mapping[str, str], remove: Sequence[str]) -> Dict[str, str]:
    labels = {**current, **add}
    for key in remove:
        labels.pop(key, None)
    return labels


def find_worker(workers: Sequence[Mapping], wanted: str) -> Mapping:
    """By name first (names are unique in GPUStack), then by numeric id."""
    for worker in workers:
        if worker.get("name") == wanted:
            return worker
    if wanted.isdigit():
        for worker in workers:
            if worker.get("id") == int(wanted):
                return worker
    known = ", ".join(f"{w.get('name')} (id {w.get('id')})" for w in workers) or "none"
    raise CLIError(f"no worker named or numbered {wanted!r}; known workers: {known}")


def format_labels(labels: Mapping[str, str]) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(no labels)"


def run(args: argparse.Namespace) -> int:
    add, remove = parse_changes(args.labels, args.remove)
    with GPUStack(args.server, args.api_key) as api:
        worker = find_worker(api.workers(), args.worker)
        worker_id = worker["id"]
        if remove:
            current = api.request("GET", f"/v2/workers/{worker_id}")
            labels = apply_changes(current.get("labels") or {}, add, remove)
            api.request("PUT", f"/v2/workers/{worker_id}", json={
                "name": current["name"], "labels": labels, "maintenance": current.get("maintenance")})
            missing = [key for key in remove if key not in (current.get("labels") or {})]
            if missing:
                print(f"not set on {current['name']}, nothing to remove: {', '.join(missing)}")
        else:
            api.request("POST", "/v2/workers/labels", json={"worker_ids": [worker_id], "labels": add})
        after = api.request("GET", f"/v2/workers/{worker_id}")
    print(f"{after['name']} (id {worker_id}): {format_labels(after.get('labels') or {})}")
    return 0
