"""Every real request gets the right answer (issue 20), against real parts: a GPUStack server
(+ PostgreSQL) with the plugin, a real CPU worker, real `dspark-serve` replicas on real vLLM
(CPU), the OpenAI Python SDK as the client.

- replica `open`: the GPUStack model's only instance (pointed at by hand, as in
  test_routing_dspark_replicas.py): status codes through the proxy, the SDK's JSON paths, tool
  calls, hostile requests;
- replica `keyed`: direct only, started with vLLM's `--api-key` and secret-bearing arguments and
  environment: `/dspark/info` needs the key, shows no secret, and the launcher's log neither.
"""

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from gpustack_dspark.bench.workloads import ORDER_SCHEMA
from gpustack_dspark.devstack.ports import free_port
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica, worker_env, worker_python
from tests.bench.schema_bench import DEFAULT_BENCH
from tests.bench.tools_and_streams import PROMPTS, tools as _auto_tools
from tests.conftest import dspark_status, wait_for

pytestmark = pytest.mark.integration

API_KEY = "sk-dspark-test-4f1c9a"
HF_TOKEN = "hf_secretvalue_8d2e"
ENV_SECRET = "pw-in-env-77aa1"
DEAD_MODEL = "unreachable-model"
# xgrammar 0.2.8 ignores `not` (and vLLM lets it through): its only reply (1) breaks the
# schema, so the replica's reply check must withhold it.
WITHHELD_SCHEMA = {"type": "integer", "minimum": 1, "maximum": 1, "not": {"const": 1}}
LOOKBEHIND_SCHEMA = {"type": "object", "properties": {"code": {"type": "string", "pattern": "(?<=a)b"}},
                     "required": ["code"]}
ORDER_TOOL = {"type": "function", "function": {
    "name": "place_order", "description": "Place an order.",
    "parameters": {"type": "object", "properties": {
        "user_id": {"type": "integer", "minimum": 1}, "action": {"type": "string", "enum": ["buy", "sell"]},
        "amount": {"type": "number"}}, "required": ["user_id", "action", "amount"], "additionalProperties": False}}}
LOOKUP_TOOL = {"type": "function", "function": {
    "name": "lookup_user", "parameters": {"type": "object", "properties": {"user_id": {"type": "integer"}},
                                          "required": ["user_id"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Create an order record for user 7: sell 12.5."}]


@pytest.fixture(scope="module")
def stack(shared_stack, tmp_path_factory):
    """The shared platform (its first replica is the open one) and a replica of this module's own
    that wants an API key, holds secrets and constrains every tool (`--dspark-strict-tools all`)."""
    base = tmp_path_factory.mktemp("request-path")
    keyed = start_replica(base / "keyed.log", ["--enable-dspark", "--dspark-warmup-requests", "1",
                                               "--dspark-strict-tools", "all",
                                               "--api-key", API_KEY, "--hf-token", HF_TOKEN],
                          env={"DSPARK_TEST_DB_PASSWORD": ENV_SECRET})
    try:
        server, api = shared_stack.up()
        open_replica = shared_stack.replicas()[0]
        keyed.wait_ready(420)
        with shared_stack.models_on(base, {SERVED_NAME: ([open_replica.port], 180), DEAD_MODEL: ([free_port()], None)}):
            yield server, api, open_replica, keyed
    finally:
        keyed.stop()


@pytest.fixture(scope="module")
def client(stack):
    server, api, _, _ = stack
    # max_retries=0: a 5xx would otherwise be retried by the SDK, hiding what came back.
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=api.api_key, max_retries=0, timeout=180)


def _proxy(stack, body, stream=False):
    server, api, _, _ = stack
    return httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {api.api_key}"},
                      json={"model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 64, "temperature": 0,
                            **body, **({"stream": True} if stream else {})}, timeout=180)


# ---- part 2: honest status codes through GPUStack's proxy -------------------------------------

@pytest.mark.parametrize("stream", [False, True])
def test_a_client_mistake_is_a_400_with_the_replicas_error(client, stream):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=-5, stream=stream)
    assert e.value.status_code == 400
    message = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    assert "max_tokens" in message and "An unexpected error occurred" not in message, e.value.body


@pytest.mark.parametrize("stream", [False, True])
def test_an_unusable_schema_is_a_400_naming_the_reason(stack, stream):
    r = _proxy(stack, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "bad", "schema": LOOKBEHIND_SCHEMA}}}, stream=stream)
    assert r.status_code == 400, r.text[:500]
    assert r.headers["content-type"].startswith("application/json")
    error = r.json()["error"]
    assert "the requested JSON schema is not usable" in error["message"] and error["param"] == "response_format"


