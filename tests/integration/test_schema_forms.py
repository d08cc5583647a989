"""The schema shapes the grammar engines read wider than JSON Schema, served by what the
compiled grammar lets through: keywords beside `oneOf`/`anyOf`, keywords without a `type`,
`if`/`then` conditionals on a required key (worker/normalize.py), and the narrowed retry after a
reply that satisfied two `oneOf` branches (schema_check.narrowed_schema). Checked with the real
compilers of the worker's venv against the fixture's vocabulary, token by token: what the plan
the request path makes admits, and, beside it, what the grammar it replaces admits (the plan
made without normalize.py; for a retry, the first attempt's grammar), which lets through a reply
no valid one is. The whole path through a replica is in test_request_path.py."""

import json
import subprocess

import pytest

from gpustack_dspark.devstack.replica import TARGET_MODEL, worker_env, worker_python
from tests.support.schema_shapes import AREA, FORM, PETS

pytestmark = pytest.mark.integration

CASES = {
    # name: (schema, the first reply that broke a oneOf or None for the first attempt, {text: admitted})
    "oneOf beside siblings": (AREA, None, {'{"dimensions":19.65}': False, '{"radius":"a"}': False, "5": False,
                                           '{"radius":1}': True, '{"length":1,"width":2}': True}),
    "anyOf beside siblings": ({"type": "object", "properties": {"r": {"type": "number"}},
                               "anyOf": [{"required": ["r"]}, {"required": ["x"]}]},
                              None, {'{"r":"a"}': False, "5": False, '{"r":1}': True}),
    "string keywords without a type": ({"minLength": 10, "maxLength": 10, "pattern": "^[a-z]+$"}, None,
                                       {'" send "': False, '"abcdefghij"': True, "1": True, "null": True}),
    "number keywords without a type": ({"minimum": 5}, None, {"1": False, "7": True, '"a"': True}),
    "overlapping oneOf, narrowed": (PETS, '{"cat":"x"}', {'{"cat":"x"}': False, '{"cat":1}': True, "{}": False}),
    "if/then conditionals on a required key": (FORM, None, {
        '{"kind":"note","text":"a"}': True, '{"kind":"note","text":"a","label":"b"}': False, '{"kind":"input"}': False,
        '{"kind":"choice"}': True, '{"kind":"input","label":"x","optional":true}': True}),
    "required-only oneOf, narrowed": (AREA, '{"radius":1,"length":2,"width":3}',
                                      {'{"radius":1,"length":2,"width":3}': False, '{"radius":1,"base":3}': False,
                                       '{"radius":1}': True, '{"radius":1,"width":3}': True}),
}

SCRIPT = r"""
import json, sys
import llguidance, xgrammar
from transformers import AutoTokenizer
from gpustack_dspark.worker import normalize, schema_check as sc

model, cases = sys.argv[1], json.loads(sys.argv[2])
sc.use_model_tokenizer(model, None)
tokenizer = AutoTokenizer.from_pretrained(model)
engines = ("xgrammar", "llguidance")

def admits(engine, schema, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    if engine == "llguidance":
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps({k: v for k, v in schema.items() if k != sc.ENGINE_MARK}),
            defaults={"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"})
        matcher = llguidance.LLMatcher(sc._llguidance_tokenizer(), grammar)
        return matcher.try_consume_tokens(ids) == len(ids) and matcher.is_accepting()
    compiled = sc._grammar_compiler().compile_json_schema(json.dumps(schema), any_whitespace=False,
                                                        separators=(",", ":"))
    matcher = xgrammar.GrammarMatcher(compiled)
    return all(matcher.accept_token(t) for t in ids) and matcher.accept_token(tokenizer.eos_token_id)

def as_written(schema):  # the plan the request path made before normalize.py
    said = normalize.normalized
    normalize.normalized = lambda s: (s, [])
    try:
        return sc.plan_engine(schema, engines)
    finally:
        normalize.normalized = said

out = {}
for name, (schema, reply, texts) in cases.items():
    first = sc.plan_engine(schema, engines)
    plan = sc.narrowed_plan(schema, reply, engines) if reply else first
    before = first if reply else as_written(schema)
    out[name] = {"engine": plan.engine, "problem": plan.problem, "dropped": plan.dropped,
                 "normalized": plan.normalized,
                 "planned": {t: admits(plan.engine, plan.grammar_schema, t) for t in texts},
                 "before": {t: admits(before.engine, before.grammar_schema, t) for t in texts}}
print(json.dumps(out))
"""


def test_the_planned_grammars_admit_what_the_schema_admits_where_xgrammar_as_written_does_not():
    done = subprocess.run([str(worker_python()), "-c", SCRIPT, str(TARGET_MODEL), json.dumps(CASES)],
                          capture_output=True, text=True, env=worker_env(), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    for name, (_, reply, expected) in CASES.items():
        got = found[name]
        print(name, got)
        assert got["problem"] is None and got["planned"] == expected, (name, got)
        if reply is None:
            assert got["normalized"] and not got["dropped"], (name, got)  # exact: said again, nothing dropped
    # What these plans replace admits a reply no valid one is: the plan made without
    # normalize.py (first attempts), the first attempt's grammar (narrowed retries).
    wider = [name for name, (_, _, expected) in CASES.items()
             if any(found[name]["before"][t] and not ok for t, ok in expected.items())]
    assert len(wider) == len(CASES), wider
