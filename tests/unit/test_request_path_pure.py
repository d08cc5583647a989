"""The pure cores of issue 20: whose error answer it is (routing), secret redaction, request
limits against hostile bodies and schemas, and the tool-call options per model family."""

import json
import time

import pytest

from gpustack_dspark.knobs import DSparkKnobs, KnobError
from gpustack_dspark.routing import upstream_status
from gpustack_dspark.translate import DEFAULT_TOOL_PARSER, plan_launch, tool_call_options
from gpustack_dspark.worker import redact, request_limits


def _err(message, type_="BadRequestError", code=400):
    return json.dumps({"error": {"message": message, "type": type_, "param": None, "code": code}}).encode()


@pytest.mark.parametrize("status,body,expected", [
    (200, b"{}", upstream_status.OK),
    (400, _err("max_tokens must be at least 1, got -5."), upstream_status.REPLICA),
    (400, _err("the requested JSON schema is not usable: ..."), upstream_status.REPLICA),
    (404, _err("The model `x` does not exist.", "NotFoundError", 404), upstream_status.REPLICA),
    (401, json.dumps({"error": "Unauthorized"}).encode(), upstream_status.REPLICA),
    (500, _err("the reply does not validate ...", "SchemaViolationError", 500), upstream_status.REPLICA),
    # The GPUStack worker's own answers: the replica was not reached or did not answer in time.
    (503, _err("An unexpected error occurred: Cannot connect to host 127.0.0.1:1 ssl:default", "ServiceUnavailable", 503),
     upstream_status.WORKER),
    (503, _err("An unexpected error occurred: something else", "ServiceUnavailable", 503), upstream_status.WORKER),
    (404, json.dumps({"code": 404, "reason": "Not Found",
                      "message": "No running model instance found for model name: 3"}).encode(), upstream_status.WORKER),
    (504, _err("Upstream http://127.0.0.1:9/v1/x sent no response data within 60s", "GatewayTimeout", 504),
     upstream_status.WORKER),
    (504, _err("Request to http://x timed out", "GatewayTimeout", 504), upstream_status.WORKER),
    (400, json.dumps({"detail": "Missing target port; ensure the request includes the routing header"}).encode(),
     upstream_status.WORKER),
    (499, b"", upstream_status.WORKER),
])
def test_classify_whose_answer(status, body, expected):
    assert upstream_status.classify(status, body) == expected


def test_withheld_replies_are_counted_apart():
    withheld = _err("the reply does not validate", "SchemaViolationError", 500)
    assert upstream_status.is_withheld(500, withheld)
    assert upstream_status.count_key(500, withheld) == "withheld"
    assert upstream_status.count_key(400, _err("bad")) == "replica_4xx"
    assert upstream_status.count_key(500, _err("boom", "InternalServerError", 500)) == "replica_5xx"


def test_redact_argv_hides_secret_values_only():
    argv = ["--model", "/m", "--api-key", "k1", "k2", "--hf-token=hf_abc", "--max-num-batched-tokens", "512",
            "--tokenizer", "/tok", "--served-model-name", "x", "--speculative-config", '{"method":"ngram"}',
            "--additional-config", '{"db_password": "pw", "n": 1}', "--port", "8000"]
    out = redact.redact_argv(argv)
    assert out == ["--model", "/m", "--api-key", "REDACTED", "REDACTED", "--hf-token=REDACTED",
                   "--max-num-batched-tokens", "512", "--tokenizer", "/tok", "--served-model-name", "x",
                   "--speculative-config", '{"method":"ngram"}',
                   "--additional-config", '{"db_password":"REDACTED","n":1}', "--port", "8000"]
    assert sorted(redact.secret_values(argv)) == ["hf_abc", "k1", "k2", "pw"]
    assert not any(secret in json.dumps(out) for secret in ("k1", "k2", "hf_abc", '"pw"'))


