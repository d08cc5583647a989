"""Metrics and the JSON format check: the pure parts and the collectors' output."""

import json

from prometheus_client import CollectorRegistry, generate_latest

from gpustack_dspark.knobs import DSparkKnobs
from gpustack_dspark.observe.metrics_config import DSPARK_FAMILIES, with_dspark_runtime
from gpustack_dspark.routing import format_check as fc
from gpustack_dspark.routing.format_middleware import FormatStats
from gpustack_dspark.routing.inflight import InFlightTracker
from gpustack_dspark.routing.intent import requested_schema
from gpustack_dspark.routing.metrics import RoutingCollector
from gpustack_dspark.translate import LaunchPlan
from gpustack_dspark.worker import metrics as worker_metrics, state as worker_state

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _reply(content, finish="stop"):
    return json.dumps({"choices": [{"index": 0, "finish_reason": finish,
                                    "message": {"role": "assistant", "content": content}}]}).encode()


def _sse(pieces, finish="stop"):
    events = [{"choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]} for p in pieces]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"


def test_non_streamed_replies():
    assert fc.check_body(_reply('{"n": 1}'), SCHEMA) == fc.OK
    assert fc.check_body(_reply('{"n": "one"}'), SCHEMA) == fc.SCHEMA_MISMATCH
    assert fc.check_body(_reply('{"n": 1'), SCHEMA) == fc.NOT_JSON
    assert fc.check_body(_reply('{"n": 1'), None) == fc.NOT_JSON
    assert fc.check_body(_reply('{"n": "x"}'), None) == fc.OK  # json_object: parse only
    assert fc.check_body(_reply('{"n": ', finish="length"), SCHEMA) == fc.TRUNCATED
    assert fc.check_body(b"<html>", SCHEMA) == fc.NOT_JSON
    assert fc.check_body(b'{"object": "list"}', SCHEMA) == fc.UNCHECKED
    assert fc.check_body(_reply('{"n": 1}'), {"type": 12}) == fc.OK  # unusable schema: parse only
    assert fc.check_body(b" " * (fc.MAX_BODY_BYTES + 1)) == fc.UNCHECKED


PRICE = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]}


def test_the_format_check_judges_multiple_of_on_the_decimal_text():
    # Held-out fault: 37.3 for multipleOf 0.01 (37.3 / 0.01 = 3729.9999999999995 in floats).
    for good in ("37.3", "-37.3", "1e2", "0", "7", "12345678901234567890.12", "1e400"):
        assert fc.check_body(_reply('{"price": %s}' % good), PRICE) == fc.OK, good
    assert fc.check_body(_reply('{"price": 37.305}'), PRICE) == fc.SCHEMA_MISMATCH
    check = fc.StreamCheck(PRICE)
    check.feed(_sse(['{"price": 3', '7.', '3}']))
    assert check.result() == fc.OK
    check = fc.StreamCheck(PRICE)
    check.feed(_sse(['{"price": 3', '7.30', '5}']))
    assert check.result() == fc.SCHEMA_MISMATCH


def test_the_format_middleware_counts_an_exact_multiple_as_ok():
    """The proxy's check path: FormatCheckMiddleware inside a routing slot, around a stand-in
    for GPUStack's proxy answering a fixed reply, streamed and not."""
    import asyncio

    from gpustack_dspark.routing.context import enter_slot, leave_slot
    from gpustack_dspark.routing.format_middleware import FormatCheckMiddleware

    def run(content, stream):
        async def proxy(scope, receive, send):
            kind = b"text/event-stream" if stream else b"application/json"
            await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", kind)]})
            await send({"type": "http.response.body", "body": _sse([content[:5], content[5:]]).encode() if stream
                        else _reply(content)})

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            pass

        async def one():
            slot, token = enter_slot()
            slot.json_intent, slot.model, slot.instance_id, slot.schema = True, "orders", 1, PRICE
            try:
                await FormatCheckMiddleware(proxy, stats)(
                    {"type": "http", "method": "POST", "path": "/v1/chat/completions"}, receive, send)
            finally:
                leave_slot(token)

        asyncio.run(one())

    stats = FormatStats()
    for stream in (False, True):
        run('{"price": 37.3}', stream)
        run('{"price": 37.305}', stream)
    assert stats.snapshot() == {("orders", "1", fc.OK): 2, ("orders", "1", fc.SCHEMA_MISMATCH): 2}


