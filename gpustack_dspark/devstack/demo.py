"""`make demo`: PostgreSQL + GPUStack with the plugin + a CPU worker labelled for JSON
inference, all on 127.0.0.1, until Ctrl-C; then everything it started is stopped and removed.
"""

import argparse
import secrets
import shutil
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import List, Optional

from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.postgres import start_postgres
from gpustack_dspark.devstack.server import ADMIN_USER, GPUStackServer
from gpustack_dspark.devstack.worker import GPUStackWorker, join_cpu_worker
from gpustack_dspark.settings import DEFAULT_JSON_LABEL, PluginSettings


def _say(message: str) -> None:
    print(message, flush=True)


def _feature_line(status: dict) -> str:
    parts = []
    for name, feature in status["features"].items():
        parts.append(f"{name}={feature['state']}" + (f" ({feature['reason']})" if feature.get("reason") else ""))
    return ", ".join(parts)


def run_demo(port: int, with_worker: bool, state_dir: Optional[Path], stop: threading.Event) -> int:
    base = state_dir or Path(tempfile.mkdtemp(prefix="gpustack-dspark-demo-"))
    keep = state_dir is not None
    password = "dspark-" + secrets.token_hex(4)
    started: List = []
    try:
        _say(f"[demo] state in {base}")
        t0 = time.monotonic()
        postgres = start_postgres(base / "postgres")
        started.append(postgres)
        _say(f"[demo] PostgreSQL on 127.0.0.1:{postgres.port} ({time.monotonic() - t0:.0f}s)")

        server = GPUStackServer(data_dir=base / "server", database_url=postgres.url,
                                admin_password=password, api_port=port)
        started.append(server)
        server.start()
        _say(f"[demo] GPUStack server with the DSpark plugin is up ({time.monotonic() - t0:.0f}s)")
        api = GPUStackAPI(server.url, server.create_api_key("dspark-demo"))

        if with_worker:
            worker: GPUStackWorker = join_cpu_worker(api, server.url, "json-cpu-1", base / "worker",
                                                     labels=dict([PluginSettings().json_label]))
            started.append(worker)
            _say(f"[demo] CPU worker json-cpu-1 ready, labelled {DEFAULT_JSON_LABEL} ({time.monotonic() - t0:.0f}s)")

        status = {}
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stop.is_set():
            status = api.get("/v2/dspark/status")
            if status["features"]["backend_registration"]["state"] != "pending":
                break
            time.sleep(0.5)
        _say(f"[demo] DSpark plugin {status['plugin']['version']} on GPUStack {status['gpustack']['version']}: "
             f"{_feature_line(status)}")
        _say(f"GPUStack UI: {server.url}/")
        _say(f"Admin login: {ADMIN_USER} / {password}")
        _say(f"Plugin status: curl -u {ADMIN_USER}:{password} {server.url}/v2/dspark/status")
        _say("[demo] serving; press Ctrl-C to stop and clean up")
        while not stop.wait(1.0):
            for proc in (server.process, *(w.process for w in started if isinstance(w, GPUStackWorker))):
                if proc is not None and not proc.alive():
                    _say(f"[demo] a process exited unexpectedly; see {proc.log_path}")
                    return 1
        return 0
    finally:
        _say("[demo] stopping")
        for item in reversed(started):
            item.stop()
        if not keep:
            shutil.rmtree(base, ignore_errors=True)
        _say("[demo] stopped; everything it started is gone")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpustack_dspark.devstack demo",
                                     description="Run GPUStack with the DSpark plugin on this machine.")
    parser.add_argument("--port", type=int, default=9180, help="GPUStack API/UI port on 127.0.0.1 (default 9180)")
    parser.add_argument("--no-worker", action="store_true", help="do not start a CPU worker")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="keep state here instead of a temporary folder removed on exit")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    try:
        return run_demo(args.port, not args.no_worker, args.state_dir, stop)
    except Exception as e:  # a clear line, not a traceback, for setup problems
        print(f"[demo] failed: {e}", file=sys.stderr, flush=True)
        return 1