def test_redact_env_and_names():
    env = {"HF_TOKEN": "hf_x", "VLLM_API_KEY": "k", "PGPASSWORD": "p", "DB_PASSWORD": "p2", "CLIENT_SECRET": "s",
           "TOKENIZERS_PARALLELISM": "false", "PATH": "/bin", "AWS_ACCESS_KEY_ID": "a"}
    out = redact.redact_env(env)
    assert out["HF_TOKEN"] == out["VLLM_API_KEY"] == out["DB_PASSWORD"] == out["CLIENT_SECRET"] == "REDACTED"
    assert out["TOKENIZERS_PARALLELISM"] == "false" and out["PATH"] == "/bin"
    assert out["AWS_ACCESS_KEY_ID"] == "REDACTED"
    assert redact.redact_text("key is sk-12345 ok", ["sk-12345"]) == "key is REDACTED ok"
    assert redact.redact_text("enabled: true, port 123456", ["true", "123456", "abc"]) == "enabled: true, port 123456"


def _nested(depth):
    value = {}
    for _ in range(depth - 1):
        value = {"a": value}
    return value


def test_body_and_schema_depth_are_bounded_and_named():
    request_limits.check_body({"messages": [], "x": _nested(50)})
    with pytest.raises(request_limits.LimitExceeded, match="nested more than 100 levels"):
        request_limits.check_body({"x": _nested(500)})
    deep_schema = {"type": "object"}
    for _ in range(35):
        deep_schema = {"type": "object", "properties": {"a": deep_schema}}
    with pytest.raises(request_limits.LimitExceeded, match="response_format.json_schema.schema is nested more than 64"):
        request_limits.check_body({"response_format": {"type": "json_schema", "json_schema": {"schema": deep_schema}}})


@pytest.mark.parametrize("schema,words", [
    ({"$ref": "#"}, "$ref at (root) leads back to itself"),
    ({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "type": "object",
      "properties": {"x": {"$ref": "#/$defs/a"}}}, "leads back to itself"),
    ({"anyOf": [{"$ref": "#"}, {"type": "null"}]}, "left recursion"),
    ({"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(20000)}},
     "at /properties: 20000 properties (at most 2048 allowed)"),
    ({"type": "string", "enum": [f"v{i}" for i in range(20000)]}, "at /enum: enum has 20000 values"),
    ({"type": "object", "properties": {"code": {"type": "string", "pattern": "(a+)+$"}}},
     "at /properties/code/pattern: pattern '(a+)+$' nests an unbounded quantifier"),
    ({"type": "string", "pattern": r"^(\d*)*x"}, "nests an unbounded quantifier"),
])
def test_hostile_schemas_are_named(schema, words):
    started = time.process_time()
    with pytest.raises(request_limits.LimitExceeded) as e:
        request_limits.check_schema(schema)
    assert words in str(e.value)
    assert "\n" not in str(e.value)
    assert time.process_time() - started < 5  # CPU time of the pure check: seconds would mean a blow-up


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"child": {"$ref": "#"}, "name": {"type": "string"}}},  # real recursion
    {"$defs": {"node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/node"}}}},
     "$ref": "#/$defs/node"},
    {"type": "string", "pattern": r"^([a-z0-9]+\.)+[a-z]{2,}$"},  # domain names: separator in the group
    {"type": "string", "pattern": r"^[A-Z]{2}-\d+$"},
    {"type": "object", "properties": {"pattern": {"type": "string"}, "enum": {"type": "integer"}}},
])
def test_real_schemas_pass_the_limits(schema):
    request_limits.check_schema(schema)


def test_tool_parameters_are_checked_too():
    body = {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "#"}}}]}
    with pytest.raises(request_limits.LimitExceeded, match=r"tools\[0\].function.parameters: \$ref"):
        request_limits.check_body(body)


def test_every_bench_schema_passes_the_limits():
    from pathlib import Path

    bench = Path("/work/shared/data/jsonschemabench")
    if not bench.exists():
        bench = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
    paths = sorted(bench.glob("*/*.json"))
    if not paths:
        pytest.skip("no JSONSchemaBench data next to the checkout")
    refused = []
    for path in paths:
        try:
            request_limits.check_schema(json.loads(path.read_text()))
        except request_limits.LimitExceeded as e:
            refused.append((path.name, str(e)))
    # The limits must not cost real schemas: at most a handful that are left-recursive.
    assert len(refused) <= 3, refused