def test_a_withheld_reply_is_a_5xx_that_says_so_and_is_counted(stack):
    server, api, replica, _ = stack
    before = replica.info()["requests"]
    attempts = before["second_attempts"]
    before = before["schema_violations"]
    r = _proxy(stack, {"response_format": {"type": "json_schema", "json_schema": {
        "name": "pair", "schema": WITHHELD_SCHEMA}}})
    assert r.status_code == 500, r.text[:500]
    error = r.json()["error"]
    assert error["type"] == "SchemaViolationError" and "it was not delivered" in error["message"]
    assert replica.info()["requests"]["schema_violations"] == before + 1
    # Neither engine enforces `not`: the second attempt (llguidance, lenient) fails the check too.
    assert replica.info()["requests"]["second_attempts"] == attempts + 1
    statuses = dspark_status(server, api.api_key)["routing"]["replica_statuses"]
    assert statuses["withheld"] >= 1 and statuses["replica_4xx"] >= 1


def test_a_stream_that_breaks_the_schema_ends_in_an_error_not_in_a_complete_document(stack, client):
    """The only reply of WITHHELD_SCHEMA (1) breaks its `not`, which xgrammar lets through: the
    OpenAI SDK, streaming through GPUStack's proxy, gets an error event where the last part
    would have been, and never the whole document."""
    _, _, replica, _ = stack
    before = _requests(replica)
    stream = client.chat.completions.create(
        model=SERVED_NAME, messages=MESSAGES, max_tokens=16, temperature=0, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "one", "schema": WITHHELD_SCHEMA}})
    received = ""
    with pytest.raises(openai.APIError) as e:
        for chunk in stream:
            for choice in chunk.choices:
                received += choice.delta.content or ""
    assert "does not validate against the requested schema" in str(e.value), e.value
    assert not _validates(received, {"type": "integer"})  # "1" never arrived whole
    after = _requests(replica)
    assert after["streams_checked"] == before["streams_checked"] + 1
    assert after["schema_violations"] == before["schema_violations"] + 1


# The grammar lets only user_id 1 through and xgrammar ignores `not`: every call breaks it.
IMPOSSIBLE_TOOL = {"type": "function", "function": {"name": "lookup_user", "parameters": {
    "type": "object", "properties": {"user_id": {"type": "integer", "minimum": 1, "maximum": 1, "not": {"const": 1}}},
    "required": ["user_id"], "additionalProperties": False}}}


@pytest.mark.parametrize("stream", [False, True])
def test_tool_call_arguments_that_break_the_tools_schema_are_never_delivered_whole(stack, client, stream):
    """tool_choice "required" through the SDK and GPUStack's proxy: the fixture calls the tool
    with the only value the grammar allows, which the schema's `not` forbids. Streamed, the
    call's last piece is replaced by an error event (the fixture's call is whole before
    max_tokens ends the reply); non-streamed, a 500 — or, when max_tokens cut the reply before
    vLLM could parse a call, no call at all. Never the whole bad arguments."""
    _, _, replica, _ = stack
    before = _requests(replica)
    received, withheld = [], None
    try:
        reply = client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": "Look up user 1."}], max_tokens=48,
            temperature=0, tools=[IMPOSSIBLE_TOOL], tool_choice="required", stream=stream)
        if stream:
            received.append("")
            for chunk in reply:
                for choice in chunk.choices:
                    for call in choice.delta.tool_calls or []:
                        received[-1] += (call.function.arguments or "") if call.function else ""
        else:
            received = [call.function.arguments for call in reply.choices[0].message.tool_calls or []]
    except openai.APIError as e:
        withheld = str(e)
    assert not any(_validates(args, {"type": "object"}) for args in received), received
    if stream:
        assert withheld and "arguments of the call to lookup_user" in withheld, withheld
        assert _requests(replica)["streams_checked"] == before["streams_checked"] + 1
    if withheld:
        assert _requests(replica)["schema_violations"] == before["schema_violations"] + 1


@pytest.mark.parametrize("stream", [False, True])
def test_an_unreachable_replica_stays_503(stack, stream):
    server, api, _, _ = stack
    body = {"model": DEAD_MODEL, "messages": MESSAGES, "max_tokens": 8, **({"stream": True} if stream else {})}

    def answer():
        r = httpx.post(f"{server.url}/v1/chat/completions", headers={"Authorization": f"Bearer {api.api_key}"},
                       json=body, timeout=60)
        return r if r.status_code not in (404,) and "No running instances" not in r.text else None

    r = wait_for(answer, 60, "the unreachable model's route")
    assert r.status_code in (502, 503), r.text[:300]
    assert "max_tokens" not in r.text


# ---- part 1: two grammar engines, lenient only where checked, a second attempt ---------------

