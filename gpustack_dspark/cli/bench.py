"""`gpustack-dspark bench`: the load test users run before and after turning DSpark on.

    gpustack-dspark bench --server http://gpustack:80 --api-key KEY --model orders \\
        --concurrency 8 --requests 200 --stream
    gpustack-dspark bench --compare http://127.0.0.1:8001 http://127.0.0.1:8002 --requests 64

Targets are OpenAI-compatible: GPUStack's `/v1` or a replica. The load and its figures live
in `bench/` (runner.py, report.py); this module parses and checks the arguments.
"""

import argparse
import asyncio
import math
import secrets
import sys
from typing import Any, Dict, List, Optional

from gpustack_dspark import bounded
from gpustack_dspark.bench import extraction, report, workloads
from gpustack_dspark.bench.load import json_check
from gpustack_dspark.bench.runner import BenchError, Settings, is_loopback, normalize_target, run_target
from gpustack_dspark.cli.client import CLIError

LIMITS = {"concurrency": (1, 1024), "requests": (1, 100_000), "duration": (1, 3600), "warmup": (0, 1000),
          "max_tokens": (1, 32768), "temperature": (0.0, 2.0), "timeout": (1, 3600)}
DEFAULT_REQUESTS = 100


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "bench", parents=[common], help="load-test an OpenAI-compatible endpoint (GPUStack /v1 or a replica)",
        description="Load-test GPUStack's /v1 (--server) or a replica; --compare A B runs two targets in one "
                    "run and prints B/A ratios. Figures: output tok/s, requests/s, latency and TTFT "
                    "P50/P90/P99, JSON format-error rate, acceptance rate and tokens per forward pass.")
    parser.add_argument("--model", help="model name (default: the only model the target serves)")
    parser.add_argument("--compare", nargs=2, metavar=("A", "B"), help="two target URLs, run one after the other")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    limit = parser.add_mutually_exclusive_group()
    limit.add_argument("--requests", type=int, help=f"number of requests (default {DEFAULT_REQUESTS})")
    limit.add_argument("--duration", type=float, metavar="SECONDS", help="send requests for this long instead")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--schema", metavar="FILE", help="JSON schema file for the replies "
                        "(default: the built-in order-JSON workload)")
    parser.add_argument("--workload", choices=("order", "extraction"), default="order",
                        help="order: the built-in order-JSON workload (default); extraction: requests of six "
                             "families (orders, invoices, contacts, tickets, events, products) written from seeded "
                             "records, each reply checked against its own schema and scored field by field "
                             "(for a real model: SmolLM2-135M-Instruct in `make demo`)")
    parser.add_argument("--seed", type=int, default=None,
                        help="extraction: the requests' seed (default: a new one each run, printed), so no "
                             "replica is measured on a request it has seen")
    parser.add_argument("--example", choices=extraction.EXAMPLES, default=None, help=extraction.EXAMPLE_HELP)
    parser.add_argument("--stream", action="store_true", help="stream replies (measures TTFT)")
    parser.add_argument("--warmup", type=int, default=0, metavar="N", help="uncounted requests first (default 0)")
    parser.add_argument("--timeout", type=float, default=120, metavar="SECONDS", help="per request (default 120)")
    parser.add_argument("--metrics-url", action="append", default=[], metavar="URL",
                        help="where to read vLLM's speculative counters (repeatable; default TARGET/metrics)")
    parser.add_argument("--local-only", action="store_true", help="refuse targets that are not on loopback")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", action="store_true", help="print the figures as JSON")
    output.add_argument("--csv", action="store_true", help="print the figures as CSV")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    parser.set_defaults(run=run)


def _check_range(name: str, value: Optional[float]) -> None:
    if value is None:
        return
    low, high = LIMITS[name]
    if not (low <= value <= high) or (isinstance(value, float) and math.isnan(value)):
        raise CLIError(f"--{name.replace('_', '-')} {value}: must be between {low} and {high}")


def load_schema(path: str) -> Dict[str, Any]:
    try:
        schema = bounded.read_json(path, bounded.SCHEMA)
    except bounded.BoundedError as e:
        raise CLIError(f"--schema {path}: {e}") from None
    try:
        import jsonschema

        jsonschema.validators.validator_for(schema).check_schema(schema)
    except ImportError:
        raise CLIError("--schema needs the jsonschema package (pip install jsonschema)") from None
    except Exception as e:
        raise CLIError(f"--schema {path}: not a valid JSON schema: {str(e).splitlines()[0]}") from None
    if not isinstance(schema, dict):
        raise CLIError(f"--schema {path}: a JSON schema object is expected")
    return schema


def targets_of(args: argparse.Namespace) -> List[str]:
    if args.compare:
        if args.metrics_url:
            raise CLIError("--metrics-url applies to one target; with --compare each target's /metrics is read")
        found = list(args.compare)
    elif args.server:
        found = [args.server]
    else:
        raise CLIError("no target: pass --server URL (GPUStack or a replica), set GPUSTACK_SERVER_URL, "
                       "or --compare A B")
    try:
        found = [normalize_target(t) for t in found]
    except BenchError as e:
        raise CLIError(str(e)) from None
    if args.local_only:
        for url in found + list(args.metrics_url):
            if not is_loopback(url):
                raise CLIError(f"{url} is not a loopback address and --local-only is set")
    return found


