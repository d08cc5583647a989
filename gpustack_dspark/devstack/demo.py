"""`make demo`: the whole path on this machine, on 127.0.0.1 — the CPU DSpark image built
locally with Podman, PostgreSQL, GPUStack with the plugin, a CPU worker labelled for JSON
inference that deploys with Podman, the demo model with 2 warm replicas, a short JSON
benchmark through GPUStack's /v1 — then it serves until stopped and removes everything it
started (containers included).

However it is stopped — Ctrl-C (SIGINT), SIGTERM, SIGHUP (the terminal or tmux pane
closed) or the reader of its output gone (`make demo | tee demo.log` with `tee` killed by
the same Ctrl-C) — it ends the same way: whatever phase runs is interrupted and the cleanup
runs to the end. Why each of these needs care (a reported leak: in tmux, Ctrl-C on
`make demo 2>&1 | tee demo.log` left the server, worker, PostgreSQL, Podman's service and
the replica containers running):
- the cleanup's first message went to the dead pipe and raised BrokenPipeError, which
  skipped the cleanup: messages now go through `progress.Progress`, which swallows failed
  writes and also keeps every line in the state folder's demo.log;
- SIGHUP was not handled, so Python died at once: it is handled like SIGINT;
- a second signal (the pane's hang-up right after Ctrl-C) would cut the cleanup short: once
  the cleanup starts the demo leaves the terminal's session (setsid), so the terminal's
  signals reach neither it nor the helpers it runs, and any signal that still comes is ignored;
- a reader that dies while the demo prints nothing (serving) is noticed by polling the pipe.
"""

import argparse
import asyncio
import json
import os
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

from gpustack_dspark.bench import extraction, report, workloads
from gpustack_dspark.bench.load import json_check
from gpustack_dspark.bench.runner import Settings, run_target
from gpustack_dspark.devstack import real_model
from gpustack_dspark.devstack.container_stack import ContainerStack, replica_url
from gpustack_dspark.devstack.demo_model import (DEMO_MODEL_FILE, FIXTURE_MODEL_FILE, model_name_and_replicas,
                                                 real_model_wanted, with_real_model)
from gpustack_dspark.devstack.progress import Progress
from gpustack_dspark.devstack.replica import REPO_ROOT
from gpustack_dspark.devstack.server import ADMIN_USER

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
DEMO_LOG = "demo.log"
OUTPUT_GRACE_S = 1.0  # how long a dead output waits for the signal that may have caused it

BENCH_REQUESTS = 32
BENCH_CONCURRENCY = 4
BENCH_MAX_TOKENS = 160
# The real model's benchmark: fresh extraction requests (a new seed every run), every family.
EXTRACTION_REQUESTS = 12  # two of each family: under a minute on 2 cores
# The printed `Try:` request (the demo sends it once and prints the reply): an extraction.
TRY_SCHEMA = {"type": "object", "properties": {
    "customer": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 40},
    "item": {"type": "string", "maxLength": 40}, "quantity": {"type": "integer", "minimum": 1},
    "unit_price": {"type": "number"}, "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
    "required": ["customer", "city", "item", "quantity", "unit_price", "date"], "additionalProperties": False}
# One worked example as a turn of the conversation: what a 135 M model needs to copy values right.
TRY_MESSAGES = [
    {"role": "system", "content": "Extract the order from the text as JSON. Use only values stated in the text."},
    {"role": "user", "content": "Customer: Tom Reed, Rome. Date: 2026-01-05. Item: mug (quantity 2, unit price 8.25)."},
    {"role": "assistant", "content": '{"customer":"Tom Reed","city":"Rome","item":"mug","quantity":2,"unit_price":8.25,'
                                     '"date":"2026-01-05"}'},
    {"role": "user", "content": "Customer: Anna Berg, Oslo. Date: 2026-03-14. Item: desk lamp (quantity 3, unit price 24.50)."}]


class DemoStop(BaseException):
    """Raised in the main thread by a stop (signal or dead output): unwinds whatever phase
    runs into the cleanup. A BaseException, so no `except Exception` on the way swallows it."""


