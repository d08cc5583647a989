"""`gpustack-dspark sweep`: measure speculative lengths x thresholds x concurrency levels on a
scratch replica or on a running deployment, and recommend a setting.

    gpustack-dspark sweep --model-path /models/orders --lengths 0,2,4,6,8,auto \\
        --thresholds 0.3,0.7 --concurrency 1,8,32 --requests 64 --out sweep/
    gpustack-dspark sweep --deployment orders --server URL --api-key KEY --lengths 2,4,6,8,auto --out sweep/

Scratch (--model-path): for each setting a `dspark-serve` replica is started on loopback (one
at a time), measured at every concurrency level with the `bench` runner, and stopped (also on
Ctrl-C). Rolling (--deployment): each setting is rolled onto one replica of the running
deployment, never fewer than N-1 warm, and the deployment's own settings are put back at the
end or on Ctrl-C (cli/sweep_rolling.py). Writes sweep.csv, sweep.json and sweep.png (goodput
curves per concurrency) to --out, prints the table, the best setting per load and the
model-YAML change that applies it. Every argument is checked before anything starts or changes.
"""

import argparse
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpustack_dspark.bench import sweep, workloads
from gpustack_dspark.cli.errors import BadInput
from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.sweep_interrupts import CtrlC

LIMITS = {"requests": (1, 100_000), "max_tokens": (1, 32768), "timeout": (1, 3600), "ready_timeout": (10, 7200),
          "warmup": (0, 1000)}


def register(subparsers, common: argparse.ArgumentParser) -> None:
    parser = subparsers.add_parser(
        "sweep", parents=[common],
        help="measure speculative lengths x thresholds x concurrency on a scratch replica or a running "
             "deployment; plot, recommend",
        description="Start a scratch dspark-serve replica per setting (loopback, one at a time), or roll each "
                    "setting onto one replica of a running deployment (--deployment; N-1 keep serving, restored "
                    "at the end), load it with the bench runner at each concurrency, and write "
                    "sweep.csv/.json/.png and the best setting per load with the model-YAML change that applies it.")
    target = parser.add_mutually_exclusive_group(required=True)
    target.add_argument("--model-path", metavar="DIR", help="model directory for a scratch replica")
    target.add_argument("--deployment", metavar="NAME",
                        help="a running DSpark deployment on --server: each setting rolled onto one of its replicas "
                             "(at least 2), its own settings restored at the end or on Ctrl-C; lengths 1-16/auto")
    parser.add_argument("--lengths", default=None,
                        help="speculative lengths: integers 0-16 (0 = no speculation, scratch replicas only), "
                             "ranges 2-8, auto (default 0,2,4,6,8,auto; with --deployment 2,4,6,8,auto)")
    parser.add_argument("--thresholds", default="0.3", help="accept thresholds, 0 < x < 1 (default 0.3)")
    parser.add_argument("--concurrency", default="1,8", help="concurrency levels (default 1,8)")
    parser.add_argument("--requests", type=int, default=32, help="requests per cell (default 32)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=2, metavar="N", help="uncounted requests per cell (default 2)")
    parser.add_argument("--schema", metavar="FILE", help="JSON schema of the replies (default: order JSON)")
    parser.add_argument("--timeout", type=float, default=300, metavar="SECONDS", help="per request (default 300)")
    parser.add_argument("--ready-timeout", type=float, default=900, metavar="SECONDS",
                        help="per replica start (default 900)")
    parser.add_argument("--serve-args", default="", metavar="ARGS",
                        help="extra dspark-serve/vLLM arguments for every replica (quoted; no --dspark-speculative-*)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cpu: the small CPU layout (eager, float32, small KV cache); cuda: vLLM defaults")
    parser.add_argument("--out", required=True, metavar="DIR", help="where sweep.csv, sweep.json, sweep.png go")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal)")
    parser.set_defaults(run=run)


