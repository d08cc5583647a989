"""Metrics end to end: a real `dspark-serve` replica (real vLLM on CPU, draft-model speculation)
and a test stand-in replica that answers invalid JSON, both behind a real GPUStack server and
its real CPU worker (instances pointed at them by hand: no container runtime here).

Checked: the replica's `dspark_*` families on vLLM's /metrics change with traffic; the
server exporter's format-check counters count good replies and the stand-in's broken ones
(non-streamed and streamed, not-JSON and schema mismatch); GPUStack's own worker scrapes the
DSpark replica and re-exports it with model labels; `gpustack-dspark bench` end to end."""

import json
import re
import subprocess

import httpx
import pytest

from gpustack_dspark import backend
from gpustack_dspark.devstack.processes import venv_bin
from gpustack_dspark.devstack.replica import DRAFT_MODEL, SERVED_NAME, start_replica
from tests.conftest import dspark_status, wait_for
from tests.support.stand_in_replica import BROKEN_JSON, StandInReplica

pytestmark = pytest.mark.integration

BROKEN_MODEL = "broken-json"
SCHEMA = {"type": "object", "properties": {"user_id": {"type": "integer"}}, "required": ["user_id"]}
JSON_SCHEMA_FORMAT = {"type": "json_schema", "json_schema": {"name": "u", "schema": SCHEMA}}


def sample(text: str, name: str, **labels) -> float:
    """The sum of a family's samples whose labels include `labels` (0 when none)."""
    total = 0.0
    for line in text.splitlines():
        match = re.match(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (\S+)$", line)
        if not match or match.group(1) != name:
            continue
        found = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(3) or ""))
        if all(found.get(k) == str(v) for k, v in labels.items()):
            total += float(match.group(4))
    return total


