"""Schemas said again in the forms the engines read (worker/normalize.py) and the narrowed
retry's exclusive forms (one_of.exclusive, one_of.failing_beside), judged by jsonschema itself
on seeded random schemas and instances: the rewrite admits exactly what the original admits,
and a form that says "not this branch" admits nothing the branch admits. The engines' side (what
the compiled grammars let through) is tests/integration/test_schema_forms.py."""

import random

import jsonschema
import pytest

from gpustack_dspark.worker import normalize, one_of
from gpustack_dspark.worker.schema_check import narrowed_schema
from tests.support.schema_shapes import AREA, FORM, PETS

KEYS = ("a", "b", "c")


def valid(schema, instance) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(instance)


def random_leaf(rng: random.Random):
    return rng.choice([
        {"type": "string"}, {"type": "integer"}, {"type": "number", "minimum": 2}, {"type": ["string", "null"]},
        {"minLength": 2}, {"maxLength": 1, "pattern": "^[a-z]*$"}, {"minimum": 1, "maximum": 5}, {"enum": [1, "x"]},
        {"multipleOf": 2}, {"items": {"type": "integer"}, "minItems": 1}, {}, {"const": "x"},
    ])


def random_object(rng: random.Random, depth: int):
    node = {}
    if rng.random() < 0.7:
        node["type"] = rng.choice(["object", "object", ["object", "string"], "string"])
    if rng.random() < 0.8:
        node["properties"] = {k: random_schema(rng, depth + 1) for k in rng.sample(KEYS, rng.randint(1, 3))}
    if rng.random() < 0.5:
        node["required"] = rng.sample(KEYS, rng.randint(1, 2))
    if rng.random() < 0.25:
        node["additionalProperties"] = False
    if rng.random() < 0.2:
        node["minLength"] = 3  # beside an object type: binds strings only
    return node


def random_schema(rng: random.Random, depth: int = 0):
    roll = rng.random()
    if depth >= 2 or roll < 0.35:
        return random_leaf(rng)
    node = random_object(rng, depth)
    if roll < 0.85:
        combinator = rng.choice(["oneOf", "anyOf"])
        node[combinator] = [rng.choice([random_schema(rng, depth + 1), {"required": rng.sample(KEYS, 1)},
                                        {"properties": {rng.choice(KEYS): random_leaf(rng)}}, True, False])
                            for _ in range(rng.randint(1, 3))]
    return node


def random_instance(rng: random.Random, depth: int = 0, keys=KEYS):
    kind = rng.randrange(8 if depth < 2 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind == 2:
        return rng.choice([0, 1, 2, 3, 4, 6, 7, -1])
    if kind == 3:
        return rng.choice([0.5, 2.5, 5.0])
    if kind in (4, 5):
        return rng.choice(["", "x", "ab", "abc", "ABCD", "a1"])
    if kind == 6:
        return [random_instance(rng, depth + 1) for _ in range(rng.randint(0, 2))]
    return {k: random_instance(rng, depth + 1) for k in rng.sample(keys, rng.randint(0, min(3, len(keys))))}


def test_the_rewrite_admits_exactly_what_the_schema_admits_on_random_schemas():
    rng = random.Random(20261207)
    rewritten = 0
    verdicts = {True: 0, False: 0}
    for _ in range(600):
        schema = random_schema(rng)
        said, notes = normalize.normalized(schema)
        rewritten += bool(notes)
        assert (said is schema) == (not notes)
        before, after = jsonschema.Draft202012Validator(schema), jsonschema.Draft202012Validator(said)
        for _ in range(40):
            instance = random_instance(rng)
            verdict = before.is_valid(instance)
            verdicts[verdict] += 1
            assert after.is_valid(instance) == verdict, (schema, said, instance)
    # The generator reaches both rewrites and both verdicts often: the check compares something.
    assert rewritten >= 150 and min(verdicts.values()) >= 2000, (rewritten, verdicts)


def test_keywords_beside_oneof_move_into_each_branch_in_a_form_xgrammar_reads():
    said, notes = normalize.normalized(AREA)
    assert notes == ["/: keywords beside oneOf moved into its branches"]
    assert said == {"oneOf": [{"type": "object", "properties": AREA["properties"], "required": r}
                              for r in (["radius"], ["length", "width"], ["base", "height"])]}
    assert "oneOf" in AREA and "type" in AREA  # the input is not modified


def test_keywords_without_a_type_become_a_branch_of_their_type_beside_the_other_types():
    said, _ = normalize.normalized({"title": "code", "minLength": 10, "maxLength": 10, "pattern": "^[0-9]+x$"})
    assert said == {"title": "code", "anyOf": [{"type": "string", "minLength": 10, "maxLength": 10,
                                                "pattern": "^[0-9]+x$"},
                                               {"type": ["array", "boolean", "null", "number", "object"]}]}
    said, _ = normalize.normalized({"minimum": 5, "minLength": 1})
    assert said["anyOf"][:2] == [{"type": "string", "minLength": 1}, {"type": "number", "minimum": 5}]
    assert said["anyOf"][2] == {"type": ["array", "boolean", "null", "object"]}


def test_what_a_flat_merge_would_change_goes_into_an_allof_or_stays():
    closed = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False,
              "oneOf": [{"properties": {"b": {"type": "string"}}}, {"required": ["a"]}]}
    said, _ = normalize.normalized(closed)
    assert said["oneOf"][0] == {"allOf": [{k: v for k, v in closed.items() if k != "oneOf"}, closed["oneOf"][0]]}
    assert said["oneOf"][1]["required"] == ["a"] and said["oneOf"][1]["additionalProperties"] is False
    for untouched in ({"$ref": "#/$defs/x", "$defs": {"x": {}}, "type": "object", "oneOf": [{"required": ["a"]}]},
                      {"type": "string", "minLength": 2}, {"oneOf": [{"type": "string"}, {"type": "null"}]},
                      {"enum": ["a", "bb"], "minLength": 2}):
        assert normalize.normalized(untouched) == (untouched, [])
    assert normalize.merge({"type": "number"}, {"type": ["integer", "string"]}) == {"type": "integer"}
    assert normalize.merge({"type": "string"}, {"type": "object"}) is False