# xgrammar (as vLLM 0.32 uses it) refuses multipleOf; llguidance enforces it exactly.
MULTIPLE_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["user_id", "amount"], "properties": {
    "user_id": {"type": "integer", "minimum": 0, "maximum": 1000, "multipleOf": 7},
    "amount": {"type": "number"}}}
# Neither engine enforces uniqueItems: llguidance compiles it only in lenient mode.
UNIQUE_SCHEMA = {"type": "object", "required": ["tags"], "properties": {
    "tags": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2, "maxItems": 3}}}
# xgrammar 0.2.8 lets this pattern through wrongly (the tiny model writes "6.6.91"): withheld,
# then served by the second attempt with llguidance.
VERSION_SCHEMA = {"type": "object", "required": ["version"], "properties": {
    "version": {"type": "string", "pattern": "^[0-9]\\.[0-9]\\.[0-9](-[0-9A-Za-z]+)?$"}}}
DOCUMENT = [{"role": "user", "content": "Produce a JSON document."}]


def _schema_body(schema, **extra):
    return {"response_format": {"type": "json_schema", "json_schema": {"name": "doc", "schema": schema}}, **extra}


def _validates(text, schema) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
        return True
    except (ValueError, jsonschema.ValidationError):
        return False


def _streamed_content(r) -> tuple:
    text, finish = "", None
    for line in r.text.splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            event = json.loads(line[6:])
            if "error" in event:
                continue
            choices = event["choices"]
            if not choices:  # the usage chunk
                continue
            choice = choices[0]
            text += (choice.get("delta") or {}).get("content") or ""
            finish = choice.get("finish_reason") or finish
    return text, finish


def _requests(replica):
    return replica.info()["requests"]


@pytest.mark.parametrize("stream", [False, True])
def test_a_schema_xgrammar_refuses_is_served_exactly_by_llguidance(stack, stream):
    _, _, replica, _ = stack
    before = _requests(replica)
    finished = 0
    for i in range(2):
        r = _proxy(stack, _schema_body(MULTIPLE_SCHEMA, max_tokens=96, messages=[
            {"role": "user", "content": f"Create an order record for user {7 * (i + 1)}: buy {i + 2.5}."}]),
            stream=stream)
        assert r.status_code == 200, r.text[:300]  # enforced exactly: never withheld
        text, finish = _streamed_content(r) if stream else (
            r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"])
        if finish == "stop":
            jsonschema.validate(json.loads(text), MULTIPLE_SCHEMA)
            finished += 1
    after = _requests(replica)
    assert after["engine_llguidance"] == before["engine_llguidance"] + 2
    assert after["relaxed"] == before["relaxed"] and after["schema_violations"] == before["schema_violations"]
    assert finished >= 1


# JSONSchemaBench Github_trivial/o30283's shape: an optional property whose enum has no value of
# its type, so no value can be written for it; xgrammar ignores the type and wrote "mode": "AAA"
# (a withheld reply in the affinity benchmark). Beside it, what the fixture writes.
ENUM_TYPE_SCHEMA = {"type": "object", "required": ["user_id", "amount"], "properties": {
    "mode": {"enum": ["all", "ssl", "AAA", "dns"], "type": "object"},
    "user_id": {"type": "integer"}, "amount": {"type": "number"}}}


@pytest.mark.parametrize("stream", [False, True])
def test_an_enum_its_type_excludes_is_served_exactly(stack, stream):
    """llguidance reads enum and type together (only values of the type, here none), so the
    reply never has `mode` and is never withheld; the same property required is a 400."""
    _, _, replica, _ = stack
    before = _requests(replica)
    for i in range(2):
        r = _proxy(stack, _schema_body(ENUM_TYPE_SCHEMA, max_tokens=96, temperature=1.0, seed=i, messages=[
            {"role": "user", "content": f"Create an order record for user {3 * (i + 1)} in mode all."}]),
            stream=stream)
        assert r.status_code == 200, r.text[:300]
        text, finish = _streamed_content(r) if stream else (
            r.json()["choices"][0]["message"]["content"], r.json()["choices"][0]["finish_reason"])
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
        assert not any("error" in event for event in events), r.text[-400:]  # never withheld
        if finish == "stop":
            assert "mode" not in json.loads(text) and _validates(text, ENUM_TYPE_SCHEMA), text
    after = _requests(replica)
    assert after["engine_llguidance"] == before["engine_llguidance"] + 2
    assert after["schema_violations"] == before["schema_violations"]
    required = {**ENUM_TYPE_SCHEMA, "required": ["mode", "user_id"]}
    r = _proxy(stack, _schema_body(required, max_tokens=8), stream=stream)
    assert r.status_code == 400, r.text[:300]
    assert "no document satisfies the schema: at mode" in r.json()["error"]["message"], r.text[:400]


def test_lenient_llguidance_for_streams_too_each_reply_checked(stack):
    _, _, replica, _ = stack
    before = _requests(replica)
    r = _proxy(stack, _schema_body(UNIQUE_SCHEMA, max_tokens=64, messages=DOCUMENT))
    assert r.status_code in (200, 500), r.text[:300]
    if r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "stop":
        jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), UNIQUE_SCHEMA)
    elif r.status_code == 500:
        assert r.json()["error"]["type"] == "SchemaViolationError"
    after = _requests(replica)
    assert after["relaxed"] == before["relaxed"] + 1 and after["engine_llguidance"] == before["engine_llguidance"] + 1
    # Streamed, the same plan: the reply is checked before its last content event goes out.
    checked = after["streams_checked"]
    r = _proxy(stack, _schema_body(UNIQUE_SCHEMA, max_tokens=64, messages=DOCUMENT), stream=True)
    assert r.status_code == 200, r.text[:300]
    text, finish = _streamed_content(r)
    if "SchemaViolationError" in r.text:
        assert finish != "stop" and not _validates(text, UNIQUE_SCHEMA)
    elif finish == "stop":
        jsonschema.validate(json.loads(text), UNIQUE_SCHEMA)
    after = _requests(replica)
    assert after["relaxed"] == before["relaxed"] + 2 and after["streams_checked"] == checked + 1


