"""`enum`/`const` beside a `type` that excludes some of their values (worker/enum_type.py), judged
with jsonschema itself; and the engine plan for such schemas (the compilers' verdicts stood in
for: the real ones run in the worker's venv, tests/integration/test_request_path.py)."""

import copy
import json
from pathlib import Path

import jsonschema
import pytest

from gpustack_dspark.worker import enum_type, schema_check

DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
# JSONSchemaBench Github_trivial/o30283, as the benchmark met it: xgrammar wrote "mode": "AAA".
CLUSTERFILES = {"properties": {"mode": {"enum": ["all", "bookmarks", "ssl", "htmlinjection", "imports", "misc",
                                                 "dns", "krb", "AAA", "app_catalog", "all_plus_misc",
                                                 "all_minus_misc"], "type": "object"}},
                "title": "clusterfiles", "type": "object"}
DOCS = ({}, {"mode": "AAA"}, {"mode": {}}, {"mode": 1}, {"mode": None}, {"other": 1}, {"n": 2}, {"n": 2.0},
        {"n": 2.5}, {"n": True}, {"n": "2"}, {"k": "a"}, {"k": 1}, {"k": None}, {"k": [1]}, [], "x", 3)


def test_the_bench_schema_is_the_one_the_test_names():
    path = DATA / "Github_trivial" / "o30283.json"
    if path.exists():
        assert json.loads(path.read_text()) == CLUSTERFILES


@pytest.mark.parametrize("node, kept", [
    ({"enum": ["a", "b"], "type": "object"}, []),
    ({"enum": ["a", 1, None], "type": ["string", "null"]}, ["a", None]),
    ({"enum": [1, 1.0, 1.5, True], "type": "integer"}, [1, 1.0]),
    ({"enum": [1, 1.5, True], "type": "number"}, [1, 1.5]),
    ({"const": "a", "type": "integer"}, []),
    ({"enum": [[1], {"x": 1}, "s"], "type": "array"}, [[1]]),
])
def test_admitted_keeps_the_values_of_the_type(node, kept):
    assert enum_type.admitted(node) == kept
    for value in node.get("enum", [node.get("const")]):  # what jsonschema itself admits
        assert jsonschema.Draft7Validator(node).is_valid(value) == (json.dumps(value) in map(json.dumps, kept)), value


@pytest.mark.parametrize("node", [
    {"enum": ["a", "b"], "type": "string"}, {"enum": ["a"]}, {"type": "object"}, {"const": 3, "type": "integer"},
    {"enum": "not a list", "type": "string"}, {"enum": [1], "type": 7}])
def test_nothing_to_narrow(node):
    assert enum_type.admitted(node) is None


def test_where_every_document_must_have_a_value_of_none_it_is_unsatisfiable():
    required = {**CLUSTERFILES, "required": ["mode"]}
    problem = enum_type.unsatisfiable(required)
    assert problem and "at mode" in problem and "'all', 'bookmarks'" in problem and "'object'" in problem, problem
    assert enum_type.unsatisfiable(CLUSTERFILES) is None  # optional: {} is valid
    assert not any(jsonschema.Draft7Validator(required).is_valid(d) for d in DOCS)
    nested = {"type": "object", "required": ["a"], "properties": {"a": {"allOf": [{"const": 1, "type": "string"}]}}}
    assert "at a" in enum_type.unsatisfiable(nested)
    assert enum_type.unsatisfiable({"const": "x", "type": "number"}).startswith("no document satisfies the schema: at (root)")
    via_ref = {"type": "object", "required": ["m"], "properties": {"m": {"$ref": "#/$defs/m"}},
               "$defs": {"m": {"enum": [1, 2], "type": "string"}}}
    assert "at m, enum [1, 2]" in enum_type.unsatisfiable(via_ref)
    # no type: a number satisfies required/properties without having the property
    assert enum_type.unsatisfiable({"required": ["mode"], "properties": CLUSTERFILES["properties"]}) is None


@pytest.mark.parametrize("schema", [
    CLUSTERFILES,
    {"type": "object", "properties": {"n": {"enum": [1, 2.5, "3", True], "type": "integer"},
                                      "k": {"enum": ["a", 1, None], "type": ["string", "null"]}}},
    {"$defs": {"m": {"enum": ["x", 2], "type": "integer"}}, "type": "object",
     "properties": {"n": {"$ref": "#/$defs/m"}, "k": {"anyOf": [{"const": "a", "type": "null"}, {"type": "string"}]}}},
])
def test_the_narrowed_copy_admits_only_what_the_schema_admits(schema):
    before = copy.deepcopy(schema)
    narrowed, notes = enum_type.narrowed(schema)
    assert schema == before  # the original is untouched
    assert notes and narrowed is not schema and enum_type.conflict(schema)
    original, grammar = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(narrowed)
    for doc in DOCS:
        assert not grammar.is_valid(doc) or original.is_valid(doc), doc  # sound
    declared = set(schema.get("properties", {}))
    for doc in ({}, {"n": 2}, {"k": "a"}, {"k": None}):  # and loses nothing of the declared keys
        if set(doc) <= declared:
            assert grammar.is_valid(doc) == original.is_valid(doc), doc
    if schema is CLUSTERFILES:
        assert narrowed == {**CLUSTERFILES, "properties": {}, "additionalProperties": False}
        assert "mode" in CLUSTERFILES["properties"]