def test_streamed_replies_split_anywhere():
    text = _sse(['{"n"', ': 4', '2}'])
    for size in (1, 7, 50, len(text)):
        check = fc.StreamCheck(SCHEMA)
        for i in range(0, len(text), size):
            check.feed(text[i:i + size].encode())
        assert check.result() == fc.OK, size
    check = fc.StreamCheck(SCHEMA)
    check.feed(_sse(['{"n": ', '"x"}']))
    assert check.result() == fc.SCHEMA_MISMATCH
    check = fc.StreamCheck(None)
    check.feed(_sse(['{"n": ', '1']))
    assert check.result() == fc.NOT_JSON
    check = fc.StreamCheck(SCHEMA)
    check.feed(_sse(['{"n": '], finish="length"))
    assert check.result() == fc.TRUNCATED
    check = fc.StreamCheck(None)  # a stream the proxy ended with an error event is not judged
    check.feed('data: {"choices": [{"index": 0, "delta": {"content": "{"}}]}\n\ndata: {"error": {"code": 503}}\n\n')
    assert check.result() == fc.UNCHECKED


def test_stream_bounds():
    check = fc.StreamCheck(None)
    check.feed(_sse(["x" * (fc.MAX_CHOICE_CHARS + 1)]))
    assert check.result() == fc.UNCHECKED
    two = fc.StreamCheck(None)
    two.feed('data: {"choices": [{"index": 0, "delta": {"content": "{}"}, "finish_reason": "stop"},'
             ' {"index": 1, "delta": {"content": "{"}, "finish_reason": "stop"}]}\n\n')
    assert two.result() == fc.NOT_JSON  # the worst choice counts


def test_requested_schema():
    assert requested_schema({"response_format": {"type": "json_schema", "json_schema": {"schema": SCHEMA}}}) == SCHEMA
    assert requested_schema({"response_format": {"type": "json_object"}}) is None
    assert requested_schema({"structured_outputs": {"json": SCHEMA}}) == SCHEMA
    assert requested_schema({"guided_json": json.dumps(SCHEMA)}) == SCHEMA
    assert requested_schema({"extra_body": {"guided_json": SCHEMA}}) == SCHEMA
    assert requested_schema({"guided_json": "not json"}) is None
    assert requested_schema(None) is None


def _render(collector) -> str:
    registry = CollectorRegistry()
    registry.register(collector)
    return generate_latest(registry).decode()


def test_routing_collector_exports_format_checks():
    stats = FormatStats()
    stats.record("orders", 3, fc.OK)
    stats.record("orders", 3, fc.NOT_JSON)
    stats.record("orders", 4, fc.SCHEMA_MISMATCH)
    text = _render(RoutingCollector(InFlightTracker(), dict, dict, stats.snapshot))
    assert 'dspark_json_responses_checked_total{model_instance_id="3",model_name="orders",result="ok"} 1.0' in text
    assert 'dspark_json_format_errors_total{model_instance_id="3",model_name="orders",reason="not_json"} 1.0' in text
    assert 'dspark_json_format_errors_total{model_instance_id="4",model_name="orders",reason="schema_mismatch"} 1.0' in text
    assert 'reason="ok"' not in text
    assert stats.totals()[fc.NOT_JSON] == 1


def _state(phase=worker_state.READY):
    plan = LaunchPlan(vllm_argv=[], enabled=True, method="draft_model", speculative_length=4, grammar_mode="json")
    state = worker_state.WorkerState(plan=plan, knobs=DSparkKnobs(), served_model_name="tiny")
    state.warmup.started_at, state.warmup.finished_at, state.warmup.succeeded = 100.0, 102.5, 4
    state.count("json_injected")
    state.count("schema_violations")
    state.count("second_attempts")
    state.count("second_attempts")
    state.phase = phase
    return state