# xgrammar refuses multipleOf; llguidance refuses a oneOf whose branches it cannot prove
# exclusive unless told to read it as anyOf (coerce_one_of): then it enforces multipleOf exactly
# and the reply check judges oneOf's exclusivity.
ONE_OF_SCHEMA = {"type": "object", "required": ["user_id", "contact"], "additionalProperties": False, "properties": {
    "user_id": {"type": "integer", "minimum": 0, "maximum": 1000, "multipleOf": 7},
    "contact": {"oneOf": [
        {"type": "object", "properties": {"email": {"type": "string", "maxLength": 40}}, "required": ["email"]},
        {"type": "object", "properties": {"phone": {"type": "string", "maxLength": 20}}, "required": ["phone"]}]}}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_oneof_llguidance_cannot_prove_exclusive_is_served_as_anyof_and_checked(stack, stream):
    _, _, replica, _ = stack
    before = _requests(replica)
    r = _proxy(stack, _schema_body(ONE_OF_SCHEMA, max_tokens=96, messages=[
        {"role": "user", "content": "Create a user record for user 14 with email a@b.c."}]), stream=stream)
    assert r.status_code in (200, 500), r.text[:300]
    if stream:
        text, finish = _streamed_content(r)
        withheld = "SchemaViolationError" in r.text
    else:
        withheld = r.status_code == 500
        text, finish = ("", None) if withheld else (r.json()["choices"][0]["message"]["content"],
                                                    r.json()["choices"][0]["finish_reason"])
    if not withheld and finish == "stop":
        jsonschema.validate(json.loads(text), ONE_OF_SCHEMA)
    after = _requests(replica)
    assert after["engine_llguidance"] == before["engine_llguidance"] + 1  # not xgrammar without multipleOf
    assert after["relaxed"] == before["relaxed"] + 1


def test_a_withheld_reply_gets_one_more_attempt_with_the_other_engine(stack):
    _, _, replica, _ = stack
    before = _requests(replica)
    r = _proxy(stack, _schema_body(VERSION_SCHEMA, max_tokens=200, messages=DOCUMENT))
    assert r.status_code == 200, r.text[:300]
    jsonschema.validate(json.loads(r.json()["choices"][0]["message"]["content"]), VERSION_SCHEMA)
    after = _requests(replica)
    assert after["second_attempts"] == before["second_attempts"] + 1
    assert after["second_attempt_served"] == before["second_attempt_served"] + 1
    assert after["schema_violations"] == before["schema_violations"]  # nothing withheld in the end


# The three shapes the grammar engines read wider than JSON Schema (worker/normalize.py and the
# narrowed retry), in schemas of our own: keywords beside a oneOf of required-only branches, a
# string's keywords without a type whose pattern no string of that length matches (so a valid
# reply there is not a string), if/then conditionals on a required key, and a oneOf whose
# branches overlap (an object with neither key, or with a string "phone", satisfies both).
SHAPES = {
    "siblings beside oneOf": {
        "type": "object", "required": ["zone"],
        "properties": {"zone": {"type": "string", "enum": ["north", "south"]}, "weight_kg": {"type": "number"},
                       "volume_l": {"type": "number"}, "pallets": {"type": "integer"}},
        "oneOf": [{"required": ["weight_kg"]}, {"required": ["volume_l"]}, {"required": ["pallets"]}]},
    "string keywords without a type": {
        "type": "object", "required": ["code", "tag"], "additionalProperties": False,
        "properties": {"code": {"minLength": 4, "maxLength": 4, "pattern": "^[A-Z]{6}$"},
                       "tag": {"minLength": 2, "maxLength": 8, "pattern": "^[a-z]+$"}}},
    "if/then on a required key": {
        "definitions": {"kind": {"type": "string", "enum": ["note", "input"]}},
        "type": "object", "required": ["kind"], "properties": {"kind": {"$ref": "#/definitions/kind"}},
        "allOf": [{"if": {"properties": {"kind": {"const": kind}}},
                   "then": {"type": "object", "required": ["kind", field], "additionalProperties": False,
                            "properties": {"kind": {"$ref": "#/definitions/kind"}, field: {"type": "string",
                                                                                            "maxLength": 24}}}}
                  for kind, field in (("note", "text"), ("input", "label"))]},
    "overlapping oneOf": {
        "type": "object", "required": ["contact"],
        "properties": {"contact": {"type": "object", "oneOf": [
            {"properties": {"email": {"type": "string"}}}, {"properties": {"phone": {"type": "string"}}}]}}},
}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_schemas_the_engines_read_wider_are_served_valid_greedy_and_sampled(stack, shape):
    _, _, replica, _ = stack
    schema = SHAPES[shape]
    before = _requests(replica)
    replies = []
    # Greedy, then sampled replies until two have finished: the fixture writes junk strings at
    # temperature 1 and may run one to max_tokens (a clean-clone run saw two of two), which is
    # served (200) but cannot be judged. Every reply is asked for once; none is re-asked.
    samplings = [{"temperature": 0}] + [{"temperature": 1.0, "seed": seed} for seed in range(11, 17)]
    for sampling in samplings:
        r = _proxy(stack, _schema_body(schema, max_tokens=128, messages=DOCUMENT, **sampling))
        assert r.status_code == 200, (shape, sampling, r.text[:300])
        choice = r.json()["choices"][0]
        replies.append((sampling.get("seed"), choice["finish_reason"], choice["message"]["content"]))
        if sum(1 for seed, finish, _ in replies if seed is not None and finish == "stop") >= 2:
            break
    finished = [text for _, finish, text in replies if finish == "stop"]
    assert replies[0][1] == "stop", (shape, replies[0])  # greedy finishes
    assert len(finished) >= 3, (shape, replies)  # greedy and two sampled
    for text in finished:
        jsonschema.validate(json.loads(text), schema)
    after = _requests(replica)
    assert after["schema_violations"] == before["schema_violations"], (shape, replies)


def test_sampled_replies_to_a_slice_of_the_bench_are_valid_or_cut_never_withheld(stack):
    """The sampled property test's CI slice (tests/bench/schema_bench.py runs all of it): the
    first schema of each JSONSchemaBench split and the first the request path says again in
    another form, each twice at temperature 1 through GPUStack's /v1 with the OpenAI SDK. Every
    reply valid or cut by max_tokens, a refusal only as a 400 before any token, nothing withheld
    (each schema here has valid replies), nothing invalid delivered."""
    import random

    from tests.bench.schema_bench import property_slice, run_requests, withheld_lines

    server, api, replica, _ = stack
    paths = property_slice(DEFAULT_BENCH)
    assert len(paths) >= 16 and any("calculate_area" in p.stem for p in paths), paths
    seed = random.randrange(1, 10 ** 6)
    before = _requests(replica)
    results = run_requests(server.url, api.api_key, SERVED_NAME, paths, 192, 2, temperature=1.0, samples=2, seed=seed)
    classes = {c: sum(r["class"] == c for r in results) for c in ("valid", "cut", "refused", "withheld", "invalid",
                                                                   "error")}
    print(f"seed {seed}: {classes}")
    bad = withheld_lines(results) + [f"{r['path']}: {r['detail']}" for r in results
                                     if r["class"] == "error" or (r["class"] == "refused" and r["status"] != 400)]
    assert not bad, (seed, bad)
    assert classes["valid"] >= len(results) // 2, (seed, classes)  # mostly served, not mostly cut
    # Sampled, not greedy: the two samples of a schema differ for most schemas.
    replies: Dict[str, List[str]] = {}
    for r in results:
        replies.setdefault(r["path"], []).append(r["content"])
    assert sum(len(set(both)) > 1 for both in replies.values()) >= len(paths) // 2, (seed, replies)
    after = _requests(replica)
    assert after["schema_violations"] == before["schema_violations"], (seed, before, after)


def test_both_engines_give_the_same_reply_with_grammar_forced_drafts(stack):
    """Greedy: the reply is the target model's whichever engine holds the grammar, and the
    drafting layer builds forced drafts over llguidance too (the annotation picks it)."""
    _, _, replica, _ = stack
    replies = []
    for mark in ({}, {"x-dspark-engine": "llguidance"}):
        counters = replica.info()["drafting"]["counters"]
        r = _proxy(stack, _schema_body({**ORDER_SCHEMA, **mark}, max_tokens=96))
        assert r.status_code == 200, r.text[:300]
        replies.append(r.json()["choices"][0]["message"]["content"])
        now = replica.info()["drafting"]["counters"]
        assert now["forced_proposed"] > counters["forced_proposed"], (mark, now)
        assert (now["requests_drafted_over_llguidance"] - counters["requests_drafted_over_llguidance"]) == len(mark)
    assert replies[0] == replies[1]
    jsonschema.validate(json.loads(replies[0]), ORDER_SCHEMA)


# ---- the OpenAI SDK's JSON paths through GPUStack ---------------------------------------------

class Order(BaseModel):
    user_id: int
    action: str
    amount: float


def test_sdk_parse_with_a_pydantic_model(client):
    completion = client.chat.completions.parse(model=SERVED_NAME, messages=MESSAGES, response_format=Order,
                                               max_tokens=128, temperature=0)
    choice = completion.choices[0]
    assert choice.finish_reason in ("stop", "length")
    if choice.finish_reason == "stop":
        assert isinstance(choice.message.parsed, Order)


def test_sdk_streaming_json_object_and_completions(client):
    chunks = list(client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=128,
                                                 temperature=0, stream=True,
                                                 response_format={"type": "json_object"}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish and (finish[-1] != "stop" or json.loads(text) is not None)
    plain = client.chat.completions.create(model=SERVED_NAME, messages=MESSAGES, max_tokens=128, temperature=0,
                                           response_format={"type": "json_object"})
    if plain.choices[0].finish_reason == "stop":
        json.loads(plain.choices[0].message.content)
    completion = client.completions.create(model=SERVED_NAME, prompt="Generate one order as JSON.", max_tokens=96,
                                           temperature=0)
    if completion.choices[0].finish_reason == "stop":
        json.loads(completion.choices[0].text)  # the JSON default applies to completions too


# ---- part 3: tool calls -----------------------------------------------------------------------

def _streamed_tool_calls(stream) -> List[dict]:
    calls: dict = {}
    for chunk in stream:
        if not chunk.choices:
            continue
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"name": "", "arguments": ""})
            if delta.function and delta.function.name:
                call["name"] += delta.function.name
            if delta.function and delta.function.arguments:
                call["arguments"] += delta.function.arguments
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_constrained_tool_calls_validate_against_the_parameters(client, stack, tool_choice, stream):
    _, _, replica, _ = stack
    before = (replica.info()["drafting"]["counters"] or {}).get("requests_with_grammar", 0)
    choice = {"type": "function", "function": {"name": "place_order"}} if tool_choice == "named" else "required"
    kwargs = dict(model=SERVED_NAME, messages=MESSAGES, tools=[ORDER_TOOL, LOOKUP_TOOL], tool_choice=choice,
                  max_tokens=200, temperature=0)
    if stream:
        calls = _streamed_tool_calls(client.chat.completions.create(stream=True, **kwargs))
    else:
        message = client.chat.completions.create(**kwargs).choices[0].message
        calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
    assert calls, "no tool call came back"
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (ORDER_TOOL, LOOKUP_TOOL)}
    for call in calls:
        if tool_choice == "named":
            assert call["name"] == "place_order"
        jsonschema.validate(json.loads(call["arguments"]), schemas[call["name"]])
    # The tool-call grammar is a grammar like any other: the drafting layer saw it.
    after = (replica.info()["drafting"]["counters"] or {}).get("requests_with_grammar", 0)
    assert after > before


