"""`gpustack-dspark bench` as users run it (the console script, a subprocess) against test
stand-in replicas on loopback: figures, --compare, --csv, format errors, clean errors for
auth failures and endpoints that are not OpenAI-compatible. The end-to-end run against a
real vLLM replica is in test_observability.py."""

import http.server
import json
import subprocess
import threading

import pytest

from gpustack_dspark.devstack.processes import venv_bin
from tests.support.stand_in_replica import BROKEN_JSON, StandInReplica

pytestmark = pytest.mark.integration

ORDER = '{"user_id": 1, "action": "buy", "amount": 2.5, "timestamp": "2026-01-01T00:00:00Z"}'


def bench(*args, timeout=120):
    return subprocess.run([venv_bin("gpustack-dspark"), "bench", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def replicas():
    good = StandInReplica("good", base_s=0.02, chunks=4).start()
    broken = StandInReplica("broken", base_s=0.01, chunks=4).start()
    good.reply_content, broken.reply_content = ORDER, BROKEN_JSON
    yield good, broken
    good.stop()
    broken.stop()


def test_compare_json_figures_and_format_errors(replicas):
    good, broken = replicas
    result = bench("--compare", f"http://127.0.0.1:{good.port}/v1", f"http://127.0.0.1:{broken.port}",
                   "--requests", "12", "--concurrency", "3", "--stream", "--warmup", "2", "--json", "--local-only")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    a, b = out["targets"]
    assert (a["model"], b["model"]) == ("good", "broken")
    assert a["requests"] == b["requests"] == 12 and a["failed"] == b["failed"] == 0
    assert a["format_error_rate"] == 0 and b["format_error_rate"] == 1
    for figures in (a, b):
        assert figures["output_tok_s"] > 0 and figures["request_s"] > 0
        assert 0 < figures["ttft_p50_s"] <= figures["latency_p50_s"] <= figures["latency_p90_s"] <= figures["latency_p99_s"]
        assert figures["acceptance_rate"] is None and "no vLLM speculative-decoding counters" in figures["metrics_source"]
    assert out["ratios_b_over_a"]["output_tok_s"] > 0
    assert good.stats.served >= 14  # warmup requests too


def test_extraction_requests_are_scored_against_their_own_records(replicas):
    """--workload extraction: each reply judged by its own task's schema and record. The stand-in
    answers every request with an order record: invalid under each family's schema, no field right."""
    good, _ = replicas
    result = bench("--server", f"http://127.0.0.1:{good.port}", "--workload", "extraction", "--seed", "7",
                   "--requests", "6", "--concurrency", "2", "--json")
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    figures, = out["targets"]
    assert out["settings"]["workload"].startswith("extraction (six families, seed 7")
    assert figures["requests"] == 6 and figures["format_errors"] == 6 and figures["field_accuracy"] == 0
    assert figures["fields_total"] > 30 and figures["fields_right"] == 0


def test_duration_mode_and_csv(replicas):
    good, _ = replicas
    result = bench("--server", f"http://127.0.0.1:{good.port}", "--duration", "1", "--concurrency", "2", "--csv")
    assert result.returncode == 0, result.stderr
    header, row = result.stdout.splitlines()
    figures = dict(zip(header.split(","), row.split(",")))
    assert int(figures["requests"]) > 2 and float(figures["wall_s"]) < 10


def test_auth_failure(replicas):
    good, _ = replicas
    good.api_key = "right"
    try:
        wrong = bench("--server", f"http://127.0.0.1:{good.port}", "--api-key", "wrong", "--requests", "1")
        assert wrong.returncode == 1
        assert "rejected the request (401, authentication): check --api-key" in wrong.stderr
        right = bench("--server", f"http://127.0.0.1:{good.port}", "--api-key", "right", "--requests", "2")
        assert right.returncode == 0, right.stderr
    finally:
        good.api_key = None


def test_endpoint_that_is_not_openai_compatible():
    class Html(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b"<html>hello</html>"
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Html)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        result = bench("--server", f"http://127.0.0.1:{server.server_address[1]}", "--requests", "1")
    finally:
        server.shutdown()
    assert result.returncode == 1
    assert "is not an OpenAI-compatible endpoint: GET /v1/models -> 200 (text/html)" in result.stderr


def test_unknown_model(replicas):
    good, _ = replicas
    result = bench("--server", f"http://127.0.0.1:{good.port}", "--model", "nope", "--requests", "1")
    assert result.returncode == 1 and "does not serve model 'nope'; it serves: good" in result.stderr