def test_worker_families_and_registered_collectors(monkeypatch):
    from prometheus_client.core import CounterMetricFamily

    monkeypatch.setattr(worker_state, "_current", _state())
    monkeypatch.setattr(worker_metrics, "_extra", [])

    def forced():
        family = CounterMetricFamily("dspark_forced_tokens_proposed", "test", labels=["model_name"])
        family.add_metric([worker_metrics.model_label()], 7)
        yield family

    def broken():
        raise RuntimeError("boom")

    worker_metrics.register_collector(broken)
    worker_metrics.register_collector(forced)
    text = _render(worker_metrics.DSparkWorkerCollector())
    assert 'dspark_warmup_state{model_name="tiny",phase="ready"} 1.0' in text
    assert 'dspark_warmup_state{model_name="tiny",phase="warming"} 0.0' in text
    assert 'dspark_warmup_duration_seconds{model_name="tiny"} 2.5' in text
    assert 'dspark_warmup_requests_total{model_name="tiny",outcome="succeeded"} 4.0' in text
    assert 'dspark_requests_total{action="json_injected",model_name="tiny"} 1.0' in text
    assert 'dspark_schema_violations_total{model_name="tiny"} 1.0' in text
    assert 'dspark_grammar_requests_total{model_name="tiny",what="second_attempt"} 2.0' in text
    assert 'dspark_grammar_requests_total{model_name="tiny",what="llguidance"} 0.0' in text
    assert 'dspark_replica_info{enabled="true",grammar_mode="json",method="draft_model"' in text
    assert 'dspark_forced_tokens_proposed_total{model_name="tiny"} 7.0' in text  # after the broken one


def test_worker_families_before_warmup(monkeypatch):
    state = _state(worker_state.LOADING)
    state.warmup.started_at = None
    monkeypatch.setattr(worker_state, "_current", state)
    text = _render(worker_metrics.DSparkWorkerCollector())
    assert 'dspark_warmup_state{model_name="tiny",phase="loading"} 1.0' in text
    assert "dspark_warmup_duration_seconds" not in text


def test_metrics_config_gets_a_dspark_runtime():
    config = {"gpustack_metrics": {"gpustack:x": {"type": "Gauge"}},
              "runtime_mapping": {"vLLM": {"*": {"vllm:num_requests_running": "gpustack:num_requests_running"},
                                           "<0.11.0": {"vllm:a": "gpustack:a"}}}}
    out = with_dspark_runtime(config, "DSpark-custom")
    entry = out["runtime_mapping"]["DSpark-custom"]
    assert entry["*"]["vllm:num_requests_running"] == "gpustack:num_requests_running"
    assert entry["<0.11.0"] == {"vllm:a": "gpustack:a"}
    assert all(entry["*"][name] == name for name in DSPARK_FAMILIES)
    assert set(DSPARK_FAMILIES) <= set(out["gpustack_metrics"])
    assert "DSpark-custom" not in config["runtime_mapping"]  # input untouched
    own = {"runtime_mapping": {"DSpark-custom": {"*": {}}}}
    assert with_dspark_runtime(own, "DSpark-custom") is own  # the operator's entry wins
    assert with_dspark_runtime({"x": 1}, "DSpark-custom") == {"x": 1}


def test_gpustack_builtin_metrics_config_still_has_the_shape_we_extend():
    from gpustack.utils.metrics import get_builtin_metrics_config

    config = get_builtin_metrics_config()
    out = with_dspark_runtime(config, "DSpark-custom")
    star = out["runtime_mapping"]["DSpark-custom"]["*"]
    assert star["vllm:spec_decode_num_draft_tokens"] == "gpustack:spec_decode_draft_tokens"
    assert star["vllm:num_requests_running"] == "gpustack:num_requests_running"