@pytest.mark.parametrize("stream", [False, True])
def test_auto_tool_choice_answers(client, stream):
    kwargs = dict(model=SERVED_NAME, messages=MESSAGES, tools=[ORDER_TOOL], tool_choice="auto", max_tokens=64,
                  temperature=0)
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    else:
        message = client.chat.completions.create(**kwargs).choices[0].message
        for call in message.tool_calls or []:  # whatever the tiny model chose, calls carry JSON arguments
            json.loads(call.function.arguments)
        assert message.tool_calls or message.content is not None


def test_an_unusable_tool_schema_is_a_400(stack):
    bad_tool = {"type": "function", "function": {"name": "f", "parameters": LOOKBEHIND_SCHEMA}}
    r = _proxy(stack, {"tools": [bad_tool], "tool_choice": "required"})
    assert r.status_code == 400, r.text[:300]
    assert "tools[0].function.parameters is not usable" in r.json()["error"]["message"]


def test_info_says_which_tool_call_options(stack):
    _, _, replica, keyed = stack
    info = replica.info()
    tools = info["tool_calls"]
    # The fixture's template writes calls as <tool_call>...</tool_call>: vLLM's hermes parser,
    # which has structural tags, so strict tools are constrained under auto.
    assert tools["parser"] == "hermes" and tools["source"] == "launcher" and "<tool_call>" in tools["reason"]
    assert tools["strict"]["tools"] == "flagged" and tools["strict"]["under_auto"] is True
    argv = info["vllm_argv"]
    assert "--enable-auto-tool-choice" in argv and argv[argv.index("--tool-call-parser") + 1] == "hermes"
    assert "--tool-strict-level" not in argv
    keyed_info = httpx.get(f"{keyed.base_url}/dspark/info", headers={"Authorization": f"Bearer {API_KEY}"},
                           timeout=5).json()
    assert keyed_info["tool_calls"]["strict"]["tools"] == "all"
    assert keyed_info["vllm_argv"][keyed_info["vllm_argv"].index("--tool-strict-level") + 1] == "parameter"


