"""A string with minLength/maxLength: the engine the request path picks keeps JSON's string syntax.

xgrammar 0.2 (vLLM 0.32's) compiles such a string to a character class that admits raw control
characters, which JSON forbids inside a string, and drops the escapes (xgrammar issue #800):
sampling writes a raw tab now and then and the reply check withholds the reply. The request
path serves these schemas with llguidance (`schema_check.length_bounded_string`). Checked here
with the real compilers of the worker's venv against the fixture's vocabulary: the plan the
request path makes, and what the planned grammar lets through, token by token, beside what
xgrammar's would (printed). The whole path through a replica is in test_request_path.py.
"""

import json
import subprocess

import pytest

from gpustack_dspark.devstack.replica import TARGET_MODEL, worker_env, worker_python

pytestmark = pytest.mark.integration

SCRIPT = r"""
import json, sys
import llguidance, xgrammar
from transformers import AutoTokenizer
from gpustack_dspark.worker import schema_check as sc

model = sys.argv[1]
sc.use_model_tokenizer(model, None)
schema = {"type": "object", "properties": {"id": {"type": "string", "minLength": 2, "maxLength": 8}},
          "required": ["id"], "additionalProperties": False}
plan = sc.plan_engine(schema, ("xgrammar", "llguidance"))
tokenizer = AutoTokenizer.from_pretrained(model)
texts = {"plain": '{"id":"ab12"}', "tab": '{"id":"a\tb"}', "control": '{"id":"a\x01b"}',
         "escape": '{"id":"a\\nb"}', "too long": '{"id":"abcdefghij"}', "too short": '{"id":"a"}'}
grammar = llguidance.LLMatcher.grammar_from_json_schema(
    json.dumps({k: v for k, v in plan.grammar_schema.items() if k != sc.ENGINE_MARK}),
    defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
planned = {}
for name, text in texts.items():
    matcher = llguidance.LLMatcher(sc._llguidance_tokenizer(), grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    planned[name] = matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
compiled = sc._grammar_compiler().compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                    separators=(",", ":"))
xgr = {}
for name, text in texts.items():
    matcher = xgrammar.GrammarMatcher(compiled)
    ids = tokenizer.encode(text, add_special_tokens=False)
    xgr[name] = all(matcher.accept_token(t) for t in ids) and matcher.is_terminated() is False and \
        matcher.accept_token(tokenizer.eos_token_id)
print(json.dumps({"engine": plan.engine, "exact": plan.exact, "planned": planned, "xgrammar": xgr}))
"""


def test_a_length_bounded_string_is_served_by_an_engine_that_refuses_raw_control_characters():
    done = subprocess.run([str(worker_python()), "-c", SCRIPT, str(TARGET_MODEL)], capture_output=True, text=True,
                          env=worker_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(found)  # xgrammar's verdicts beside the planned engine's (its #800: tab and control let through)
    assert (found["engine"], found["exact"]) == ("llguidance", True), found
    assert found["planned"] == {"plain": True, "tab": False, "control": False, "escape": True,
                                "too long": False, "too short": False}, found
