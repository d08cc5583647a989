"""The worker's pure parts: the JSON-default rewrite, dspark_stats, the server-config YAML
mapping, launcher argument splitting and warmup request building."""

import json

import pytest

from gpustack_dspark.knobs import KnobError
from gpustack_dspark.worker import json_default, sampling_check
from gpustack_dspark.worker.json_default import CHAT_PATH, COMPLETIONS_PATH, RequestRejected, rewrite
from gpustack_dspark.worker.middleware import dspark_stats
from gpustack_dspark.worker.serve import split_launcher_args, split_model
from gpustack_dspark.worker.server_config import config_to_argv
from gpustack_dspark.worker.warmup import BUILTIN_PROMPTS, warmup_bodies

MSG = {"messages": [{"role": "user", "content": "hi"}]}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}


def test_plain_chat_request_gets_json_object_or_the_configured_schema():
    r = rewrite(CHAT_PATH, dict(MSG), None)
    assert (r.action, r.body["response_format"]) == ("injected", {"type": "json_object"})
    r = rewrite(CHAT_PATH, dict(MSG), SCHEMA)
    assert r.body["response_format"]["type"] == "json_schema"
    assert r.body["response_format"]["json_schema"]["schema"] == SCHEMA and r.schema == SCHEMA


def test_completions_get_structured_outputs():
    r = rewrite(COMPLETIONS_PATH, {"prompt": "x"}, None)
    assert r.body["structured_outputs"] == {"json_object": True}
    assert rewrite(COMPLETIONS_PATH, {"prompt": "x"}, SCHEMA).body["structured_outputs"] == {"json": SCHEMA}


@pytest.mark.parametrize("extra", [
    {"response_format": {"type": "text"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": SCHEMA}}},
    {"structured_outputs": {"regex": "[a-z]+"}},
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
])
def test_requests_asking_for_something_else_are_left_alone(extra):
    body = {**MSG, **extra}
    r = rewrite(CHAT_PATH, body, SCHEMA)
    assert r.action == "kept" and r.body == body


def test_legacy_guided_fields_are_converted():
    r = rewrite(CHAT_PATH, {**MSG, "guided_json": SCHEMA, "guided_decoding_backend": "outlines"}, None)
    assert r.action == "converted"
    assert r.body["structured_outputs"] == {"json": SCHEMA} and "guided_json" not in r.body
    assert "guided_decoding_backend" not in r.body and r.schema == SCHEMA
    r = rewrite(CHAT_PATH, {**MSG, "guided_choice": ["a", "b"]}, None)
    assert r.body["structured_outputs"] == {"choice": ["a", "b"]}
    r = rewrite(CHAT_PATH, {**MSG, "guided_regex": "x+", "guided_whitespace_pattern": " "}, None)
    assert r.body["structured_outputs"] == {"regex": "x+", "whitespace_pattern": " "}
    # only a backend hint: nothing to convert, the JSON default still applies
    r = rewrite(CHAT_PATH, {**MSG, "guided_decoding_backend": "xgrammar"}, None)
    assert r.action == "injected" and "guided_decoding_backend" not in r.body


@pytest.mark.parametrize("body,message", [
    ({**MSG, "guided_json": SCHEMA, "response_format": {"type": "json_object"}}, "cannot be combined"),
    ({**MSG, "guided_json": SCHEMA, "guided_regex": "x"}, "only one of"),
    ({**MSG, "guided_whitespace_pattern": " "}, "needs one of"),
])
def test_ambiguous_legacy_requests_are_refused(body, message):
    with pytest.raises(RequestRejected, match=message):
        rewrite(CHAT_PATH, body, None)


def test_requested_schema():
    assert json_default.requested_schema({"structured_outputs": {"json": SCHEMA}}) == SCHEMA
    assert json_default.requested_schema({"response_format": {"type": "json_object"}}) is None


def test_dspark_stats_from_vllm_per_request_metrics():
    response = {"metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.5, "num_spec_steps": 10, "num_accepted_draft_tokens": 15,
        "num_draft_tokens": 40}}}
    assert dspark_stats(response) == {"acceptance_rate": 0.375, "accepted_tokens": 15, "drafted_tokens": 40,
                                      "verify_steps": 10, "tokens_per_forward": 2.5}
    assert dspark_stats({"metrics": None}) is None and dspark_stats({}) is None