# Two tools whose schemas the fixture's own calls break (tests/bench/tools_and_streams.py says
# how), the benchmark's prompts that ask for a call and one that only chats.
AUTO_PROMPTS = PROMPTS[:8]


def _auto_round(client, tools, stream, count=16):
    """`count` requests (prompts above, sampled at temperature 0.8 with a seed each) with
    tool_choice auto, 8 at a time: the calls of the replies that ended by themselves, how many
    of those were plain text, and how many replies max_tokens cut (a cut call is not a call)."""
    def one(i):
        kwargs = dict(model=SERVED_NAME, messages=[{"role": "user", "content": AUTO_PROMPTS[i % len(AUTO_PROMPTS)]}],
                      tools=tools, tool_choice="auto", max_tokens=160, temperature=0.8, seed=i)
        if stream:
            chunks = list(client.chat.completions.create(stream=True, **kwargs))
            finish = next((c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason), None)
            return _streamed_tool_calls(chunks), finish
        choice = client.chat.completions.create(**kwargs).choices[0]
        return ([{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []],
                choice.finish_reason)

    with ThreadPoolExecutor(8) as pool:
        replies = list(pool.map(one, range(count)))
    whole = [calls for calls, finish in replies if finish != "length"]
    return [call for calls in whole for call in calls], sum(1 for calls in whole if not calls), len(replies) - len(whole)


def _broken(calls, tools):
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in tools}
    return [c for c in calls if c["name"] not in schemas or not _validates(c["arguments"], schemas[c["name"]])]