def settings_of(args: argparse.Namespace) -> Settings:
    for name in ("concurrency", "requests", "duration", "warmup", "max_tokens", "temperature", "timeout"):
        _check_range(name, getattr(args, name))
    if args.workload == "extraction":
        if args.schema:
            raise CLIError("--schema and --workload extraction: give one (extraction brings its own schemas)")
        body, check = _extraction_workload(args)
    else:
        if args.seed is not None:
            raise CLIError("--seed is for --workload extraction (the order-JSON workload is not seeded)")
        if args.example is not None:
            raise CLIError(f"--example {args.example} is for --workload extraction (the order-JSON workload "
                           "has no worked example)")
        body, check = _schema_workload(args)
    requests = args.requests if args.requests is not None or args.duration is not None else DEFAULT_REQUESTS
    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    return Settings(concurrency=args.concurrency, requests=requests, duration_s=args.duration, stream=args.stream,
                    warmup=args.warmup, timeout_s=args.timeout, body=body, check=check,
                    api_key=args.api_key, progress=progress)


def _schema_workload(args: argparse.Namespace):
    """The order-JSON workload, or `--schema`'s: bodies and the format check of one schema."""
    schema = load_schema(args.schema) if args.schema else None
    validator = None
    try:
        import jsonschema

        checked = schema or workloads.ORDER_SCHEMA
        validator = jsonschema.validators.validator_for(checked)(checked).validate
    except ImportError:  # parse-only check without jsonschema
        pass
    if schema is None:
        def body(i, model):
            return workloads.order_body(i, args.max_tokens, args.temperature, model)
    else:
        def body(i, model):
            return workloads.schema_body(i, schema, args.max_tokens, args.temperature, model)
    return body, json_check(validator)


def _extraction_workload(args: argparse.Namespace):
    """Extraction tasks of `--seed` (a new one when not given; kept in `args` for the report, the
    tasks in `args.tasks` for scoring): replies are judged after the run, each by its own task."""
    if args.seed is None:
        args.seed = secrets.randbelow(1 << 30)
    args.example = args.example or extraction.PER_REQUEST
    measured = extraction.TaskStream(args.seed, example=args.example)
    warmup = extraction.TaskStream(args.seed + 1, example=args.example)
    args.tasks = measured

    def body(i, model):  # the warmup's indices are negative: tasks of their own
        return extraction.body(measured[i] if i >= 0 else warmup[-1 - i], model, args.temperature)

    return body, lambda content: True


def scored(run_figures: Dict[str, Any], run, tasks: "extraction.TaskStream") -> Dict[str, Any]:
    """An extraction run's figures with each reply judged by its own task: format errors (invalid
    replies not cut at max_tokens) and the share of fields right."""
    summary = extraction.summarize(extraction.score_results(tasks, run.stats.ok))
    run.stats.format_errors = summary.format_errors
    ok = len(run.stats.ok)
    return {**run_figures, "format_errors": run.stats.format_errors,
            "format_error_rate": round(run.stats.format_errors / ok, 6) if ok else None,
            "field_accuracy": round(summary.accuracy, 6) if summary.fields_total else None,
            "fields_right": summary.fields_right, "fields_total": summary.fields_total}


async def _run_all(targets: List[str], args, settings: Settings):
    runs = []
    for name, target in zip("AB" if len(targets) == 2 else " ", targets):
        label = f"{name.strip() + ' ' if name.strip() else ''}{target}"
        runs.append(await run_target(target, args.model, settings, args.metrics_url or None, label=label))
    return runs


def run(args: argparse.Namespace) -> int:
    targets = targets_of(args)
    settings = settings_of(args)
    try:
        runs = asyncio.run(_run_all(targets, args, settings))
    except BenchError as e:
        raise CLIError(str(e)) from None
    figures = [report.figures(r) for r in runs]
    if args.workload == "extraction":
        figures = [scored(f, r, args.tasks) for f, r in zip(figures, runs)]
        workload = (f"extraction (six families, seed {args.seed}: requests no replica has seen unless that "
                    f"seed was run before; worked example {args.example})")
    else:
        workload = f"schema {args.schema}" if args.schema else "built-in order-JSON workload"
    described = {
        "workload": workload,
        "concurrency": args.concurrency, "max_tokens": args.max_tokens, "temperature": args.temperature,
        "stream": args.stream, "warmup": args.warmup,
        "limit": f"{args.duration:g} s" if args.duration else f"{settings.requests} requests",
    }
    if args.json:
        print(report.as_json(figures, described))
    elif args.csv:
        print(report.as_csv(figures), end="")
    else:
        print(report.as_text(figures, described))
    failed_all = [f["target"] for f in figures if f["requests"] and f["failed"] == f["requests"]]
    if failed_all:
        print(f"gpustack-dspark bench: every request to {', '.join(failed_all)} failed", file=sys.stderr)
        return 1
    return 0
