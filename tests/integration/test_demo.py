"""The README's demo command's main job: a working GPUStack UI with the plugin, clean Ctrl-C."""

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from gpustack_dspark.devstack.postgres import free_port

pytestmark = pytest.mark.integration


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


def test_demo_serves_the_ui_with_the_plugin_and_stops_cleanly_on_ctrl_c():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "gpustack_dspark.devstack", "demo", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        state_dir = Path(_read_until(proc, r"\[demo\] state in (\S+)", 30, seen).group(1))
        url = _read_until(proc, r"GPUStack UI: (http://127\.0\.0\.1:\d+)/", 300, seen).group(1)
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

        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=90) == 0
        rest = proc.stdout.read()
        assert "everything it started is gone" in rest
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=3)
        assert not state_dir.exists()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