@pytest.mark.parametrize("stream", [False, True])
def test_strict_tools_under_auto_every_call_names_a_tool_and_validates(client, stack, stream):
    """tool_choice auto through GPUStack's /v1 with the SDK, the fixture sampling at 0.8: with
    `strict: true` every call names one of the tools and its arguments validate (vLLM's
    structural tags from the hermes parser); the same requests with strict off break the schema
    in some calls — the constraint is what made the difference. Plain-text replies stay allowed."""
    _, _, replica, _ = stack
    before = (replica.info()["drafting"]["counters"] or {}).get("requests_with_grammar", 0)
    strict_calls, strict_text, strict_cut = _auto_round(client, _auto_tools(True), stream)
    free_calls, _, _ = _auto_round(client, _auto_tools(False), stream)
    assert len(strict_calls) >= 6, (strict_calls, strict_text, strict_cut)  # the fixture calls tools under auto
    assert _broken(strict_calls, _auto_tools(True)) == []
    assert len(_broken(free_calls, _auto_tools(False))) >= 2, free_calls
    # The structural tag is a grammar like any other: the drafting layer drafted inside it.
    after = (replica.info()["drafting"]["counters"] or {}).get("requests_with_grammar", 0)
    assert after >= before + 16


def test_strict_tools_all_constrains_tools_without_the_flag(stack):
    """`--dspark-strict-tools all` (this module's keyed replica): the same unflagged tools that
    break their schema on the open replica validate on this one."""
    _, _, _, keyed = stack
    client = openai.OpenAI(base_url=f"{keyed.base_url}/v1", api_key=API_KEY, max_retries=0, timeout=180)
    calls, _, _ = _auto_round(client, _auto_tools(False), stream=False)
    assert len(calls) >= 6 and _broken(calls, _auto_tools(False)) == [], calls


# ---- part 5: hostile requests -----------------------------------------------------------------