@pytest.mark.parametrize("model_type,name,tokens,parser", [
    ("deepseek_v3", "/models/DeepSeek-V3", ["<｜tool▁calls▁begin｜>"], "deepseek_v3"),
    ("deepseek_v3", "/models/DeepSeek-V3.1-Terminus", None, "deepseek_v31"),
    ("deepseek_v32", "/m/DeepSeek-V3.2", None, "deepseek_v32"),
    ("deepseek_v4", "/m/x", None, "deepseek_v4"),
    ("deepseek_v41", "/m/x", None, "deepseek_v41"),
    ("qwen3", "/m/Qwen3-8B", ["<tool_call>", "</tool_call>"], "hermes"),
    ("llama", "/m/Llama-3.1-8B", ["<|python_tag|>"], "llama3_json"),
    ("llama", "/m/tiny", ["<|end|>"], DEFAULT_TOOL_PARSER),  # the parser would fail on this tokenizer
    ("gemma2", "/m/g", None, DEFAULT_TOOL_PARSER),
])
def test_tool_call_parser_per_family(model_type, name, tokens, parser):
    args, info = tool_call_options(name, {"model_type": model_type}, [], tokens)
    assert args == ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    assert info["parser"] == parser and info["source"] == "launcher" and info["reason"]


def test_tool_call_parser_is_overridable_and_in_the_plan():
    args, info = tool_call_options("/m", {"model_type": "llama"}, ["--tool-call-parser", "hermes"], None)
    assert args == [] and info == {"parser": "hermes", "auto_tool_choice": False, "source": "given",
                                   "reason": "--tool-call-parser given", "strict": {"tools": "flagged"}}
    plan = plan_launch("/m", DSparkKnobs(enable=True), ["--enable-auto-tool-choice"], config={"model_type": "qwen3"})
    assert plan.vllm_argv.count("--enable-auto-tool-choice") == 1
    assert plan.vllm_argv[plan.vllm_argv.index("--tool-call-parser") + 1] == "hermes"
    assert plan.tool_calls["parser"] == "hermes"


def test_a_chat_template_that_writes_tool_call_tags_gets_the_hermes_parser():
    hermes_template = "{% for t in tools %}...{% endfor %}<tool_call>{{ c }}</tool_call>"
    args, info = tool_call_options("/m", {"model_type": "llama"}, [], [], hermes_template)
    assert args == ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]
    assert "writes tool calls as <tool_call>" in info["reason"]
    # A family with its own parser keeps it; a template without the tag keeps the default.
    assert tool_call_options("/m", {"model_type": "deepseek_v3"}, [], None, hermes_template)[1]["parser"] == "deepseek_v3"
    assert tool_call_options("/m", {"model_type": "llama"}, [], [], "{{ messages }}")[1]["parser"] == "pythonic"


def test_strict_tools_all_asks_vllm_for_every_tool_and_needs_structural_tags():
    from gpustack_dspark.translate import with_structural_tags

    args, info = tool_call_options("/m", {"model_type": "qwen3"}, [], None, None, "all")
    assert args[-2:] == ["--tool-strict-level", "parameter"] and info["strict"] == {"tools": "all"}
    with pytest.raises(KnobError, match=r"--dspark-strict-tools: 'all' is not allowed .*--tool-strict-level=function"):
        tool_call_options("/m", {"model_type": "qwen3"}, ["--tool-strict-level", "function"], None, None, "all")
    plan = plan_launch("/m", DSparkKnobs(enable=True, strict_tools="all"), [], config={"model_type": "qwen3"})
    kept = with_structural_tags(plan, "hermes")
    assert kept.tool_calls["strict"]["under_auto"] is True and "hermes format" in kept.tool_calls["strict"]["mechanism"]
    with pytest.raises(KnobError, match=r"'all' is not allowed \(vLLM's hermes tool-call parser has no structural "
                                        r"tags.*; allowed: flagged"):
        with_structural_tags(plan, None)
    flagged = with_structural_tags(plan_launch("/m", DSparkKnobs(enable=True), [], config={"model_type": "gemma"}), None)
    assert flagged.tool_calls["strict"]["under_auto"] is False
    assert "judged before delivery" in flagged.tool_calls["strict"]["mechanism"]