def test_server_config_yaml_maps_onto_knobs_and_vllm_arguments():
    doc = {
        "model": {"path": "/models/m", "name": "orders"},
        "server": {"host": "10.0.0.5", "port": 8000},
        "engine": {"max_model_len": 8192, "continuous_batching": {"max_batch_size": 64},
                   "speculative_decoding": {"enabled": True, "strategy": "dspark", "speculative_length": 6},
                   "grammar": "json"},
        "resources": {"gpu_memory_utilization": 0.9},
        "enable_metrics": False,
    }
    assert config_to_argv(doc) == [
        "/models/m", "--served-model-name=orders", "--host=10.0.0.5", "--port=8000", "--max-model-len=8192",
        "--max-num-seqs=64", "--enable-dspark", "--dspark-method=dspark", "--dspark-speculative-length=6",
        "--dspark-grammar-mode=json", "--gpu-memory-utilization=0.9", "--disable-log-stats"]


def test_server_config_unknown_keys_are_errors_with_a_suggestion():
    with pytest.raises(KnobError) as e:
        config_to_argv({"engine": {"continuous_batching": {"max_batch_sise": 8}}}, source="--config c.yaml")
    assert "engine.continuous_batching.max_batch_sise" in str(e.value)
    assert "did you mean max_batch_size?" in str(e.value)
    with pytest.raises(KnobError, match="true\\|false"):
        config_to_argv({"engine": {"speculative_decoding": {"enabled": "yes"}}})


def test_launcher_argument_splitting():
    assert split_launcher_args(["m", "--print-vllm-args", "--config=c.yaml", "--x"]) == (True, "c.yaml", ["m", "--x"])
    assert split_model(["/models/m", "--host", "h"]) == ("/models/m", ["--host", "h"])
    assert split_model(["--host", "h", "--model", "/m"]) == ("/m", ["--host", "h"])
    assert split_model(["--host", "h"]) == (None, ["--host", "h"])


def test_warmup_bodies_cycle_the_templates():
    bodies = warmup_bodies([], 6)
    assert len(bodies) == 6 and bodies[0]["messages"][0]["content"] == BUILTIN_PROMPTS[0]
    assert bodies[len(BUILTIN_PROMPTS)]["messages"] == bodies[0]["messages"]
    assert all(b["temperature"] == 0 and b["max_tokens"] > 0 for b in bodies)
    own = warmup_bodies([{"messages": [{"role": "user", "content": "x"}], "max_tokens": 5}], 2)
    assert [b["max_tokens"] for b in own] == [5, 5]


def _reply(content, finish="stop"):
    import json as _json

    return {"status": 200}, _json.dumps({"choices": [{"message": {"content": content}, "finish_reason": finish}]}).encode()


def test_replies_that_break_the_schema_are_caught():
    from gpustack_dspark.worker.middleware import ANY_JSON, schema_violation

    pattern = {"type": "object", "properties": {"version": {"type": "string", "pattern": "^[0-9]\\.[0-9]$"}},
               "required": ["version"]}
    assert schema_violation(*_reply('{"version":"1.2"}'), pattern) is None
    assert "at version" in schema_violation(*_reply('{"version":"1.23"}'), pattern)
    assert schema_violation(*_reply('{"version":"1.2'), pattern).startswith("not JSON")
    assert schema_violation(*_reply('{"version":"1.23"}', finish="length"), pattern) is None  # cut by max_tokens
    assert schema_violation(*_reply("[1, 2]"), ANY_JSON) is None
    assert schema_violation(*_reply("hello"), ANY_JSON).startswith("not JSON")
    assert schema_violation(*_reply("hello"), None) is None
    assert schema_violation(*_reply('{"version":"1.23"}'), pattern).tool is None  # the content broke


