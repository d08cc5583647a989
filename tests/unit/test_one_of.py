"""oneOf shapes decided before any token (worker/one_of.py): no document can satisfy them, or
an always-true branch that means "none of the others". Judged with jsonschema itself."""

import json
from pathlib import Path

import jsonschema
import pytest

from gpustack_dspark.worker import one_of
from gpustack_dspark.worker.schema_check import plan_engine

AREA = {  # every key of three required-only branches required beside them (JSONSchemaBench)
    "type": "object", "required": ["shape", "dimensions"],
    "properties": {"shape": {"type": "string"}, "dimensions": {
        "type": "object", "required": ["radius", "side_length", "base", "height"],
        "properties": {k: {"type": "number"} for k in ("radius", "side_length", "base", "height")},
        "oneOf": [{"required": ["radius"]}, {"required": ["side_length"]}, {"required": ["base", "height"]}]}}}
TREE = {  # "#ref" for "$ref": the second branch asserts nothing
    "$schema": "http://json-schema.org/draft-04/schema", "$ref": "#/definitions/One",
    "definitions": {
        "Two": {"oneOf": [{"properties": {"threes": {"type": "array"}}}, {"#ref": "#/definitions/Three"}]},
        "One": {"oneOf": [{"properties": {"twos": {"type": "array", "items": {"$ref": "#/definitions/Two"}}}},
                          {"#ref": "#/definitions/Two"}]}}}


def test_branches_that_always_hold_together_make_the_schema_unsatisfiable():
    problem = one_of.unsatisfiable(AREA)
    assert problem and "at dimensions" in problem and "branches 0, 1, 2" in problem, problem
    assert "no document satisfies" in plan_engine(AREA, ["xgrammar", "llguidance"]).problem


@pytest.mark.parametrize("schema", [
    {**AREA, "required": ["shape"]},  # dimensions optional: leaving it out satisfies the schema
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "required": ["a"]},  # only one branch implied
    {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]},
    {"anyOf": [{}, {}]},
    {"not": {"oneOf": [{}, {}]}},  # under not: satisfiable
    # no type: a number satisfies required/properties without having x
    {"required": ["x"], "properties": {"x": {"oneOf": [{}, {}]}}},
    # draft-07 ignores a oneOf beside a $ref
    {"$schema": "http://json-schema.org/draft-07/schema#", "$ref": "#/definitions/a",
     "oneOf": [{}, {}], "definitions": {"a": {"type": "string"}}},
])
def test_satisfiable_schemas_are_not_refused(schema):
    assert one_of.unsatisfiable(schema) is None


def test_an_always_true_branch_is_served_as_the_negation_of_the_others():
    rewritten, notes = one_of.rewrite(TREE)
    assert notes and "oneOf" not in json.dumps(rewritten["definitions"]["One"])
    assert rewritten is not TREE and "oneOf" in TREE["definitions"]["One"]  # the original is untouched
    original, grammar = jsonschema.Draft4Validator(TREE), jsonschema.Draft4Validator(rewritten)
    for doc in ({"twos": 5}, {"twos": "x"}, {"twos": [{"threes": 1}]}, {"twos": [{}]}, {}, [], "x", {"other": 1}):
        # sound: whatever the grammar's schema allows, the original allows
        assert not grammar.is_valid(doc) or original.is_valid(doc), doc
    assert grammar.is_valid({"twos": 5}) and original.is_valid({"twos": 5})
    assert not original.is_valid({}) and not grammar.is_valid({})  # matches both branches


@pytest.mark.parametrize("schema", [
    {"type": "string"}, {"type": ["object", "null"]}, {"type": "integer"}, {"type": "number", "minimum": 3},
    {"properties": {"a": {"type": "string"}, "b": {"type": "array"}}}, False,
])
def test_negations_are_sound(schema):
    negation = one_of.negated(schema)
    assert negation is not None
    validator = jsonschema.Draft202012Validator(schema)
    neg = jsonschema.Draft202012Validator(negation)
    samples = [None, True, 0, 1.5, -3, "s", [], [1], {}, {"a": 1}, {"a": "x", "b": 2}, {"b": []}]
    assert any(neg.is_valid(x) for x in samples)
    for x in samples:
        assert not (neg.is_valid(x) and validator.is_valid(x)), (schema, negation, x)


def test_what_has_no_sound_negation_is_left_alone():
    for schema in ({"required": ["a"]}, {"enum": [1, 2]}, {"$ref": "#/x"}, {}, True):
        assert one_of.negated(schema) is None
    both_typed = {"oneOf": [{"enum": [1]}, {}]}
    assert one_of.rewrite(both_typed) == (both_typed, [])


def test_the_plan_serves_the_rewrite_and_says_so():
    plan = plan_engine(TREE, ["xgrammar", "llguidance"])
    assert plan.problem is None and any("always-true branch" in d for d in plan.dropped), plan
    assert jsonschema.Draft4Validator(plan.grammar_schema).is_valid({"twos": 1})
