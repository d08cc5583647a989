"""The README's demo command: the whole container path up to "serving" (UI, admin login,
a JSON benchmark line), then Ctrl-C the way the reported leak had it — `make demo` piped
through a line-stamping reader, SIGINT to the whole job so the reader dies with it (tee in
tmux) — and nothing left: no process, no port, no container. The other ways to stop it are
in test_demo_stops.py."""

import json
import signal
from pathlib import Path

import httpx
import pytest

from gpustack_dspark.devstack import podman as podman_host
from gpustack_dspark.devstack.ports import free_port

from tests.integration.demo_support import PipedDemo, assert_nothing_left

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2700)]  # may include the cold image build


def _container_names(config):
    return set(config.run("ps", "-a", "--format", "{{.Names}}").stdout.split())


def test_demo_serves_warm_replicas_behind_the_ui_and_a_piped_ctrl_c_removes_everything(tmp_path):
    config = podman_host.prepare()  # fails here, with the reason, where Podman cannot work
    port = free_port()
    # Four requests, one batch at the benchmark's concurrency 4: the line sooner (six took 81 s
    # of a clean-clone CI run); every family is answered in test_real_model.py.
    demo = PipedDemo(tmp_path, port, "--bench-requests 4")
    try:
        demo.wait_for(r"\[demo\] state in (\S+)", 60)
        state_dir = demo.state_dir
        # Cold image build included: bounded generously, the cached path takes ~2 minutes.
        summary = json.loads(demo.wait_for(r"\[demo\] benchmark: (\{.*\})", 1800).group(1))
        assert summary["failed"] == 0 and summary["requests"] > 0 and summary["format_errors"] == 0, summary
        assert summary["tok_per_s"] > 0 and summary["p99_s"] > 0, summary
        assert 0 < summary["acceptance_rate"] <= 1 and summary["tokens_per_forward"] > 1, summary
        # The real model on fresh extraction requests: each finished, most fields copied right.
        assert summary["workload"] == "extraction" and summary["finished"]["stop"] == summary["requests"], summary
        right, total = map(int, summary["fields_right"].split("/"))
        assert total > 0 and right / total >= 0.4, summary
        url = demo.wait_for(r"GPUStack UI: (http://127\.0\.0\.1:\d+)/", 10).group(1)
        user, password = demo.wait_for(r"Admin login: (\S+) / (\S+)", 10).groups()
        # The printed request, answered once by the demo: a sensible record.
        reply = json.loads(demo.wait_for(r"  -> (\{.*\})", 120).group(1))
        assert (reply["customer"], reply["city"], reply["quantity"], reply["date"]) == (
            "Anna Berg", "Oslo", 3, "2026-03-14"), reply
        demo.wait_for(r"press Ctrl-C", 10)
        assert "backend_registration=enabled" in demo.output()
        assert url == f"http://127.0.0.1:{port}"

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
        ports = demo.ports()
        assert port in ports and len(ports) > 4, ports  # the UI, PostgreSQL, the worker, both replicas, ...

        demo.signal_job(signal.SIGINT)  # Ctrl-C in the terminal: make, the demo and the reader
        took = demo.wait_demo_gone(180)
        print(f"[demo] gone {took:.1f}s after Ctrl-C")
        assert_nothing_left(demo, ports, "SIGINT")  # no replica, conmon, podman, server or PostgreSQL
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/healthz", timeout=3)
    finally:
        demo.cleanup()  # a failed assertion: the demo still removes its containers first