@pytest.mark.parametrize("schema,words", [
    ({"type": "array", "items": {"type": "string"}, "uniqueItems": True}, "uniqueItems on an array, at (root)"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 5}}},
     "multipleOf on a number, at /properties/n"),
    ({"type": "object", "properties": {"s": {"type": "string", "pattern": "^a+$", "maxLength": 4}}},
     "pattern or format together with minLength/maxLength"),
    ({"type": "object", "properties": {"s": {"type": "string", "format": "iri"}}}, "format 'iri'"),
    ({"allOf": [{"type": "object"}, {"required": ["a"]}]}, "allOf with more than one branch"),
])
def test_what_vllms_xgrammar_backend_refuses_is_named(schema, words):
    from gpustack_dspark.worker.schema_check import xgrammar_unsupported

    assert words in xgrammar_unsupported(schema)



def test_relaxing_drops_only_what_xgrammar_refuses_and_keeps_the_original():
    from gpustack_dspark.worker.json_default import requested_schema, with_schema
    from gpustack_dspark.worker.schema_check import relax_for_xgrammar, xgrammar_unsupported

    schema = {"type": "object", "additionalProperties": False, "required": ["n", "tags", "code"], "properties": {
        "n": {"type": "integer", "multipleOf": 5, "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "format": "iri"}, "uniqueItems": True},
        "code": {"type": "string", "pattern": "^[A-Z]+$", "maxLength": 8},
        "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
                           {"properties": {"b": {"type": "string"}}, "required": ["b"]}]}}}
    original = json.dumps(schema, sort_keys=True)
    relaxed, dropped = relax_for_xgrammar(schema)
    assert json.dumps(schema, sort_keys=True) == original  # the reply check keeps the original
    assert xgrammar_unsupported(relaxed) is None
    assert sorted(dropped) == sorted(["multipleOf at /properties/n", "uniqueItems at /properties/tags",
                                      "format at /properties/tags/items", "maxLength at /properties/code",
                                      "allOf at /properties/both (merged)"])
    assert relaxed["properties"]["n"] == {"type": "integer", "minimum": 0}
    assert relaxed["properties"]["code"] == {"type": "string", "pattern": "^[A-Z]+$"}
    assert relaxed["properties"]["both"] == {"type": "object", "properties": {"a": {"type": "integer"},
                                             "b": {"type": "string"}}, "required": ["a", "b"]}
    assert relax_for_xgrammar({"type": "string"}) == ({"type": "string"}, [])
    body = {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}
    assert requested_schema(with_schema(body, relaxed)) == relaxed and requested_schema(body) == schema
    so = {"structured_outputs": {"json": schema}}
    assert requested_schema(with_schema(so, relaxed)) == relaxed


def test_schema_bench_classifies_each_answer():
    from tests.bench.schema_bench import classify

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}

    def ok(content, finish="stop"):
        return {"choices": [{"finish_reason": finish, "message": {"content": content}}]}

    assert classify(schema, 200, ok('{"a": 1}')) == ("valid", "")
    assert classify(schema, 200, ok('{"a": ', "length")) == ("cut", "")
    assert classify(schema, 200, ok('{"a": "x"}'))[0] == "invalid"
    assert classify(schema, 500, {"error": {"type": "SchemaViolationError", "message": "withheld"}})[0] == "withheld"
    assert classify(schema, 400, {"error": {"message": "not usable: x"}}) == ("refused", "400 not usable: x")
    assert classify(schema, 503, {"error": {"message": "An unexpected error occurred"}})[0] == "refused"


# ---- two grammar engines: which one serves a request, and the second attempt ----------------

DUAL = ("xgrammar", "llguidance")


def _verdicts(monkeypatch, xgrammar=None, llguidance=None, lenient=None):
    """Stand in for the two compilers' verdicts (the real ones run in the worker's venv and are
    exercised by tests/integration/test_request_path.py)."""
    from gpustack_dspark.worker import schema_check

    def check(schema, timeout_s=10):
        return schema_check.structural_problem(schema) or (
            schema_check.xgrammar_unsupported(schema) or xgrammar(schema) if xgrammar else
            schema_check.xgrammar_unsupported(schema))

    monkeypatch.setattr(schema_check, "check_schema", check)
    monkeypatch.setattr(schema_check, "llguidance_problem",
                        lambda schema, lenient_=False, timeout_s=10, **kw: (
                            (lenient(schema) if lenient else None) if (kw.get("lenient") or lenient_)
                            else (llguidance(schema) if llguidance else None)))
    return schema_check