def test_a_tool_call_violation_names_its_tool():
    import json as _json

    from gpustack_dspark.worker.middleware import schema_violation, tool_check

    tools = [{"type": "function", "function": {"name": "lookup", "strict": True, "parameters": {
        "type": "object", "properties": {"user_id": {"type": "integer"}}, "required": ["user_id"]}}}]
    judge = tool_check({"tools": tools, "tool_choice": "auto"})
    reply = _json.dumps({"choices": [{"finish_reason": "tool_calls", "message": {"content": None, "tool_calls": [
        {"type": "function", "function": {"name": "lookup", "arguments": '{"user_id": "x"}'}}]}}]}).encode()
    violation = schema_violation({"status": 200}, reply, None, judge)
    assert violation and violation.tool == "lookup", violation


PRICE = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]}


def test_the_reply_check_judges_multiple_of_on_the_decimal_text():
    from gpustack_dspark.worker.middleware import schema_violation

    # Held-out fault: 37.3 for multipleOf 0.01 was withheld (37.3 / 0.01 = 3729.9999999999995 in floats).
    for good in ("37.3", "-37.3", "1e2", "0", "7", "12345678901234567890.12"):
        assert schema_violation(*_reply('{"price": %s}' % good), PRICE) is None, good
    assert schema_violation(*_reply('{"price": 37.305}'), PRICE) == "at price: 37.305 is not a multiple of 0.01"


def _completion(middleware, body):
    """One POST /v1/chat/completions through the worker's middleware; (status, JSON answer)."""
    import asyncio

    raw = json.dumps(body).encode()
    sent = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": CHAT_PATH, "headers": [(b"content-length", str(len(raw)).encode())]}
    asyncio.run(middleware(scope, receive, send))
    return sent[0]["status"], json.loads(b"".join(m.get("body", b"") for m in sent[1:]))


def test_the_middleware_serves_an_exact_multiple_and_withholds_a_true_non_multiple(monkeypatch):
    """The replica's real reply path (JSON default with the replica's schema, the check, the
    withheld 500) around a stand-in for vLLM's app that answers a fixed reply."""
    from gpustack_dspark.knobs import DSparkKnobs
    from gpustack_dspark.translate import LaunchPlan
    from gpustack_dspark.worker import state as worker_state
    from gpustack_dspark.worker.middleware import DSparkMiddleware

    replies = []

    async def vllm(scope, receive, send):
        answer = json.dumps({"choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": replies[-1]}}]}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": answer})

    state = worker_state.WorkerState(plan=LaunchPlan(vllm_argv=[], enabled=True, grammar_mode="json"),
                                     knobs=DSparkKnobs(), default_schema=PRICE)
    monkeypatch.setattr(worker_state, "_current", state)
    middleware = DSparkMiddleware(vllm)
    replies.append('{"price": 37.3}')
    status, answer = _completion(middleware, dict(MSG))
    assert status == 200 and answer["choices"][0]["message"]["content"] == '{"price": 37.3}'
    replies.append('{"price": 37.305}')
    status, answer = _completion(middleware, dict(MSG))
    assert status == 500 and answer["error"]["type"] == "SchemaViolationError"
    assert "37.305 is not a multiple of 0.01" in answer["error"]["message"]
    assert state.counters["schema_violations"] == 1 and state.counters["json_injected"] == 2


def test_a_draft_path_vllm_would_read_a_method_from_is_passed_through_a_neutral_alias(tmp_path, monkeypatch):
    # vLLM 0.32 turns method draft_model into dspark when the draft path contains "dspark".
    from pathlib import Path

    from gpustack_dspark.translate import path_method_marker
    from gpustack_dspark.worker import serve

    assert path_method_marker("/models/gpustack-dspark/draft") == "dspark"
    assert path_method_marker("/models/EAGLE3-head") == "eagle3" and path_method_marker("/models/draft") is None
    root = Path(__file__).resolve().parents[2] / "fixtures" / "models"
    marked = tmp_path / "gpustack-dspark-draft"
    marked.symlink_to(root / "tiny-order-draft", target_is_directory=True)
    monkeypatch.setenv("DSPARK_DEVICE", "cpu")
    _, knobs, plan, _, _ = serve.prepare([str(root / "tiny-order-llama"), "--enable-dspark",
                                          "--dspark-draft-model", str(marked)])
    spec = json.loads(plan.vllm_argv[plan.vllm_argv.index("--speculative-config") + 1])
    assert plan.method == "draft_model" and path_method_marker(spec["model"]) is None
    assert Path(spec["model"]).resolve() == (root / "tiny-order-draft").resolve()
    assert any("reads the method from a draft path containing 'dspark'" in n for n in plan.notes)
    assert knobs.draft_model == str(marked)


