"""`gpustack-dspark status [NAME] [--json]`: replicas, state, warm, in-flight, acceptance.

Replicas and states come from GPUStack (`/v2/models`, `/v2/model-instances`); warm means
RUNNING (GPUStack marks an instance RUNNING only once `/dspark/ready` answered 200).
In-flight counts come from the plugin's `GET /v2/dspark/status` (`routing.in_flight`, per
instance); acceptance and format-error rates from its per-model metrics when the server
reports them (`models.<name>` or `metrics.models.<name>`). Anything absent shows as "–"
(null in --json): a server without the plugin, or with the metrics off, still answers.
"""

import argparse
import json
from collections import Counter
from typing import Any, Dict, List, Optional

from gpustack_dspark import backend_ids
from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.models_api import ModelsAPI

NONE = "–"


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "status", parents=[common], help="replicas, warm state, in-flight and acceptance of models",
        description="Show models: replicas, state, warm replicas, in-flight requests, acceptance and "
                    "format-error rates (when the server reports them).")
    parser.add_argument("name", metavar="NAME", nargs="?", help="one model (default: all)")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.set_defaults(run=run)


def _model_metrics(dspark: Optional[Dict[str, Any]], name: str) -> Dict[str, Any]:
    if not dspark:
        return {}
    for source in (dspark.get("models"), (dspark.get("metrics") or {}).get("models")):
        if isinstance(source, dict) and isinstance(source.get(name), dict):
            return source[name]
    return {}


def _rate(value: Any) -> Optional[float]:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def summarize(models: List[Dict], instances: List[Dict], dspark: Optional[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """The status rows (pure): one per model, with its instances."""
    in_flight = None
    routing = (dspark or {}).get("routing")
    if isinstance(routing, dict) and isinstance(routing.get("in_flight"), dict):
        in_flight = {str(k): v for k, v in routing["in_flight"].items()}
    rows = []
    for model in sorted(models, key=lambda m: m["name"]):
        own = sorted((i for i in instances if i.get("model_id") == model["id"]), key=lambda i: i["id"])
        listed = [{
            "id": i["id"], "name": i.get("name"), "state": i.get("state"), "worker": i.get("worker_name"),
            "warm": i.get("state") == "running",
            "in_flight": None if in_flight is None else int(in_flight.get(str(i["id"]), 0)),
            "state_message": i.get("state_message") or None,
        } for i in own]
        metrics = _model_metrics(dspark, model["name"])
        states = Counter(i["state"] for i in listed)
        rows.append({
            "name": model["name"], "id": model["id"],
            "dspark": model.get("backend") == backend_ids.BACKEND_NAME,
            "backend": model.get("backend"), "backend_version": model.get("backend_version"),
            "replicas": model.get("replicas"),
            "state": model.get("state") or (", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no instances"),
            "warm": sum(i["warm"] for i in listed),
            "in_flight": None if in_flight is None else sum(i["in_flight"] for i in listed),
            "acceptance_rate": _rate(metrics.get("acceptance_rate")),
            "format_error_rate": _rate(metrics.get("format_error_rate")),
            "instances": listed,
        })
    return rows


def _pct(value: Optional[float]) -> str:
    return NONE if value is None else f"{100 * value:.1f}%"


def table(rows: List[Dict[str, Any]]) -> str:
    header = ["MODEL", "DSPARK", "REPLICAS", "WARM", "STATE", "IN-FLIGHT", "ACCEPTANCE", "FORMAT-ERRORS"]
    body = [[r["name"], "yes" if r["dspark"] else "no", str(r["replicas"]), f"{r['warm']}/{r['replicas']}",
             str(r["state"]), NONE if r["in_flight"] is None else str(r["in_flight"]),
             _pct(r["acceptance_rate"]), _pct(r["format_error_rate"])] for r in rows]
    widths = [max(len(line[c]) for line in [header] + body) for c in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in [header] + body)


def run(args: argparse.Namespace) -> int:
    with ModelsAPI(args.server, args.api_key) as api:
        models = api.models()
        if args.name:
            models = [m for m in models if m["name"] == args.name]
            if not models:
                raise CLIError(f"no model named {args.name!r}")
        instances = api.instances(models[0]["id"]) if args.name else api.instances()
        rows = summarize(models, instances, api.dspark_status())
    if args.json:
        print(json.dumps({"models": rows}, indent=2, ensure_ascii=False))
    else:
        print(table(rows) if rows else "no models")
    return 0
