"""What a `oneOf` means when its branches are not exclusive by construction (pure).

Both grammar engines serve `oneOf` as `anyOf` where they cannot prove the branches exclusive,
and the reply check then withholds a reply that matched two branches. Two shapes of real
schemas make that certain, whatever the model writes, and are decided here before any token:

- `unsatisfiable`: branches that hold for every document the schema allows (a branch that only
  requires keys the enclosing object already requires, or that asserts nothing): when two of
  them hold at a place every document reaches, no document satisfies the schema. That is the
  client's schema, so it is a 400 that says where, instead of a reply generated and withheld
  (JSONSchemaBench has one: every key of three `required`-only branches required beside them).
- `rewrite`: a `oneOf` with exactly one branch that asserts nothing (often a typo: `"#ref"` for
  `"$ref"` leaves the branch empty) holds exactly when every other branch fails, so it is
  served as the negation of the others, built (`negated`) where a sound one exists: the
  grammar's language is inside the schema's, never outside; the reply check still validates
  against the original schema.
"""

import copy
from typing import Any, Dict, Iterator, List, Optional, Tuple

from gpustack_dspark.worker.request_limits import ref_target

# Keywords that assert nothing about an instance (draft 4 to 2020-12).
ANNOTATIONS = frozenset({
    "title", "description", "$comment", "examples", "default", "deprecated", "readOnly", "writeOnly",
    "$id", "id", "$schema", "$anchor", "$dynamicAnchor", "$vocabulary", "definitions", "$defs",
    "contentMediaType", "contentSchema",
})
# Keywords that do (an unknown keyword asserts nothing: JSON Schema ignores it).
ASSERTIONS = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "patternProperties",
    "items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "minItems",
    "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "contentEncoding",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minProperties",
    "maxProperties", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames",
    "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
    "unevaluatedProperties", "unevaluatedItems",
})
TYPES = ("array", "boolean", "integer", "null", "number", "object", "string")


def asserts_nothing(branch: Any) -> bool:
    """True for a schema every instance satisfies: `true`, `{}`, or only annotations and
    keywords JSON Schema does not know."""
    return branch is True or (isinstance(branch, dict) and not (set(branch) & ASSERTIONS))


def _implied(branch: Any, node: Dict[str, Any]) -> bool:
    """The branch holds for every instance `node` allows: it asserts nothing, or it only
    requires keys `node` requires too."""
    if asserts_nothing(branch):
        return True
    if not isinstance(branch, dict) or set(branch) & ASSERTIONS != {"required"}:
        return False
    required, outer = branch.get("required"), node.get("required")
    return isinstance(required, list) and isinstance(outer, list) and set(map(str, required)) <= set(map(str, outer))


def _ref_hides_siblings(root: Any) -> bool:
    """Drafts 4 to 7 ignore every keyword beside a `$ref`."""
    draft = root.get("$schema") if isinstance(root, dict) else None
    return isinstance(draft, str) and any(f"draft-0{n}" in draft for n in (3, 4, 6, 7))


def reached(schema: Any) -> Iterator[Tuple[Dict[str, Any], str]]:
    """The places every document reaches, with where ("(root)", "dimensions.radius"): the
    root, `allOf` members, local `$ref`s (alone where the draft ignores a `$ref`'s siblings)
    and required properties of a value that must be an object (a value of another type
    satisfies `required` and `properties` without having them). Each node once, in the order
    a reader meets them."""
    seen = set()
    hides = _ref_hides_siblings(schema)

    def walk(node: Any, where: str) -> Iterator[Tuple[Dict[str, Any], str]]:
        if not isinstance(node, dict) or id(node) in seen:
            return
        seen.add(id(node))
        target = ref_target(schema, node.get("$ref"))
        if target is not None and hides:
            yield from walk(target, where)
            return
        yield node, where
        for member in node.get("allOf") or [] if isinstance(node.get("allOf"), list) else []:
            yield from walk(member, where)
        if target is not None:
            yield from walk(target, where)
        properties = node.get("properties") if isinstance(node.get("properties"), dict) \
            and node.get("type") in ("object", ["object"]) else {}
        for key in node.get("required") or [] if isinstance(node.get("required"), list) else []:
            if key in properties:
                yield from walk(properties[key], key if where == "(root)" else f"{where}.{key}")

    return walk(schema, "(root)")


def unsatisfiable(schema: Any) -> Optional[str]:
    """Why no document satisfies `schema` because of a `oneOf` (see the module docstring), or
    None. Looks only at the places every document reaches (`reached`)."""
    for node, where in reached(schema):
        branches = node.get("oneOf")
        if isinstance(branches, list):
            held = [i for i, branch in enumerate(branches) if _implied(branch, node)]
            if len(held) >= 2:
                return (f"no document satisfies the schema: at {where}, oneOf branches "
                        f"{', '.join(map(str, held))} hold for every value the schema allows there "
                        "(they only require keys that are required anyway, or assert nothing), and "
                        "oneOf allows exactly one")
    return None


def negated(schema: Any) -> Optional[Any]:
    """A schema whose every instance fails `schema` (a sound part of `not schema`), or None
    where none is built: another type than `type` allows; or, for a schema of `properties`
    only, an object with one of those properties present and failing its subschema."""
    if schema is False:
        return {}
    if not isinstance(schema, dict):
        return None
    asserted = set(schema) & ASSERTIONS
    if "type" in asserted:
        types = schema["type"] if isinstance(schema["type"], list) else [schema["type"]]
        if not all(isinstance(t, str) for t in types):
            return None
        banned = set(types) | ({"integer"} if "number" in types else set()) | ({"number"} if "integer" in types else set())
        others = [t for t in TYPES if t not in banned]
        return {"type": others if len(others) > 1 else others[0]} if others else None
    if asserted == {"properties"} and isinstance(schema["properties"], dict):
        for key, sub in schema["properties"].items():
            failing = negated(sub)
            if failing is not None:
                return {"type": "object", "required": [key], "properties": {key: failing}}
    return None


