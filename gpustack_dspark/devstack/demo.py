"""`make demo`: the whole path on this machine, on 127.0.0.1 — the CPU DSpark image built
locally with Podman, PostgreSQL, GPUStack with the plugin, a CPU worker labelled for JSON
inference that deploys with Podman, the demo model with 2 warm replicas, a short JSON
benchmark through GPUStack's /v1 — then it serves until Ctrl-C and removes everything it
started (containers included).
"""

import argparse
import asyncio
import json
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from gpustack_dspark.bench import report, workloads
from gpustack_dspark.bench.load import json_check
from gpustack_dspark.bench.runner import Settings, run_target
from gpustack_dspark.devstack.container_stack import ContainerStack, replica_url
from gpustack_dspark.devstack.demo_model import DEMO_MODEL_FILE, model_name_and_replicas
from gpustack_dspark.devstack.replica import REPO_ROOT
from gpustack_dspark.devstack.server import ADMIN_USER

BENCH_REQUESTS = 32
BENCH_CONCURRENCY = 4
BENCH_MAX_TOKENS = 160


def _say(message: str) -> None:
    print(message, flush=True)


def _feature_line(status: dict) -> str:
    parts = []
    for name, feature in status["features"].items():
        parts.append(f"{name}={feature['state']}" + (f" ({feature['reason']})" if feature.get("reason") else ""))
    return ", ".join(parts)


def bench_summary(figures: Dict[str, Any]) -> Dict[str, Any]:
    """`gpustack-dspark bench`'s figures for one target, as the demo's one-line summary."""
    def rounded(value: Any, digits: int) -> Any:
        return round(value, digits) if isinstance(value, float) else value

    return {key: rounded(figures[name], digits) for key, name, digits in (
        ("requests", "requests", 0), ("failed", "failed", 0), ("tok_per_s", "output_tok_s", 1),
        ("p50_s", "latency_p50_s", 3), ("p99_s", "latency_p99_s", 3), ("acceptance_rate", "acceptance_rate", 3),
        ("tokens_per_forward", "tokens_per_forward", 2), ("format_errors", "format_errors", 0))}


def benchmark(stack: ContainerStack, model: str, requests: int = BENCH_REQUESTS,
              concurrency: int = BENCH_CONCURRENCY) -> Dict[str, Any]:
    """The built-in order-JSON workload of `gpustack-dspark bench` through GPUStack's /v1, with
    vLLM's speculative counters read from every replica's /metrics."""
    import jsonschema

    settings = Settings(concurrency=concurrency, requests=requests, duration_s=None, stream=False, warmup=0,
                        timeout_s=180, body=lambda i, name: workloads.order_body(i, BENCH_MAX_TOKENS, 0.0, name),
                        check=json_check(jsonschema.Draft202012Validator(workloads.ORDER_SCHEMA).validate),
                        api_key=stack.api.api_key)
    metrics = [f"{replica_url(inst)}/metrics" for inst in stack.instances()]
    run = asyncio.run(run_target(stack.server.url, model, settings, metrics))
    return {**bench_summary(report.figures(run)), "concurrency": concurrency}


def run_demo(port: int, model_file: Path, state_dir: Optional[Path], stop: threading.Event) -> int:
    # Short default path: the Podman API socket lives in it (unix paths stop at 108 bytes);
    model, replicas = model_name_and_replicas(model_file)
    base = state_dir or Path(tempfile.mkdtemp(prefix="gsd-demo-"))
    keep = state_dir is not None
    password = "dspark-" + secrets.token_hex(4)
    stack = ContainerStack(base, api_port=port, admin_password=password, say=_say)
    try:
        _say(f"[demo] state in {base}")
        _say("[demo] building the CPU DSpark image (cached by its inputs; the first build takes minutes)")
        stack.start_platform()
        status = stack.api.get("/v2/dspark/status")
        deadline = time.monotonic() + 60
        while status["features"]["backend_registration"]["state"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            status = stack.api.get("/v2/dspark/status")
        _say(f"[demo] DSpark plugin {status['plugin']['version']} on GPUStack {status['gpustack']['version']}: "
             f"{_feature_line(status)}")
        _say(f"[demo] CPU worker {stack.worker_name} ready, labelled role=json-inference, deploys with Podman; "
             f"image {stack.image}")
        _say(f"[demo] gpustack-dspark apply -f {model_file}: {model}, {replicas} replicas (RUNNING once warm)")
        stack.deploy(model_file, timeout_s=1500)  # minutes on a busy 2-core machine
        _say("[demo] benchmark: " + json.dumps(benchmark(stack, model)))
        _say(f"[demo] phases (s): {json.dumps(stack.phases)}")
        _say(f"GPUStack UI: {stack.server.url}/")
        _say(f"Admin login: {ADMIN_USER} / {password}")
        _say(f"Plugin status: curl -u {ADMIN_USER}:{password} {stack.server.url}/v2/dspark/status")
        _say(f"Try: curl -u {ADMIN_USER}:{password} {stack.server.url}/v1/chat/completions "
             f"-H 'content-type: application/json' -d '{{\"model\": \"{model}\", "
             f"\"messages\": [{{\"role\": \"user\", \"content\": \"Create an order record for user 1234: buy 12.50.\"}}]}}'")
        _say("[demo] serving; press Ctrl-C to stop and clean up")
        while not stop.wait(1.0):
            for proc in (stack.server.process, stack.worker.process, stack.service.process):
                if proc is not None and not proc.alive():
                    _say(f"[demo] a process exited unexpectedly; see {proc.log_path}")
                    return 1
        return 0
    finally:
        _say("[demo] stopping")
        problems = stack.stop()
        if problems:  # keep the folder: it holds the container store still in use
            _say(f"[demo] stopped, but not everything is gone ({'; '.join(problems)}); state in {base}")
        else:
            if not keep:
                shutil.rmtree(base, ignore_errors=True)
            _say("[demo] stopped; everything it started is gone")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpustack_dspark.devstack demo",
                                     description="Run GPUStack with DSpark replicas in containers on this machine.")
    parser.add_argument("--port", type=int, default=9180, help="GPUStack API/UI port on 127.0.0.1 (default 9180)")
    parser.add_argument("--model-file", type=Path, default=DEMO_MODEL_FILE,
                        help=f"model YAML to apply (default {DEMO_MODEL_FILE.relative_to(REPO_ROOT)})")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep state here instead of a temporary folder removed on exit")
    args = parser.parse_args(argv)
    try:
        model_name_and_replicas(args.model_file)
    except (OSError, ValueError, yaml.YAMLError) as e:
        parser.error(f"--model-file: {e}")

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        return run_demo(args.port, args.model_file, args.state_dir, stop)
    except Exception as e:  # a clear line, not a traceback, for setup problems
        print(f"[demo] failed: {e}", file=sys.stderr, flush=True)
        return 1
