"""`enum` / `const` beside a `type` that excludes some of their values (pure).

Why: real-world schemas write `{"enum": ["all", "ssl", ...], "type": "object"}` (JSONSchemaBench's
Github_trivial/o30283, a `mode` property): by JSON Schema both keywords hold, so only the values
of the declared type are valid — here none, and the property can never be written. xgrammar
ignores `type` beside `enum`/`const` and lets the model write `"mode": "AAA"`; the reply check
then withholds the reply (a 5xx, or a stream that ends in an error) although a valid reply
exists (`{}`). llguidance intersects the two exactly. So a schema with such a node is served by
llguidance where a replica has it (`schema_check.plan_engine`), else by xgrammar on
`narrowed(schema)`, which says the same thing in a form xgrammar reads; and where every document
must reach a node that admits no value, the request is a 400 naming it (`unsatisfiable`).

JSON types as the schema's own draft counts them, with jsonschema's type checkers (the reply
check's): from draft 6 on an integer is any number with no fractional part (1.0 too), in drafts 3
and 4 only a number written without one; a boolean is never a number.
"""

import copy
from typing import Any, Dict, Iterator, List, Optional, Tuple

import jsonschema

from gpustack_dspark.worker import one_of

# Keywords whose value is a subschema, a list of them, or a map of them (draft 4 to 2020-12).
_ONE = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems")
_MAP = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas")


def _checker(schema: Any) -> Any:
    """The type checker of the draft `schema` declares (`$schema`; else 2020-12, as the reply check)."""
    return jsonschema.validators.validator_for(schema if isinstance(schema, dict) else {},
                                               default=jsonschema.Draft202012Validator).TYPE_CHECKER


def _is_type(value: Any, name: str, checker: Any) -> bool:
    try:
        return checker.is_type(value, name)
    except jsonschema.exceptions.UndefinedTypeCheck:  # not a JSON type: admits nothing
        return False


def _declared_types(node: Dict[str, Any]) -> Optional[List[str]]:
    value = node.get("type")
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(t, str) for t in value):
        return list(value)
    return None


def admitted(node: Any, checker: Any = None) -> Optional[List[Any]]:
    """The node's `enum`/`const` values its `type` admits (by `checker`, a draft's type checker;
    default 2020-12), when the type excludes one of them; None when there is nothing to narrow
    (no enum, no type, or every value of the type)."""
    if not isinstance(node, dict):
        return None
    values, types = one_of.values_of(node), _declared_types(node)
    if values is None or types is None:
        return None
    checker = checker or _checker({})
    kept = [v for v in values if any(_is_type(v, t, checker) for t in types)]
    return kept if len(kept) < len(values) else None


def _subschemas(node: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    for key in _ONE:
        if isinstance(node.get(key), dict):
            yield key, node[key]
    for key in _MANY:
        if isinstance(node.get(key), list):
            for i, sub in enumerate(node[key]):
                if isinstance(sub, dict):
                    yield f"{key}/{i}", sub
    for key in _MAP:
        if isinstance(node.get(key), dict):
            for name, sub in node[key].items():
                if isinstance(sub, dict):
                    yield f"{key}/{name}", sub


def conflict(schema: Any) -> Optional[str]:
    """Where the first `enum`/`const` beside a `type` that excludes some of its values is, or None."""
    stack: List[Tuple[str, Any]] = [("", schema)]
    seen = set()
    checker = _checker(schema)
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict) or id(node) in seen:
            continue
        seen.add(id(node))
        if admitted(node, checker) is not None:
            return f"{'enum' if 'const' not in node else 'const'} beside type {node['type']!r} at {where or '(root)'}"
        stack.extend((f"{where}/{step}", sub) for step, sub in reversed(list(_subschemas(node))))
    return None


def unsatisfiable(schema: Any) -> Optional[str]:
    """Why no document satisfies `schema` because a node every document reaches (`one_of.reached`:
    the root, `allOf` members, local `$ref`s, required properties of an object) admits no value
    of its enum, or None."""
    checker = _checker(schema)
    for node, where in one_of.reached(schema):
        if admitted(node, checker) == []:
            values = one_of.values_of(node) or []
            shown = ", ".join(repr(v) for v in values[:6]) + (", ..." if len(values) > 6 else "")
            return (f"no document satisfies the schema: at {where}, {'const' if 'const' in node else 'enum'} "
                    f"[{shown}] has no value of type {node['type']!r}, and both must hold")
    return None


def narrowed(schema: Any) -> Tuple[Any, List[str]]:
    """A copy of `schema` in a form xgrammar reads as JSON Schema does, and what changed: each
    such `enum`/`const` keeps only the values of its type; an optional property left with none
    is taken out of its object's `properties` where that object admits no other keys
    (`additionalProperties` false, or absent, which vLLM's xgrammar reads as false and the copy
    then says) and has no `patternProperties`, since no value can be written for it. Every
    document the copy admits, `schema` admits. A node left with no value elsewhere is kept as
    it is (the reply check withholds a reply that uses it)."""
    if conflict(schema) is None:
        return schema, []
    root = copy.deepcopy(schema)
    checker = _checker(schema)
    notes: List[str] = []
    stack: List[Tuple[str, Any]] = [("", root)]
    while stack:
        where, node = stack.pop()
        if not isinstance(node, dict):
            continue
        properties = node.get("properties")
        if isinstance(properties, dict) and node.get("additionalProperties", False) is False \
                and not node.get("patternProperties"):  # else a pattern could admit the key alone
            required = node.get("required") if isinstance(node.get("required"), list) else []
            for name in [n for n, sub in properties.items() if n not in required and admitted(sub, checker) == []]:
                properties.pop(name)
                node["additionalProperties"] = False  # as vLLM's xgrammar reads it absent; now said
                notes.append(f"property {name} at {where or '(root)'} (no value of its enum has its type)")
        kept = admitted(node, checker)
        if kept:  # a const its type excludes leaves none: never here
            node["enum"] = kept
            notes.append(f"enum values not of type {node['type']!r} at {where or '(root)'}")
        stack.extend((f"{where}/{step}", sub) for step, sub in _subschemas(node))
    return root, notes