class Stopper:
    """Turns SIGINT, SIGTERM, SIGHUP and a dead output into one stop, and keeps the cleanup
    that follows from being cut short."""

    def __init__(self, out: Progress):
        self.out = out
        self.reason: Optional[str] = None
        self.cleaning = False
        self.session = os.getsid(0)  # the session the demo began in (its terminal's)
        self._main = threading.main_thread().ident

    def install(self) -> None:
        for signum in STOP_SIGNALS:
            signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        name = signal.Signals(signum).name
        if self.cleaning:
            self.out.say(f"[demo] {name} during the cleanup: ignored, the cleanup goes on")
            return
        if self.reason is None:
            self.reason = name
        raise DemoStop(self.reason)

    def output_died(self) -> None:
        """Progress found stdout dead (any thread): stop as for a signal. A signal sent to the
        whole job kills the pipe's reader too, and the output watcher can see the dead pipe
        before the main thread runs that signal's handler (seen in CI: a SIGTERM logged as a
        dead output), so a signal arriving within OUTPUT_GRACE_S names the stop instead."""
        deadline = time.monotonic() + OUTPUT_GRACE_S
        while self.reason is None and time.monotonic() < deadline:
            time.sleep(0.05)  # on the main thread, a pending signal's handler raises DemoStop here
        if self.reason is not None:  # a signal named the stop: its handler raised DemoStop
            return
        self.reason = "its output is gone (the pipe's reader or the terminal)"
        if not self.cleaning:
            signal.pthread_kill(self._main, signal.SIGTERM)

    def begin_cleanup(self) -> None:
        self.cleaning = True
        try:
            # Out of the terminal's session: a hang-up or a second Ctrl-C sent to the
            # terminal's process group now reaches neither the demo nor its cleanup helpers
            # (podman rm, pg_ctl stop). Refused when the demo leads its process group (started
            # straight from an interactive shell): then signals are only ignored.
            os.setsid()
        except OSError:
            pass


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


def extraction_benchmark(stack: ContainerStack, model: str, requests: int = EXTRACTION_REQUESTS,
                         concurrency: int = BENCH_CONCURRENCY, seed: Optional[int] = None) -> Dict[str, Any]:
    """Fresh extraction requests of every family through GPUStack's /v1 (a new seed each run: no
    replica has seen them), scored against the records they were written from."""
    seed = secrets.randbelow(1 << 30) if seed is None else seed
    tasks = extraction.tasks(seed, requests)
    settings = Settings(concurrency=concurrency, requests=requests, duration_s=None, stream=False, warmup=0,
                        timeout_s=300, body=lambda i, name: extraction.body(tasks[i], name),
                        check=lambda content: True, api_key=stack.api.api_key)
    metrics = [f"{replica_url(inst)}/metrics" for inst in stack.instances()]
    run = asyncio.run(run_target(stack.server.url, model, settings, metrics))
    summary = extraction.summarize(extraction.score_results(tasks, run.stats.ok),
                                   failed=len(run.stats.results) - len(run.stats.ok))
    run.stats.format_errors = summary.format_errors
    return {**bench_summary(report.figures(run)), "concurrency": concurrency, "workload": "extraction",
            "seed": seed, "finished": {"stop": summary.finished_stop, "length": summary.finished_length},
            "fields_right": f"{summary.fields_right}/{summary.fields_total}"}