def test_an_open_object_keeps_a_property_that_admits_no_value():
    # left out of `properties`, the key would be allowed with any value: the copy keeps it, the
    # plan says the grammar is not exact, and the reply check judges the reply
    schema = {"type": "object", "properties": {"mode": CLUSTERFILES["properties"]["mode"], "n": {"type": "integer"}},
              "additionalProperties": True}
    narrowed, notes = enum_type.narrowed(schema)
    assert notes == [] and narrowed == schema and enum_type.conflict(narrowed) == "enum beside type 'object' at /properties/mode"


def test_a_property_a_pattern_could_admit_stays():
    schema = {**CLUSTERFILES, "patternProperties": {"^m": {"type": "string"}}}
    narrowed, notes = enum_type.narrowed(schema)
    assert notes == [] and narrowed == schema  # taken out, "mode": "x" would pass the pattern alone


def test_schemas_without_the_conflict_are_returned_as_they_are():
    for schema in ({"type": "object", "properties": {"a": {"enum": ["x"], "type": "string"}}}, {"enum": [1, "a"]}, True):
        assert enum_type.conflict(schema) is None and enum_type.narrowed(schema) == (schema, [])


def _verdicts(monkeypatch, llguidance):
    """xgrammar compiles everything (it does compile these: it ignores the type); llguidance as given."""
    monkeypatch.setattr(schema_check, "check_schema", lambda schema, timeout_s=10: schema_check.structural_problem(schema))
    monkeypatch.setattr(schema_check, "llguidance_problem", lambda schema, **kw: llguidance)


def test_the_plan_serves_such_a_schema_with_llguidance_else_xgrammar_on_the_narrowed_copy(monkeypatch):
    _verdicts(monkeypatch, None)
    plan = schema_check.plan_engine(CLUSTERFILES, ("xgrammar", "llguidance"))
    # marked: vLLM's frontend would keep it on xgrammar, the engine's manager reads the mark
    assert (plan.engine, plan.exact, plan.problem) == ("llguidance", True, None)
    assert plan.grammar_schema == {**CLUSTERFILES, "x-dspark-engine": "llguidance"}
    plan = schema_check.plan_engine(CLUSTERFILES, ("xgrammar",))
    assert (plan.engine, plan.exact) == ("xgrammar", True)
    assert plan.grammar_schema == enum_type.narrowed(CLUSTERFILES)[0]
    _verdicts(monkeypatch, "llguidance cannot")  # llguidance refuses: xgrammar narrowed
    assert schema_check.plan_engine(CLUSTERFILES, ("xgrammar", "llguidance")).grammar_schema["properties"] == {}
    # a second attempt after llguidance: xgrammar narrowed too
    again = schema_check.second_plan(CLUSTERFILES, plan.__class__("llguidance", CLUSTERFILES, []), ("xgrammar", "llguidance"))
    assert again.engine == "xgrammar" and again.grammar_schema["properties"] == {}
    # where no document is valid: a 400 before any token
    plan = schema_check.plan_engine({**CLUSTERFILES, "required": ["mode"]}, ("xgrammar", "llguidance"))
    assert plan.problem and "no document satisfies the schema: at mode" in plan.problem
    # an open object: xgrammar as it is, not exact (the reply check judges the reply)
    open_ = {**CLUSTERFILES, "additionalProperties": True}
    plan = schema_check.plan_engine(open_, ("xgrammar",))
    assert plan.engine == "xgrammar" and plan.grammar_schema == open_ and not plan.exact
    # a schema without the conflict is unchanged: xgrammar as it is
    plain = {"type": "object", "properties": {"mode": {"enum": ["a"], "type": "string"}}}
    assert (schema_check.plan_engine(plain, ("xgrammar", "llguidance")).engine,
            schema_check.plan_engine(plain, ("xgrammar", "llguidance")).grammar_schema) == ("xgrammar", plain)


def test_types_are_counted_as_the_schemas_own_draft_counts_them():
    """Draft 4 counts 1.0 as a number but not an integer; from draft 6 on it is both. The reply
    check validates with the schema's own draft, so the narrowing must agree with it."""
    node = {"enum": [1, 1.0, 2.5], "type": "integer"}
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "object",
              "properties": {"n": node}}
    assert enum_type.admitted(node) is not None and enum_type.admitted(node) == [1, 1.0]
    copy4, notes = enum_type.narrowed(draft4)
    assert copy4["properties"]["n"]["enum"] == [1] and notes
    for value in node["enum"]:  # what jsonschema admits under draft 4, the narrowed copy admits
        doc = {"n": value}
        assert jsonschema.Draft4Validator(draft4).is_valid(doc) == jsonschema.Draft4Validator(copy4).is_valid(doc)
    later = {**draft4, "$schema": "http://json-schema.org/draft-07/schema#"}
    assert enum_type.narrowed(later)[0]["properties"]["n"]["enum"] == [1, 1.0]
    assert enum_type.unsatisfiable({"$schema": "http://json-schema.org/draft-04/schema#", "const": 1.0,
                                    "type": "integer"}).startswith("no document satisfies the schema")
    assert enum_type.unsatisfiable({"const": 1.0, "type": "integer"}) is None  # 2020-12: 1.0 is an integer
    assert enum_type.admitted({"enum": ["a"], "type": "thing"}) == []  # not a JSON type: admits nothing