def test_a_length_bounded_string_goes_to_llguidance_which_keeps_json_string_syntax(monkeypatch):
    # xgrammar 0.2 admits raw control characters in a string with minLength/maxLength (#800):
    # llguidance where the replica has it, exactly; xgrammar alone keeps it (the reply is checked).
    sc = _verdicts(monkeypatch)
    bounded = {"type": "object", "properties": {"id": {"type": "string", "minLength": 2, "maxLength": 8}},
               "required": ["id"]}
    assert sc.length_bounded_string(bounded) == "/properties/id"
    plan = sc.plan_engine(bounded, DUAL)
    assert (plan.engine, plan.exact, plan.grammar_schema[sc.ENGINE_MARK]) == ("llguidance", True, "llguidance")
    assert {k: v for k, v in plan.grammar_schema.items() if k != sc.ENGINE_MARK} == bounded
    assert sc.plan_engine(bounded, ("xgrammar",)).engine == "xgrammar"
    nested = {"type": "array", "items": {"anyOf": [{"type": "integer"}, {"type": ["string", "null"], "maxLength": 3}]}}
    assert sc.length_bounded_string(nested) == "/items/anyOf/1"
    # a plain string, a bound on something else, and pattern/format with a bound (refused by
    # xgrammar, planned as before) are not this case
    for other in ({"type": "string"}, {"type": "array", "maxItems": 3, "items": {"type": "string"}},
                  {"type": "string", "pattern": "^a+$", "maxLength": 4}):
        assert sc.length_bounded_string(other) is None, other
    # llguidance cannot compile it exactly: xgrammar as before
    sc = _verdicts(monkeypatch, llguidance=lambda schema: "no")
    assert sc.plan_engine(bounded, DUAL).engine == "xgrammar"


def test_xgrammar_first_llguidance_where_xgrammar_refuses(monkeypatch):
    sc = _verdicts(monkeypatch)
    order = {"type": "object", "properties": {"a": {"type": "string"}}}
    plan = sc.plan_engine(order, DUAL)
    assert (plan.engine, plan.grammar_schema, plan.dropped, plan.problem) == ("xgrammar", order, [], None)
    multiple = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}
    plan = sc.plan_engine(multiple, DUAL)  # enforced exactly by llguidance; vLLM's frontend picks it
    assert (plan.engine, plan.grammar_schema, plan.exact) == ("llguidance", multiple, True)
    # One engine only (the drafting layer off): relaxed (streamed or not: every reply is checked),
    # and a 400 when relaxing is turned off.
    plan = sc.plan_engine(multiple, ("xgrammar",))
    assert plan.engine == "xgrammar" and plan.dropped == ["multipleOf at /properties/n"]
    assert "multipleOf on a number" in sc.plan_engine(multiple, ("xgrammar",), relax=False).problem


def test_lenient_llguidance_unless_relaxing_is_off(monkeypatch):
    unique = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True}
    sc = _verdicts(monkeypatch, llguidance=lambda s: "Unimplemented keys: uniqueItems")
    plan = sc.plan_engine(unique, DUAL)
    assert plan.engine == "llguidance" and plan.dropped == ["lenient"]
    assert plan.grammar_schema == {**unique, "x-guidance": {"lenient": True}} and "uniqueItems" in unique
    assert "uniqueItems on an array" in sc.plan_engine(unique, DUAL, relax=False).problem
    # Neither way in llguidance: xgrammar relaxed; patternProperties never goes to llguidance
    # (vLLM's frontend would send it to outlines).
    sc = _verdicts(monkeypatch, llguidance=lambda s: "no", lenient=lambda s: "no")
    assert sc.plan_engine(unique, DUAL).dropped == ["uniqueItems at (root)"]
    pattern = {"type": "object", "properties": {"a": {"type": "string"}},
               "patternProperties": {"^x": {"type": "integer"}}}
    sc = _verdicts(monkeypatch)
    plan = sc.plan_engine(pattern, DUAL)
    assert plan.engine == "xgrammar" and plan.dropped == ["patternProperties at (root)"]


def test_a_schema_xgrammar_cannot_compile_is_marked_for_llguidance(monkeypatch):
    sc = _verdicts(monkeypatch, xgrammar=lambda s: "the grammar engine (xgrammar) cannot compile this schema: x")
    schema = {"type": "array", "prefixItems": [{"type": "integer"}], "minItems": 3}
    plan = sc.plan_engine(schema, DUAL)
    assert plan.engine == "llguidance" and plan.grammar_schema == {**schema, "x-dspark-engine": "llguidance"}
    # Structural problems are a 400 whatever the engines.
    bad = {"type": "objectx"}
    assert sc.plan_engine(bad, DUAL).problem.startswith("not a valid JSON Schema at type")


