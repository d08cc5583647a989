"""The README's demo command: the whole container path up to "serving" (UI, admin login,
a JSON benchmark line), then a clean Ctrl-C that leaves no process and no container."""

import json

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpustack_dspark.devstack import podman as podman_host
from gpustack_dspark.devstack.postgres import free_port

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2700)]  # may include the cold image build


def _read_until(proc, pattern, timeout_s, seen):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        seen.append(line)
        match = re.search(pattern, line)
        if match:
            return match
    raise AssertionError(f"demo never printed {pattern!r}; output:\n{''.join(seen)}")


def _container_names(config):
    return set(config.run("ps", "-a", "--format", "{{.Names}}").stdout.split())


def _processes_mentioning(path: Path):
    """Processes whose command line names the demo's state folder (replicas, conmon, podman)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(proc.name)
        except OSError:
            pass
    return found


def test_demo_serves_warm_replicas_behind_the_ui_and_stops_cleanly_on_ctrl_c():
    config = podman_host.prepare()  # fails here, with the reason, where Podman cannot work
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpustack_dspark.devstack", "demo", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        state_dir = Path(_read_until(proc, r"\[demo\] state in (\S+)", 30, seen).group(1))
        # Cold image build included: bounded generously, the cached path takes ~2 minutes.
        summary = json.loads(_read_until(proc, r"\[demo\] benchmark: (\{.*\})", 1800, seen).group(1))
        assert summary["failed"] == 0 and summary["requests"] > 0 and summary["format_errors"] == 0, summary
        assert summary["tok_per_s"] > 0 and summary["p99_s"] > 0, summary
        assert 0 < summary["acceptance_rate"] <= 1 and summary["tokens_per_forward"] > 1, summary
        url = _read_until(proc, r"GPUStack UI: (http://127\.0\.0\.1:\d+)/", 10, seen).group(1)
        user, password = _read_until(proc, r"Admin login: (\S+) / (\S+)", 10, seen).groups()
        _read_until(proc, r"press Ctrl-C", 10, seen)
        assert "backend_registration=enabled" in "".join(seen)

        page = httpx.get(f"{url}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text.lower()
        status = httpx.get(f"{url}/v2/dspark/status", auth=(user, password), timeout=10)
        assert status.status_code == 200, status.text
        assert status.json()["features"]["backend_registration"]["state"] == "enabled"
        workers = httpx.get(f"{url}/v2/workers", auth=(user, password), timeout=10).json()["items"]
        assert [w["labels"].get("role") for w in workers] == ["json-inference"]
        instances = httpx.get(f"{url}/v2/model-instances", auth=(user, password), timeout=10).json()["items"]
        assert [i["state"] for i in instances] == ["running", "running"]
        names = tuple(i["name"] for i in instances)  # GPUStack names each replica's containers after it
        ours = {n for n in _container_names(config.for_run(state_dir / "containers")) if n.startswith(names)}
        assert len(ours) >= 2, ours  # pause + run container per replica, in the demo's own store

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0
        rest = proc.stdout.read()
        assert "everything it started is gone" in rest
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=3)
        assert not state_dir.exists()
        assert not _processes_mentioning(state_dir)  # no replica, conmon or podman left
    finally:
        if proc.poll() is None:  # a failed assertion: let the demo clean up (containers) first
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=180)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