def test_sampling_parameters_speculation_ignores_are_refused_by_name():
    refused = sampling_check.refused_with_speculation
    assert refused({"min_p": 0.1})[0] == "min_p" and "allowed: 0 or unset" in refused({"min_p": 0.1})[1]
    assert refused({"logit_bias": {"5": -100}})[0] == "logit_bias"
    for fine in ({}, {"min_p": 0}, {"min_p": 0.0}, {"min_p": None}, {"logit_bias": {}}, {"logit_bias": None},
                 {"top_p": 0.9, "top_k": 5, "presence_penalty": 1.0}):
        assert refused(fine) is None, fine
    long = refused({"logit_bias": {str(i): 1 for i in range(100)}})[1]
    assert "..." in long and len(long) < 250


def test_non_streamed_tool_calls_are_judged_when_constrained():
    import json as _json

    from gpustack_dspark.worker.middleware import schema_violation, tool_check

    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {
        "type": "object", "properties": {"user_id": {"type": "integer", "minimum": 1}}, "required": ["user_id"]}}}]

    def reply(arguments, name="lookup"):
        message = {"content": None, "tool_calls": [{"id": "c1", "type": "function",
                                                    "function": {"name": name, "arguments": arguments}}]}
        return {"status": 200}, _json.dumps({"choices": [{"message": message, "finish_reason": "tool_calls"}]}).encode()

    judge = tool_check({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "lookup"}}})
    assert schema_violation(*reply('{"user_id": 3}'), None, judge) is None
    assert "arguments of the call to lookup: at user_id" in schema_violation(*reply('{"user_id": 0}'), None, judge)
    assert schema_violation(*reply('{"user_id": 0}'), None, None) is None  # nothing constrains it: not judged


def test_a_schema_no_document_satisfies_is_a_400_before_vllm_is_asked(monkeypatch):
    from gpustack_dspark.knobs import DSparkKnobs
    from gpustack_dspark.translate import LaunchPlan
    from gpustack_dspark.worker import state as worker_state
    from gpustack_dspark.worker.middleware import DSparkMiddleware
    from tests.unit.test_one_of import AREA

    asked = []

    async def vllm(scope, receive, send):
        asked.append(scope)

    state = worker_state.WorkerState(plan=LaunchPlan(vllm_argv=[], enabled=True, grammar_mode="json"),
                                     knobs=DSparkKnobs(), default_schema=PRICE)
    monkeypatch.setattr(worker_state, "_current", state)
    body = {**MSG, "response_format": {"type": "json_schema", "json_schema": {"name": "area", "schema": AREA}}}
    status, answer = _completion(DSparkMiddleware(vllm), body)
    assert status == 400 and answer["error"]["param"] == "response_format", answer
    assert "no document satisfies the schema: at dimensions" in answer["error"]["message"]
    assert not asked and state.counters["rejected"] == 1


def test_a_verify_step_that_rejected_elsewhere_than_the_recovered_rows_is_named():
    import numpy as np

    from gpustack_dspark.worker.vllm_fixes import divergent_requests

    # Three requests of 3 drafts (rows 0-2, 3-5, 6-8); -1 pads the output.
    output = np.array([[5, 7, -1, -1],   # kept 1, rejected at row 1
                       [1, 2, 3, 9],     # kept all 3: no rejection
                       [4, -1, -1, -1]])  # kept 0, rejected at row 6
    cu = np.array([3, 6, 9])
    agreed = ([1, 6], [0, 2])
    assert divergent_requests(output, [3, 3, 3], cu, agreed, [True, True, True]) == []
    assert divergent_requests(output, [3, 3, 3], cu, ([2, 6], [0, 2]), [True, True, True]) == [0]
    assert divergent_requests(output, [3, 3, 3], cu, ([1, 4, 6], [0, 1, 2]), [True, True, True]) == [1]
    assert divergent_requests(output, [3, 3, 3], cu, ([2, 6], [0, 2]), [False, True, True]) == []  # greedy: not read