def test_the_second_attempt_uses_the_other_engine(monkeypatch):
    sc = _verdicts(monkeypatch)
    order = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    first = sc.plan_engine(order, DUAL)
    second = sc.second_plan(order, first, DUAL)
    assert second.engine == "llguidance" and second.grammar_schema == {**order, "x-dspark-engine": "llguidance"}
    assert sc.second_plan(order, first, ("xgrammar",)) is None
    multiple = {"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 3}}}
    back = sc.second_plan(multiple, sc.plan_engine(multiple, DUAL), DUAL)
    assert back.engine == "xgrammar" and back.dropped == ["multipleOf at /properties/n"]


def test_the_engine_annotation_is_read_and_removed():
    from gpustack_dspark.worker.drafting import engines

    spec = json.dumps({"type": "object", "x-dspark-engine": "llguidance", "x-guidance": {"lenient": True}})
    engine, rest = engines.split_mark(spec)
    assert engine == "llguidance" and json.loads(rest) == {"type": "object", "x-guidance": {"lenient": True}}
    assert engines.split_mark('{"type": "string"}') == (None, '{"type": "string"}')
    assert engines.split_mark('{"x-dspark-engine": "other"}') == (None, "{}")
    assert engines.split_mark('"x-dspark-engine"') == (None, '"x-dspark-engine"')
    assert engines.choose("guidance", None) == "llguidance" and engines.choose("xgrammar", None) == "xgrammar"
    assert engines.choose("xgrammar", "llguidance") == "llguidance"
    with pytest.raises(ValueError, match="'outlines' is not served by this replica"):
        engines.choose("outlines", None)


def test_the_verdict_caches_are_bounded(monkeypatch):
    from gpustack_dspark.worker import schema_check

    monkeypatch.setattr(schema_check, "VERDICTS_KEPT", 3)
    cache = schema_check._Verdicts()
    for i in range(5):
        cache[str(i)] = f"v{i}"
    assert len(cache) == 3 and "0" not in cache and cache["2"] == "v2"
    cache["5"] = None  # "2" was used last: "3" goes
    assert "3" not in cache and "2" in cache and "5" in cache and cache["5"] is None


def test_a_oneof_llguidance_cannot_prove_exclusive_is_tried_as_anyof_where_the_reply_is_checked(monkeypatch):
    from gpustack_dspark.worker import schema_check as sc

    tried = []

    def llguidance(schema, lenient=False, timeout_s=10, coerce_one_of=False):
        tried.append((lenient, coerce_one_of))
        return None if coerce_one_of else ("the grammar engine (llguidance) cannot compile this schema: oneOf "
                                           "constraints are not supported. Enable 'coerce_one_of' option")

    monkeypatch.setattr(sc, "llguidance_problem", llguidance)
    schema = {"oneOf": [{"type": "object", "required": ["a"]}, {"type": "object", "required": ["b"]}]}
    plan = sc._llguidance_plan(schema, marked=True, allow_lenient=True)
    assert plan.engine == "llguidance" and plan.dropped == ["oneOf as anyOf"] and not plan.exact
    assert plan.grammar_schema == {**schema, "x-guidance": {"coerce_one_of": True}, "x-dspark-engine": "llguidance"}
    assert tried == [(False, False), (False, True)]
    assert sc._llguidance_plan(schema, marked=True, allow_lenient=False) is None  # relaxing off: exact only
    assert sc.guidance_options(True, True) == {"x-guidance": {"lenient": True, "coerce_one_of": True}}


def test_draft04_boolean_exclusive_bounds_are_written_as_numbers_when_relaxing():
    """OpenAPI 3.0's document schema (draft-04) is relaxed for xgrammar instead of refused: its
    `exclusiveMinimum: true` beside `minimum` is the later drafts' `exclusiveMinimum: <minimum>`."""
    from gpustack_dspark.worker import schema_check as sc

    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
                             "m": {"type": "number", "maximum": 9, "exclusiveMaximum": False},
                             "exclusiveMinimum": {"type": "boolean"}},  # a property of that name stays
              "patternProperties": {"^x-": {}}, "additionalProperties": False}
    relaxed, dropped = sc.relax_for_xgrammar(schema)
    assert relaxed["properties"]["n"] == {"type": "number", "exclusiveMinimum": 0}
    assert relaxed["properties"]["m"] == {"type": "number", "maximum": 9}
    assert relaxed["properties"]["exclusiveMinimum"] == {"type": "boolean"}
    assert "$schema" not in relaxed and schema["properties"]["n"]["exclusiveMinimum"] is True  # a copy
    assert "exclusiveMinimum as a draft-04 boolean at /properties/n (written as a number)" in dropped
    assert "patternProperties at (root)" in dropped