def check_args(args: argparse.Namespace) -> Dict[str, Any]:
    """Every argument checked; returns the parsed grid. Raises BadInput (exit 2) with one line."""
    try:
        if args.lengths is None:
            args.lengths = "2,4,6,8,auto" if args.deployment is not None else "0,2,4,6,8,auto"
        lengths = sweep.parse_lengths(args.lengths)
        thresholds = sweep.parse_thresholds(args.thresholds)
        levels = sweep.parse_concurrency(args.concurrency)
        settings = sweep.grid(lengths, thresholds, levels)
    except sweep.GridError as e:
        raise BadInput(str(e)) from None
    for name, (low, high) in LIMITS.items():
        value = getattr(args, name)
        if not (low <= value <= high):
            raise BadInput(f"--{name.replace('_', '-')} {value}: must be between {low} and {high}")
    if args.deployment is not None:
        from gpustack_dspark.cli.client import API_KEY_ENV, SERVER_ENV

        if not args.server or not str(args.server).startswith(("http://", "https://")):
            raise BadInput(f"--server {args.server!r}: a GPUStack URL (http:// or https://) is needed with "
                           f"--deployment (or set {SERVER_ENV})")
        if not args.api_key:
            raise BadInput(f"--api-key: a GPUStack API key is needed with --deployment (or set {API_KEY_ENV})")
        if args.serve_args:
            raise BadInput("--serve-args: only for scratch replicas (--model-path); a deployment keeps its own "
                           "backend parameters")
        if 0 in lengths:
            try:
                sweep.deployment_parameters([], sweep.Setting(0, None))
            except sweep.GridError as e:
                raise BadInput(str(e)) from None
    else:
        model = Path(args.model_path)
        if not (model / "config.json").is_file():
            raise BadInput(f"--model-path {args.model_path}: not a model directory (no config.json)")
    try:
        extra = shlex.split(args.serve_args)
    except ValueError as e:
        raise BadInput(f"--serve-args {args.serve_args!r}: {e}") from None
    for token in extra:
        if token.split("=")[0] in ("--dspark-speculative-length", "--dspark-speculative-max",
                                   "--dspark-accept-threshold", "--enable-dspark", "--speculative-config"):
            raise BadInput(f"--serve-args: {token.split('=')[0]} is set by the sweep per setting; leave it out")
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise BadInput(f"--out {args.out}: exists and is not a directory")
    schema = None
    if args.schema:
        from gpustack_dspark.cli.bench import load_schema

        schema = load_schema(args.schema)
    serve = _serve_binary() if args.deployment is None else None
    if serve is None and args.deployment is None:
        raise BadInput("dspark-serve not found: install gpustack-dspark[worker] beside vLLM, or set "
                       "DSPARK_WORKER_VENV to that environment")
    return {"lengths": lengths, "thresholds": thresholds, "levels": levels, "settings": settings,
            "extra": extra, "out": out, "schema": schema, "serve": serve}


def _serve_binary():
    venv = os.environ.get("DSPARK_WORKER_VENV")
    if venv and (Path(venv) / "bin" / "dspark-serve").exists():
        return Path(venv) / "bin" / "dspark-serve"
    found = shutil.which("dspark-serve")
    if found:
        return Path(found)
    from gpustack_dspark.devstack.replica import dspark_serve_bin

    return dspark_serve_bin() if dspark_serve_bin().exists() else None


def run(args: argparse.Namespace) -> int:
    # Ctrl-C is ours from here to the return (cli/sweep_interrupts.py): at any moment it ends
    # with "interrupted", what the sweep changed put back, and 130.
    ctrl_c = CtrlC()
    with ctrl_c.installed():
        try:
            return _run(args, ctrl_c)
        except KeyboardInterrupt:  # before the measuring started or after it ended
            with ctrl_c.quiet():
                print("gpustack-dspark sweep: interrupted", file=sys.stderr, flush=True)
            return 130