def _nested(depth):
    value: object = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _deep_schema(depth):
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HOSTILE = {
    "self_ref": ({"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": {"$ref": "#"}}}},
                 "leads back to itself"),
    "deep_body": ({"metadata_x": _nested(500)}, "nested"),
    "deep_schema": ({"response_format": {"type": "json_schema", "json_schema": {"name": "d", "schema": _deep_schema(250)}}},
                    "nested"),
    "many_properties": ({"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": {
        "type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(20000)}}}}}, "20000 properties"),
    "huge_enum": ({"response_format": {"type": "json_schema", "json_schema": {"name": "e", "schema": {
        "type": "string", "enum": [f"value-{i}" for i in range(20000)]}}}}, "enum has 20000 values"),
    "catastrophic_regex": ({"response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(a+)+$"}}}}}}, "nests an unbounded quantifier"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_requests_are_400s_naming_the_problem(stack, case):
    _, _, replica, _ = stack
    body, words = HOSTILE[case]
    direct = httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=60, json={
        "model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 16, **body})
    assert direct.status_code == 400, direct.text[:300]
    assert words in direct.json()["error"]["message"], direct.json()
    proxied = _proxy(stack, body)
    assert proxied.status_code == 400, proxied.text[:300]
    message = proxied.json()["error"]["message"]
    # Through GPUStack the same words, except a body too deep for GPUStack's own parser (its 400).
    assert words in message or (case == "deep_body" and "recursion" in message), message
    assert replica.ready_status(5) == 200


def test_the_replica_stays_up_under_hostile_requests_in_parallel(stack):
    _, _, replica, _ = stack

    def hammer(case):
        with httpx.Client(base_url=replica.base_url, timeout=60) as c:
            return c.post("/v1/chat/completions", json={"model": SERVED_NAME, "messages": MESSAGES,
                                                        "max_tokens": 16, **HOSTILE[case][0]}).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(hammer, sorted(HOSTILE) * 2))
    assert codes == [400] * len(codes)
    ok = httpx.post(f"{replica.base_url}/v1/chat/completions", timeout=120, json={
        "model": SERVED_NAME, "messages": MESSAGES, "max_tokens": 64, "temperature": 0})
    assert ok.status_code == 200


# ---- part 4: no secrets on the open endpoint --------------------------------------------------

def test_info_needs_the_api_key_and_shows_no_secret(stack):
    _, _, _, keyed = stack
    assert httpx.get(f"{keyed.base_url}/dspark/ready", timeout=5).status_code == 200  # GPUStack's probe: open
    refused = httpx.get(f"{keyed.base_url}/dspark/info", timeout=5)
    assert refused.status_code == 401 and "API key" in refused.json()["error"]["message"]
    wrong = httpx.get(f"{keyed.base_url}/dspark/info", headers={"Authorization": "Bearer nope"}, timeout=5)
    assert wrong.status_code == 401
    info = httpx.get(f"{keyed.base_url}/dspark/info", headers={"Authorization": f"Bearer {API_KEY}"}, timeout=5)
    assert info.status_code == 200
    text = info.text
    assert API_KEY not in text and HF_TOKEN not in text and ENV_SECRET not in text
    argv = info.json()["vllm_argv"]
    assert argv[argv.index("--api-key") + 1] == "REDACTED" and argv[argv.index("--hf-token") + 1] == "REDACTED"
    assert info.json()["auth"] == {"api_key_required": True}
    # vLLM's own API still wants the key; the warmup (which sends it) went through.
    assert httpx.get(f"{keyed.base_url}/v1/models", timeout=5).status_code == 401
    assert info.json()["warmup"]["succeeded"] == 1


def test_the_launchers_log_shows_no_secret(stack):
    _, _, _, keyed = stack
    log = keyed.process.log_tail(2_000_000)
    assert "vLLM argv:" in log and "REDACTED" in log
    for secret in (API_KEY, HF_TOKEN, ENV_SECRET):
        assert secret not in log, secret


def test_open_replica_info_stays_open(stack):
    _, _, replica, _ = stack
    info = httpx.get(f"{replica.base_url}/dspark/info", timeout=5)
    assert info.status_code == 200 and info.json()["auth"] == {"api_key_required": False}


def test_the_named_refusals_agree_with_vllms_own_check_on_the_bench():
    """Same verdict as vLLM's has_xgrammar_unsupported_json_features for every bench schema
    (that function is vLLM's; run in the worker venv)."""
    if not worker_python().exists():
        pytest.skip("no worker venv")
    script = r"""
import json, pathlib, sys
from vllm.v1.structured_output.backend_xgrammar import has_xgrammar_unsupported_json_features as vllm_says
from gpustack_dspark.worker.schema_check import xgrammar_unsupported
bench = pathlib.Path(sys.argv[1])
diff = [p.name for p in sorted(bench.glob("*/*.json"))
        if isinstance(s := json.loads(p.read_text()), dict) and vllm_says(s) != (xgrammar_unsupported(s) is not None)]
print(json.dumps(diff))
"""
    bench = DEFAULT_BENCH
    if not bench.exists():
        pytest.skip("no JSONSchemaBench data")
    done = subprocess.run([str(worker_python()), "-c", script, str(bench)], capture_output=True, text=True,
                          timeout=300, env=worker_env())
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