def rewrite(schema: Any) -> Tuple[Any, List[str]]:
    """`schema` with each `oneOf` that has exactly one branch asserting nothing served as the
    negation of its other branches (`allOf` of `negated`), where every one has a negation;
    with what was rewritten (where), empty when nothing was. Never under `not` (a narrower
    schema there would be a wider one outside)."""
    notes: List[str] = []

    def walk(node: Any, where: str, apply: bool) -> None:
        if isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, f"{where}/{i}", apply)
            return
        if not isinstance(node, dict):
            return
        branches = node.get("oneOf")
        if isinstance(branches, list) and len(branches) >= 2:
            empty = [i for i, branch in enumerate(branches) if asserts_nothing(branch)]
            if len(empty) == 1:
                negations = [negated(branch) for i, branch in enumerate(branches) if i != empty[0]]
                if all(n is not None for n in negations):
                    notes.append(f"oneOf at {where or '/'} with an always-true branch as the negation of the others")
                    if apply:
                        del node["oneOf"]
                        node["allOf"] = list(node.get("allOf") or []) + negations
        for key, value in list(node.items()):
            if key not in ("not", "enum", "const", "examples", "default"):
                walk(value, f"{where}/{key}", apply)

    walk(schema, "", apply=False)  # most schemas have nothing to rewrite: no copy for them
    if not notes:
        return schema, []
    notes.clear()
    out = copy.deepcopy(schema)
    walk(out, "", apply=True)
    return out, notes


def values_of(node: Any) -> Optional[List[Any]]:
    """A node's `const` (as one value) or `enum` values, None without either."""
    if not isinstance(node, dict):
        return None
    if "const" in node:
        return [node["const"]]
    return list(node["enum"]) if isinstance(node.get("enum"), list) else None


def _type_set(node: Any) -> Optional[set]:
    """The types `node` allows (an integer is a number), None where it does not say."""
    value = node.get("type") if isinstance(node, dict) else None
    value = [value] if isinstance(value, str) else value
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        return None
    return set(value) | ({"integer"} if "number" in value else set())


def _closed_without(node: Dict[str, Any], key: str) -> bool:
    """`node` admits no object with `key` (closed to properties that leave it out)."""
    return node.get("additionalProperties") is False and not node.get("patternProperties") \
        and key not in (node.get("properties") or {})


def exclusive(a: Any, b: Any) -> bool:
    """No instance satisfies both `a` and `b`, by construction: types that share no value, a
    property both require whose `const`/`enum` values differ, or a key one requires that the
    other (closed to its own properties) cannot have."""
    if not isinstance(a, dict) or not isinstance(b, dict):
        return a is False or b is False
    left, right = _type_set(a), _type_set(b)
    if left is not None and right is not None and not left & right:
        return True
    both = set(a.get("required") or []) & set(b.get("required") or []) \
        if isinstance(a.get("required"), list) and isinstance(b.get("required"), list) else set()
    props_a, props_b = a.get("properties") or {}, b.get("properties") or {}
    for key in both:
        va, vb = values_of(props_a.get(key)), values_of(props_b.get(key))
        if va is not None and vb is not None and not any(x == y and type(x) is type(y) for x in va for y in vb):
            return True
    for one, other in ((a, b), (b, a)):
        if isinstance(one.get("required"), list) and any(_closed_without(other, k) for k in one["required"]):
            if _type_set(other) == {"object"}:  # a closed object branch: a non-object is not it
                return True
    return False


def failing_beside(other: Any, chosen: Any) -> Optional[Dict[str, Any]]:
    """A schema every instance of which fails `other`, in a form that can hold beside `chosen`
    (what a narrowed `oneOf` adds for each branch but the chosen one), or None: an object
    without a key `other` requires and `chosen` does not; else with a property of `other`
    written with a type its subschema excludes, where `chosen` lets that type through; else
    a type of `chosen`'s that `other` excludes."""
    if not isinstance(other, dict) or not isinstance(chosen, dict):
        return None
    chosen_types = _type_set(chosen)
    objects = chosen_types is None or "object" in chosen_types
    chosen_required = set(chosen.get("required") or []) if isinstance(chosen.get("required"), list) else set()
    if objects and isinstance(other.get("required"), list):
        for key in other["required"]:
            if isinstance(key, str) and key not in chosen_required:
                return {"type": "object", "properties": {key: False}}
    if objects and isinstance(other.get("properties"), dict) and not (
            chosen.get("additionalProperties") is False and not chosen.get("properties")):
        mine = chosen.get("properties") if isinstance(chosen.get("properties"), dict) else {}
        for key, sub in other["properties"].items():
            failing = negated(sub)
            if failing is None or _closed_without(chosen, key):
                continue
            if key in mine:
                here, there = _type_set(mine[key]), _type_set(failing)
                if here is None or there is None or not here & there or values_of(mine[key]) is not None:
                    continue
            return {"type": "object", "required": [key], "properties": {key: failing}}
    theirs = _type_set(other)
    if theirs is not None and chosen_types is not None and chosen_types - theirs:
        left = [t for t in TYPES if t in chosen_types - theirs]
        return {"type": left[0] if len(left) == 1 else left}
    return None