def _run(args: argparse.Namespace, ctrl_c: CtrlC) -> int:
    checked = check_args(args)
    from gpustack_dspark.bench.load import json_check
    from gpustack_dspark.bench.report import figures as figures_of
    from gpustack_dspark.bench.runner import BenchError, Settings, run_target

    schema = checked["schema"]
    checked_schema = schema or workloads.ORDER_SCHEMA
    try:
        import jsonschema

        check = json_check(jsonschema.validators.validator_for(checked_schema)(checked_schema).validate)
    except ImportError:
        check = json_check(None)

    def body(i, model):
        if schema is None:
            return workloads.order_body(i, args.max_tokens, 0.0, model)
        return workloads.schema_body(i, schema, args.max_tokens, 0.0, model)

    progress = args.progress if args.progress is not None else sys.stderr.isatty()
    out: Path = checked["out"]  # made once there is something to write: a refused deployment leaves no trace
    rows: List[sweep.Row] = []
    settings = checked["settings"]

    def fresh(cell: int):
        """The requests of the sweep's `cell`-th cell: numbered past every earlier cell's (warmup
        included), so a replica serving several cells is never measured on a request it has seen."""
        offset = cell * (args.requests + args.warmup)

        def numbered(i, model):
            return body(offset + (i if i >= 0 else args.requests - 1 - i), model)
        return numbered

    def measure(setting: sweep.Setting, base_url: str, served: Optional[str]) -> None:
        for level in checked["levels"]:
            ctrl_c.check()
            bench = Settings(concurrency=level, requests=args.requests, duration_s=None, stream=True,
                             warmup=args.warmup, timeout_s=args.timeout, body=fresh(len(rows)), check=check,
                             progress=progress)
            try:
                target_run = ctrl_c.run(run_target, base_url, served, bench, None,
                                        label=f"{setting.label} @ {level}")
            except BenchError as e:
                raise CLIError(f"{setting.label} at concurrency {level}: {e}") from None
            goodput = sweep.goodput(target_run.stats, check)
            rows.append(sweep.row_of(setting, level, figures_of(target_run), goodput))
            with ctrl_c.deferred():  # what is measured so far survives an interruption, whole
                _write(out, rows, args, checked)
            print(f"    concurrency {level}: goodput {goodput:.1f} tok/s", file=sys.stderr, flush=True)

    try:
        if args.deployment is not None:
            from gpustack_dspark.cli.models_api import ModelsAPI
            from gpustack_dspark.cli.sweep_rolling import run_rolling

            with ModelsAPI(args.server, args.api_key) as api:
                run_rolling(api, args.deployment, settings, args.ready_timeout, measure)
        else:
            out.mkdir(parents=True, exist_ok=True)
            for index, setting in enumerate(settings, start=1):
                ctrl_c.check()
                print(f"[{index}/{len(settings)}] {setting.label}: starting a scratch replica", file=sys.stderr)
                replica = None
                try:
                    with ctrl_c.deferred():  # started and known, or not started: never an orphan
                        replica = _start(checked["serve"], Path(args.model_path), args.device,
                                         out / f"replica-{index}.log",
                                         setting.serve_args() + checked["extra"] + ["--dspark-warmup-requests", "2"])
                    try:
                        replica.wait_ready(args.ready_timeout)
                    except (RuntimeError, TimeoutError) as e:
                        raise CLIError(f"{setting.label}: the scratch replica did not start: {str(e).splitlines()[0]} "
                                       f"(log: {out / f'replica-{index}.log'})") from None
                    ctrl_c.check()
                    measure(setting, replica.base_url, None)
                finally:
                    if replica is not None:
                        with ctrl_c.deferred():  # a second Ctrl-C does not leave it running
                            replica.stop()
        ctrl_c.check()  # one noted where it could not be raised: the sweep still ends "interrupted"
    except KeyboardInterrupt:
        with ctrl_c.quiet():
            print("gpustack-dspark sweep: interrupted" + (f"; measured so far: {out / 'sweep.csv'}" if rows else ""),
                  file=sys.stderr, flush=True)
        return 130
    print(sweep.as_text(rows))
    print(f"\nwritten: {out / 'sweep.csv'}, {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0


def _start(serve: Path, model: Path, device: str, log: Path, args: List[str]):
    """A scratch replica on loopback (devstack's process handling: its own process group,
    stopped with the sweep)."""
    from gpustack_dspark.devstack.ports import free_port
    from gpustack_dspark.devstack.processes import ManagedProcess
    from gpustack_dspark.devstack.replica import CPU_VLLM_ARGS, SERVED_NAME, Replica, worker_env

    port = free_port()
    argv = [str(serve), str(model), "--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME,
            *(CPU_VLLM_ARGS if device == "cpu" else ()), *args]
    env = worker_env() if device == "cpu" else {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return Replica(ManagedProcess(argv, env, log), port)


def _write(out: Path, rows: List[sweep.Row], args: argparse.Namespace, checked: Dict[str, Any]) -> None:
    described = {"model_path": args.model_path, "deployment": args.deployment, "lengths": checked["lengths"], "thresholds": checked["thresholds"],
                 "concurrency": checked["levels"], "requests": args.requests, "max_tokens": args.max_tokens,
                 "workload": f"schema {args.schema}" if args.schema else "built-in order-JSON workload",
                 "temperature": 0.0, "device": args.device}
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.csv").write_text(sweep.as_csv(rows))
    (out / "sweep.json").write_text(sweep.as_json(rows, described))
    title = f"rolling sweep: {args.deployment}" if args.deployment else f"sweep: {Path(args.model_path).name}"
    sweep.plot(rows, str(out / "sweep.png"), title=title)