def test_exclusive_pairs_and_failing_forms_are_sound_on_random_branches():
    rng = random.Random(7)
    formed = exclusive = 0
    for _ in range(1500):
        chosen, other = random_schema(rng, 1), random_schema(rng, 1)
        failing = one_of.failing_beside(other, chosen)
        apart = one_of.exclusive(chosen, other)
        formed += failing is not None
        exclusive += apart
        if failing is None and not apart:
            continue
        mine, theirs = jsonschema.Draft202012Validator(chosen), jsonschema.Draft202012Validator(other)
        fails = jsonschema.Draft202012Validator(failing if failing is not None else False)
        for _ in range(30):
            instance = random_instance(rng)
            if failing is not None:
                assert not (fails.is_valid(instance) and theirs.is_valid(instance)), (other, failing, instance)
            if apart:
                assert not (mine.is_valid(instance) and theirs.is_valid(instance)), (chosen, other, instance)
    assert formed >= 300 and exclusive >= 100, (formed, exclusive)


@pytest.mark.parametrize("schema, reply, now", [
    (PETS, {"cat": "x"}, [{"cat": 1}, {"dog": "x", "cat": None}]),
    (AREA, {"radius": 1, "length": 2, "width": 3}, [{"radius": 1}, {"radius": 1, "width": 3}]),
])
def test_the_narrowed_retry_admits_only_replies_that_satisfy_exactly_one_branch(schema, reply, now):
    import json

    grammar = narrowed_schema(schema, json.dumps(reply))
    assert not valid(grammar, reply)  # the overlapping reply cannot come again
    for instance in now:
        assert valid(grammar, instance) and valid(schema, instance), instance
    rng = random.Random(3)
    admitted = 0
    narrowed, original = jsonschema.Draft202012Validator(grammar), jsonschema.Draft202012Validator(schema)
    for _ in range(3000):
        instance = random_instance(rng, keys=tuple(schema.get("properties") or ("dog", "cat")))
        if schema is AREA and isinstance(instance, dict):
            instance = {k: rng.choice([1, 2.5, v]) for k, v in instance.items()}
        if narrowed.is_valid(instance):
            admitted += 1
            assert original.is_valid(instance), instance
    assert admitted >= 20


def test_if_then_conditionals_on_a_required_key_become_one_branch_per_value():
    said, notes = normalize.normalized(FORM)
    assert notes[0] == "/: if/then conditionals on a required key as one branch per value"
    assert "allOf" not in said and len(said["anyOf"]) == 3  # note, input, and choice (no conditional)
    keys = ("kind", "text", "label", "optional")
    rng = random.Random(5)
    before, after = jsonschema.Draft7Validator(FORM), jsonschema.Draft7Validator(said)
    verdicts = {True: 0, False: 0}
    for _ in range(4000):
        instance = random_instance(rng, keys=keys)
        if isinstance(instance, dict) and rng.random() < 0.8:
            instance["kind"] = rng.choice(["note", "input", "choice", "other"])
        verdict = before.is_valid(instance)
        verdicts[verdict] += 1
        assert after.is_valid(instance) == verdict, (instance, said)
    assert min(verdicts.values()) >= 100, verdicts
    # Not this shape: an else, a key not required, values not listed.
    for changed in ({**FORM, "allOf": [{**FORM["allOf"][0], "else": {"required": ["label"]}}]},
                    {**FORM, "required": []},
                    {**FORM, "properties": {"kind": {"type": "string"}}}):
        assert normalize.split_by_discriminator(changed, changed) is None