def try_body(model: str) -> Dict[str, Any]:
    return {"model": model, "messages": TRY_MESSAGES, "max_tokens": 96, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": TRY_SCHEMA}}}


def try_line(url: str, user: str, password: str, body: Dict[str, Any]) -> str:
    return (f"Try: curl -u {user}:{password} {url}/v1/chat/completions -H 'content-type: application/json' "
            f"-d '{json.dumps(body, separators=(',', ':'))}'")


def try_reply(stack: ContainerStack, body: Dict[str, Any]) -> str:
    """What the printed request answers (sent once through GPUStack's /v1)."""
    import httpx

    r = httpx.post(f"{stack.server.url}/v1/chat/completions", json=body, timeout=300,
                   headers={"Authorization": f"Bearer {stack.api.api_key}"})
    if r.status_code != 200:
        return f"HTTP {r.status_code}: {r.text[:200]}"
    return r.json()["choices"][0]["message"]["content"]


class Conversion(threading.Thread):
    """The real model's conversion, run beside the platform's start (the image build)."""

    def __init__(self, say):
        super().__init__(daemon=True, name="real-model")
        self.say = say
        self.path: Optional[Path] = None
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self.path = real_model.real_model(progress=lambda line: self.say(f"[demo] real model: {line}"))
        except BaseException as e:  # reported by result(), on the main thread
            self.error = e

    def result(self) -> Path:
        while self.is_alive():
            self.join(0.5)  # in short waits: a stop signal still lands on the main thread
        if self.error is not None:
            raise RuntimeError(f"the real model could not be had: {self.error}")
        assert self.path is not None
        return self.path


def run_demo(port: int, model_file: Path, state_dir: Optional[Path], out: Progress, stopper: Stopper,
             bench_requests: Optional[int] = None) -> int:
    # Short default path: the Podman API socket lives in it (unix paths stop at 108 bytes);
    model, replicas = model_name_and_replicas(model_file)
    base = state_dir or Path(tempfile.mkdtemp(prefix="gsd-demo-"))
    keep = state_dir is not None
    base.mkdir(parents=True, exist_ok=True)
    out.open_log(base / DEMO_LOG)
    say = out.say
    password = "dspark-" + secrets.token_hex(4)
    stack = ContainerStack(base, api_port=port, admin_password=password, say=say,
                           on_phase=out.phase, spare_session=stopper.session)
    code = 1
    real = real_model_wanted(model_file)
    try:
        say(f"[demo] state in {base} (log {base / DEMO_LOG})")
        conversion = None
        if real:
            say(f"[demo] model: {real_model.MODEL_NAME} (PyPI {real_model.PACKAGE}=={real_model.PACKAGE_VERSION}), "
                "converted once into the cache beside the platform's start")
            conversion = Conversion(say)
            conversion.start()
        say("[demo] the CPU DSpark image is reused while its inputs are unchanged; else it is built "
            "from the worker venv while GPUStack starts (about a minute cold, seconds after a code change)")
        stack.start_platform()
        out.phase("plugin status")
        status = stack.api.get("/v2/dspark/status")
        deadline = time.monotonic() + 60
        while status["features"]["backend_registration"]["state"] == "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            status = stack.api.get("/v2/dspark/status")
        say(f"[demo] DSpark plugin {status['plugin']['version']} on GPUStack {status['gpustack']['version']}: "
            f"{_feature_line(status)}")
        say(f"[demo] CPU worker {stack.worker_name} ready, labelled role=json-inference, deploys with Podman; "
            f"image {stack.image}")
        if conversion is not None:
            out.phase("real model", lambda: "waiting for the conversion")
            model_file = with_real_model(model_file, conversion.result(), base)
        stack.deploy(model_file, timeout_s=1500)  # minutes on a busy 2-core machine
        # Serving from here: the address, the login and the printed request (answered) come first,
        # then the benchmark on the running replicas.
        say(f"[demo] phases (s): {json.dumps(stack.phases)}")
        say(f"GPUStack UI: {stack.server.url}/")
        say(f"Admin login: {ADMIN_USER} / {password}")
        say(f"Plugin status: curl -u {ADMIN_USER}:{password} {stack.server.url}/v2/dspark/status")
        if real:
            body = try_body(model)
            say(try_line(stack.server.url, ADMIN_USER, password, body))
            say(f"  -> {try_reply(stack, body)}")
        else:
            say(f"Try: curl -u {ADMIN_USER}:{password} {stack.server.url}/v1/chat/completions "
                f"-H 'content-type: application/json' -d '{{\"model\": \"{model}\", "
                f"\"messages\": [{{\"role\": \"user\", \"content\": \"Create an order record for user 1234: buy 12.50.\"}}]}}'")
        say("[demo] serving; the one-line benchmark follows")
        if real:
            count = bench_requests or EXTRACTION_REQUESTS
            out.phase("benchmark", lambda: f"{count} fresh extraction requests, {BENCH_CONCURRENCY} at a time")
            say(f"[demo] benchmark: {count} extraction requests no replica has seen, through "
                "GPUStack's /v1, scored against the records they were written from")
            say("[demo] benchmark: " + json.dumps(extraction_benchmark(stack, model, count)))
        else:
            count = bench_requests or BENCH_REQUESTS
            out.phase("benchmark", lambda: f"{count} order-JSON requests, {BENCH_CONCURRENCY} at a time")
            say(f"[demo] benchmark: {count} requests through GPUStack's /v1")
            say("[demo] benchmark: " + json.dumps(benchmark(stack, model, count)))
        out.phase(None)
        say("[demo] serving; press Ctrl-C to stop and clean up")
        while True:
            time.sleep(1.0)
            for proc in (stack.server.process, stack.worker.process, stack.service.process):
                if proc is not None and not proc.alive():
                    say(f"[demo] a process exited unexpectedly; see {proc.log_path}")
                    return 1
    except DemoStop:
        code = 0
    except Exception as e:  # a clear line, not a traceback, for setup problems
        say(f"[demo] failed: {e}")
    finally:
        while True:  # a stop that lands before the cleanup is marked begun is retried, not lost
            try:
                stopper.begin_cleanup()
                break
            except DemoStop:
                continue
        out.phase("stopping", lambda: "removing what the demo started")
        say(f"[demo] stopping ({stopper.reason or 'done'})")
        problems = stack.stop()
        out.phase(None)
        if problems:  # keep the folder: it holds the container store still in use
            say(f"[demo] stopped, but not everything is gone ({'; '.join(problems)}); state in {base}")
            code = 1
        else:
            if not keep:  # all but the log, which says what happened (the terminal may be gone)
                for entry in base.iterdir():
                    if entry.name != DEMO_LOG:
                        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)
            say(f"[demo] stopped; everything it started is gone (log {base / DEMO_LOG})")
    return code


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or value > 1000:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to 1000")
    return value


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpustack_dspark.devstack demo",
                                     description="Run GPUStack with DSpark replicas in containers on this machine.")
    parser.add_argument("--port", type=int, default=9180, help="GPUStack API/UI port on 127.0.0.1 (default 9180)")
    parser.add_argument("--model-file", type=Path, default=DEMO_MODEL_FILE,
                        help=f"model YAML to apply (default {DEMO_MODEL_FILE.relative_to(REPO_ROOT)}: the real model, "
                             "SmolLM2-135M-Instruct)")
    parser.add_argument("--fixture", action="store_true",
                        help=f"the test fixture instead ({FIXTURE_MODEL_FILE.relative_to(REPO_ROOT)}: starts fastest, "
                             "its answers are junk)")
    parser.add_argument("--bench-requests", type=_positive, default=None, metavar="N",
                        help=f"requests of the one-line benchmark (default {EXTRACTION_REQUESTS} extraction requests, "
                             f"two of each family; {BENCH_REQUESTS} with --fixture)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep state here instead of a temporary folder removed on exit (but for its demo.log)")
    args = parser.parse_args(argv)
    if args.fixture:
        if args.model_file != DEMO_MODEL_FILE:
            parser.error("--fixture and --model-file: give one")
        args.model_file = FIXTURE_MODEL_FILE
    try:
        model_name_and_replicas(args.model_file)
    except (OSError, ValueError, yaml.YAMLError) as e:
        parser.error(f"--model-file: {e}")

    out = Progress(sys.stdout)
    stopper = Stopper(out)
    out.on_dead_output = stopper.output_died
    stopper.install()
    out.watch_output()
    out.start_heartbeat()
    try:
        return run_demo(args.port, args.model_file, args.state_dir, out, stopper, args.bench_requests)
    except DemoStop:  # stopped before anything started, or while saying that it failed
        return 0
    finally:
        out.close()
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