class Stack:
    def __init__(self, server, api, worker, replica, broken):
        self.server, self.api, self.worker, self.replica, self.broken = server, api, worker, replica, broken
        self.headers = {"Authorization": f"Bearer {api.api_key}"}

    def chat(self, model, stream=False, **body):
        body = {"model": model, "max_tokens": 64, "temperature": 0,
                "messages": [{"role": "user", "content": "Create an order record for user 7: buy 2.5."}], **body}
        if stream:
            with httpx.stream("POST", f"{self.server.url}/v1/chat/completions", headers=self.headers,
                              json={**body, "stream": True}, timeout=120) as response:
                text = response.read().decode()
            assert response.status_code == 200, text
            return "".join((json.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                           for line in text.splitlines() if line.startswith("data: {"))
        response = httpx.post(f"{self.server.url}/v1/chat/completions", headers=self.headers, json=body, timeout=120)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["message"]["content"]

    def server_metrics(self) -> str:
        return httpx.get(f"http://127.0.0.1:{self.server.metrics_port}/metrics", timeout=10).text

    def replica_metrics(self) -> str:
        return httpx.get(f"{self.replica.base_url}/metrics", timeout=10).text


@pytest.fixture(scope="module")
def stack(shared_stack, tmp_path_factory):
    """This module's own replica (draft-model speculation) and a stand-in answering broken JSON,
    behind the shared platform's server and worker (tests/integration/shared_stack.py)."""
    base = tmp_path_factory.mktemp("observability")
    replica = start_replica(base / "replica.log", ["--enable-dspark", "--dspark-draft-model", str(DRAFT_MODEL),
                                                   "--dspark-warmup-requests", "2"])
    broken = StandInReplica(BROKEN_MODEL, base_s=0.01, chunks=3).start()
    broken.reply_content = BROKEN_JSON
    try:
        server, api = shared_stack.gpustack()
        worker, _ = shared_stack.json_worker()
        replica.wait_ready(420)
        with shared_stack.models_on(base, {SERVED_NAME: ([replica.port], 180), BROKEN_MODEL: ([broken.port], 60)}):
            yield Stack(server, api, worker, replica, broken)
    finally:
        broken.stop()
        replica.stop()


def test_replica_metrics_appear_and_change_after_traffic(stack):
    before = stack.replica_metrics()
    assert sample(before, "dspark_warmup_state", model_name=SERVED_NAME, phase="ready") == 1
    assert sample(before, "dspark_warmup_state", model_name=SERVED_NAME, phase="warming") == 0
    assert sample(before, "dspark_warmup_duration_seconds", model_name=SERVED_NAME) > 0
    assert sample(before, "dspark_warmup_requests_total", outcome="succeeded") == 2
    assert 'dspark_replica_info{enabled="true"' in before and 'method="draft_model"' in before
    requests_before = sample(before, "dspark_requests_total", model_name=SERVED_NAME)
    drafted_before = sample(before, "vllm:spec_decode_num_draft_tokens_total")
    for i in range(3):
        json.loads(stack.chat(SERVED_NAME, stream=bool(i % 2)))  # no format: the replica makes it JSON
    after = stack.replica_metrics()
    assert sample(after, "dspark_requests_total", model_name=SERVED_NAME, action="json_injected") >= 3
    assert sample(after, "dspark_requests_total", model_name=SERVED_NAME) == requests_before + 3
    assert sample(after, "vllm:spec_decode_num_draft_tokens_total") > drafted_before
    assert sample(after, "dspark_schema_violations_total", model_name=SERVED_NAME) == 0


def test_server_exporter_counts_checked_json_replies(stack):
    before = stack.server_metrics()
    checked = sample(before, "dspark_json_responses_checked_total", model_name=SERVED_NAME, result="ok")
    json.loads(stack.chat(SERVED_NAME, response_format=JSON_SCHEMA_FORMAT))
    json.loads(stack.chat(SERVED_NAME, stream=True, response_format={"type": "json_object"}))
    stack.chat(SERVED_NAME)  # a JSON-only model served as JSON: checked too
    # The server counts a reply and releases its in-flight slot as the response ends, which can
    # come a moment after the client has read the last byte (a loaded machine): read once settled.
    def settled():
        metrics = stack.server_metrics()
        done = sample(metrics, "dspark_json_responses_checked_total", model_name=SERVED_NAME, result="ok")
        return metrics if done >= checked + 3 and sample(metrics, "dspark_routing_in_flight_requests") == 0 else None

    after = wait_for(settled, 15, "the three replies counted and released")
    assert sample(after, "dspark_json_responses_checked_total", model_name=SERVED_NAME, result="ok") == checked + 3
    assert sample(after, "dspark_json_format_errors_total", model_name=SERVED_NAME) == 0
    assert sample(after, "dspark_routing_decisions_total", decision="json") >= 2
    assert sample(after, "dspark_routing_in_flight_requests") == 0


def test_broken_replica_increments_the_format_error_counter(stack):
    before = stack.server_metrics()
    not_json = sample(before, "dspark_json_format_errors_total", model_name=BROKEN_MODEL, reason="not_json")
    mismatch = sample(before, "dspark_json_format_errors_total", model_name=BROKEN_MODEL, reason="schema_mismatch")
    stack.broken.reply_content = BROKEN_JSON
    assert stack.chat(BROKEN_MODEL, response_format={"type": "json_object"}) == BROKEN_JSON  # delivered as is
    assert stack.chat(BROKEN_MODEL, stream=True, response_format={"type": "json_object"}) == BROKEN_JSON
    stack.broken.reply_content = '{"user_id": "seven"}'
    stack.chat(BROKEN_MODEL, stream=True, response_format=JSON_SCHEMA_FORMAT)
    stack.chat(BROKEN_MODEL, response_format={"type": "json_object"})  # valid JSON, no schema: ok
    after = stack.server_metrics()
    assert sample(after, "dspark_json_format_errors_total", model_name=BROKEN_MODEL, reason="not_json") == not_json + 2
    assert sample(after, "dspark_json_format_errors_total", model_name=BROKEN_MODEL,
                  reason="schema_mismatch") == mismatch + 1
    instance = stack.api.items("/v2/model-instances")
    broken_ids = {str(i["id"]) for i in instance if i["model_name"] == BROKEN_MODEL}
    assert sample(after, "dspark_json_format_errors_total", model_name=BROKEN_MODEL,
                  model_instance_id=next(iter(broken_ids))) >= 3
    checks = dspark_status(stack.server, stack.api.api_key)["routing"]["json_format_checks"]
    assert checks["not_json"] >= 2 and checks["schema_mismatch"] >= 1


def test_gpustack_worker_scrapes_the_dspark_replica(stack):
    status = dspark_status(stack.server, stack.api.api_key)
    assert status["features"]["metrics_collection"]["state"] == "enabled"
    config = httpx.get(f"{stack.server.url}/v2/metrics/config", headers=stack.headers, timeout=10).json()
    assert "vllm:num_requests_running" in config["runtime_mapping"][backend.BACKEND_NAME]["*"]
    exporter = f"http://127.0.0.1:{stack.worker.metrics_port}"

    def scraped():
        raw = httpx.get(f"{exporter}/metrics/raw", timeout=10).text
        return raw if sample(raw, "dspark_warmup_state", model_name=SERVED_NAME, phase="ready") == 1 else None

    raw = wait_for(scraped, 90, "GPUStack's worker to re-export the replica's metrics", interval_s=2)
    assert sample(raw, "vllm:spec_decode_num_draft_tokens_total", model_name=SERVED_NAME) > 0
    assert 'model_instance_name="tiny-order-' in raw
    unified = httpx.get(f"{exporter}/metrics", timeout=10).text
    assert sample(unified, "gpustack:spec_decode_draft_tokens_total", model_name=SERVED_NAME) > 0
    assert sample(unified, "dspark_warmup_state", model_name=SERVED_NAME, phase="ready") == 1


def test_bench_end_to_end_replica_and_gpustack_side_by_side(stack):
    result = subprocess.run([
        venv_bin("gpustack-dspark"), "bench", "--compare", stack.replica.base_url, f"{stack.server.url}/v1",
        "--api-key", stack.api.api_key, "--model", SERVED_NAME, "--requests", "12", "--concurrency", "4",
        "--max-tokens", "96", "--stream", "--warmup", "1", "--json", "--local-only"],
        capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    replica, gpustack = out["targets"]
    for figures in (replica, gpustack):
        assert figures["requests"] == 12 and figures["failed"] == 0, figures["errors"]
        assert figures["format_error_rate"] == 0
        assert figures["output_tok_s"] > 0 and figures["request_s"] > 0 and figures["output_tokens"] >= 12
        assert 0 < figures["ttft_p50_s"] <= figures["ttft_p99_s"]
        assert 0 < figures["latency_p50_s"] <= figures["latency_p90_s"] <= figures["latency_p99_s"] < 600
    assert 0 <= replica["acceptance_rate"] <= 1 and replica["drafted_tokens"] > 0
    assert 1 <= replica["tokens_per_forward"] <= 1 + 8
    assert gpustack["acceptance_rate"] is None  # GPUStack's API port has no vLLM counters: says so
    assert out["ratios_b_over_a"]["output_tok_s"] > 0