PAYMENT = {"type": "object", "properties": {"pay": {"oneOf": [
    {"type": "object", "properties": {"card": {"type": "string"}}, "required": ["card"]},
    {"type": "object", "properties": {"iban": {"type": "string"}, "card": {"type": "string"}}, "required": ["iban"]}]}},
    "required": ["pay"]}


def test_a_reply_that_satisfies_two_oneof_branches_is_found_with_its_path():
    from gpustack_dspark import reply_check

    assert reply_check.one_of_overlaps('{"pay":{"card":"x","iban":"y"}}', PAYMENT) == [(("properties", "pay", "oneOf"), [0, 1])]
    assert reply_check.one_of_overlaps('{"pay":{"card":"x"}}', PAYMENT) == []  # one branch: fine
    assert reply_check.one_of_overlaps('{"pay":{}}', PAYMENT) == []  # no branch: not an overlap
    assert reply_check.one_of_overlaps("not json", PAYMENT) == []


def test_the_narrowed_oneof_keeps_the_branch_that_rules_out_the_other_and_closes_it():
    from gpustack_dspark import reply_check
    from gpustack_dspark.worker.schema_check import narrowed_plan

    plan = narrowed_plan(PAYMENT, '{"pay":{"card":"x","iban":"y"}}', ("xgrammar", "llguidance"))
    narrowed = plan.grammar_schema["properties"]["pay"]
    # Branch 0 closed cannot carry the iban branch 1 requires; branch 1 closed can carry a card.
    assert "oneOf" not in narrowed and narrowed["allOf"] == [{**PAYMENT["properties"]["pay"]["oneOf"][0],
                                                               "additionalProperties": False}]
    assert plan.dropped[-1] == "oneOf narrowed to the branch the first reply matched"
    assert reply_check.check('{"pay":{"card":"x"}}', PAYMENT) is None  # what it allows, the original accepts
    assert narrowed_plan(PAYMENT, '{"pay":{"card":"x"}}', ("xgrammar",)) is None  # nothing to narrow
    behind_ref = {"$defs": {"p": PAYMENT["properties"]["pay"]}, "type": "object",
                  "properties": {"pay": {"$ref": "#/$defs/p"}}}
    assert narrowed_plan(behind_ref, '{"pay":{"card":"x","iban":"y"}}', ("xgrammar",)) is None


def test_a_discriminating_property_is_required_in_the_narrowed_branch():
    from gpustack_dspark.worker.schema_check import _closed

    branch = {"type": "object", "properties": {"kind": {"enum": ["github/pullrequest"]}, "title": {"type": "string"}}}
    closed = _closed(branch)
    assert closed["required"] == ["kind"] and closed["additionalProperties"] is False
    assert _closed({"$ref": "#/x"}) == {"$ref": "#/x"}  # nothing to close


def test_pattern_properties_become_additional_properties_for_the_grammar():
    from gpustack_dspark.worker.schema_check import _without_pattern_properties

    anything = {"type": "object", "patternProperties": {".*": {"type": "integer"}}}
    assert _without_pattern_properties(anything) == {"type": "object", "additionalProperties": {"type": "integer"}}
    closed = {"type": "object", "patternProperties": {"^x-": {"type": "string"}}, "additionalProperties": False,
              "properties": {"a": {"patternProperties": {".*": {}}}}}
    # The x- keys stay possible (their pattern is gone, so the grammar must allow any key).
    assert _without_pattern_properties(closed) == {"type": "object", "properties": {"a": {"additionalProperties": {}}}}
