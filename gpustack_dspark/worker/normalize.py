"""A schema said again in the forms the grammar engines read as JSON Schema does (pure).

Why: vLLM 0.32's grammar engines serve three shapes of real-world schemas with a grammar wider
than the schema, so the model may write a reply the reply check then withholds although valid
replies exist:

- keywords beside `oneOf`/`anyOf` (`{"type": "object", "properties": {...}, "oneOf":
  [{"required": ["radius"]}, ...]}`, Glaive-style tool schemas): xgrammar's grammar is the
  branches' alone, and a `required`-only branch admits any value;
- keywords that bind one type, written without `type` (`{"minLength": 10, "pattern": ...}`,
  `{"minimum": 5}`): xgrammar admits any value and ignores them;
- `if`/`then` conditionals: xgrammar does not compile them, llguidance serves them leniently,
  without the conditionals.

`normalized` rewrites them into equivalent forms — every document the rewritten schema admits,
the original admits, and the other way round:

- `distribute`: the keywords beside a `oneOf` (else an `anyOf`) move into each branch
  (A ∧ oneOf(B₁…Bₙ) ≡ oneOf(A∧B₁ … A∧Bₙ); the same for `anyOf`), merged into the branch where
  the merge keeps the meaning (`merge`), else as `allOf: [A, Bᵢ]` (which llguidance serves
  exactly; a replica with xgrammar alone then falls back to the schema as written);
- `split_by_discriminator`: an `allOf` of `if: {properties: {key: {const: v}}}, then: T` on a
  key the object requires and lists the values of (JSON Schema Store's discriminated unions,
  which the engines serve without the conditionals) becomes an `anyOf` of one branch per value;
- `split_by_type`: a node without `type` whose string or number keywords the engines ignore
  becomes an `anyOf` of one branch per type family its keywords bind, with those keywords and
  the `type`, and one branch of the types none of them binds (a pattern that can never match
  leaves the other types valid, as JSON Schema says).

The reply check always validates against the schema as the client wrote it.
"""

from typing import Any, Dict, List, Optional, Tuple

from gpustack_dspark.worker.one_of import ASSERTIONS, TYPES

# Keywords that bind values of one type family only (a value of another type satisfies them).
FAMILIES: Dict[str, Tuple[str, ...]] = {
    "object": ("properties", "required", "additionalProperties", "patternProperties", "minProperties",
               "maxProperties", "propertyNames", "dependencies", "dependentRequired", "dependentSchemas",
               "unevaluatedProperties"),
    "array": ("items", "prefixItems", "additionalItems", "contains", "minContains", "maxContains", "minItems",
              "maxItems", "uniqueItems", "unevaluatedItems"),
    "string": ("minLength", "maxLength", "pattern", "format", "contentEncoding", "contentMediaType"),
    "number": ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"),
}
# Those the engines ignore without a `type` (object and array keywords they read as the type).
_IGNORED_UNTYPED = ("minLength", "maxLength", "pattern", "minimum", "maximum", "exclusiveMinimum",
                    "exclusiveMaximum", "multipleOf")
# A node with one of these is left to the engines as it is by `split_by_type`.
_WHOLE = ("type", "enum", "const", "$ref", "$dynamicRef", "$recursiveRef", "allOf", "anyOf", "oneOf", "not",
          "if", "then", "else")
# Keywords read together with others of the same schema object: never split across a merge.
_OBJECT_SHAPE = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_ARRAY_SHAPE = ("items", "prefixItems", "additionalItems", "unevaluatedItems")
_CONDITIONAL = ("if", "then", "else")
_REFS = ("$ref", "$dynamicRef", "$recursiveRef")

# Keywords whose value is one subschema, a list of them, or a map of them.
_ONE = ("items", "additionalItems", "additionalProperties", "contains", "not", "if", "then", "else",
        "propertyNames", "unevaluatedItems", "unevaluatedProperties")
_MANY = ("allOf", "anyOf", "oneOf", "prefixItems", "items")
_MAP = ("properties", "patternProperties", "definitions", "$defs", "dependentSchemas", "dependencies")


def _types(node: Dict[str, Any]) -> Optional[set]:
    value = node.get("type")
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        return None
    return set(value)


def _type_intersection(a: Any, b: Any) -> Optional[Any]:
    """The `type` both `a` and `b` allow (an integer is a number), [] for none, None when either
    is not a list of names."""
    left, right = _types({"type": a}), _types({"type": b})
    if left is None or right is None:
        return None
    widen = lambda s: s | ({"integer"} if "number" in s else set())  # noqa: E731
    both = widen(left) & widen(right)
    if "number" in both:
        both.discard("integer")
    kept = [t for t in TYPES if t in both]
    return kept[0] if len(kept) == 1 else kept


def _properties_merge(a: Dict[str, Any], b: Dict[str, Any]) -> Dict[str, Any]:
    out = dict(a)
    for name, sub in b.items():
        out[name] = sub if name not in out or out[name] == sub else {"allOf": [out[name], sub]}
    return out


def merge(a: Dict[str, Any], b: Any) -> Optional[Any]:
    """One schema equivalent to `a` ∧ `b`, or None where a flat merge could change the meaning:
    both say something different with the same keyword (other than `required`, `type`,
    `properties` and `allOf`, which combine), a `$ref` on either side, or keywords read together
    (`additionalProperties` with `properties`, `additionalItems` with `items`, `if` with
    `then`) split across the two."""
    if b is True:
        return dict(a)
    if b is False:
        return False
    if not isinstance(b, dict) or any(k in a or k in b for k in _REFS):
        return None
    for group in (_ARRAY_SHAPE, _CONDITIONAL):
        if any(k in a for k in group) and any(k in b for k in group) and \
                any(a.get(k) != b.get(k) for k in group):
            return None
    for closed, other in ((a, b), (b, a)):
        if any(k in closed for k in _OBJECT_SHAPE):
            if "patternProperties" in other or any(k in other and other[k] != closed.get(k) for k in _OBJECT_SHAPE):
                return None
            if not set(other.get("properties") or {}) <= set(closed.get("properties") or {}):
                return None
    out = dict(a)
    for key, value in b.items():
        if key not in out or out[key] == value:
            out[key] = value
        elif key == "required" and isinstance(value, list) and isinstance(out[key], list):
            out[key] = list(out[key]) + [k for k in value if k not in out[key]]
        elif key == "type":
            both = _type_intersection(out[key], value)
            if both is None:
                return None
            if both == []:
                return False  # no value has both types: the branch never holds
            out[key] = both
        elif key == "properties" and isinstance(value, dict) and isinstance(out[key], dict):
            out[key] = _properties_merge(out[key], value)
        elif key == "allOf" and isinstance(value, list) and isinstance(out[key], list):
            out[key] = list(out[key]) + list(value)
        elif key not in ASSERTIONS:  # an annotation: the branch's own
            out[key] = value
        else:
            return None
    return out


def distribute(node: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """`node` with the assertions beside its `oneOf` (else `anyOf`) moved into each branch, or
    None when there is nothing to move (or a `$ref` beside it, whose siblings the older drafts
    ignore)."""
    key = "oneOf" if isinstance(node.get("oneOf"), list) else "anyOf" if isinstance(node.get("anyOf"), list) else None
    if key is None or not node[key] or any(k in node for k in _REFS):
        return None
    beside = {k: v for k, v in node.items() if k in ASSERTIONS and k != key}
    if not beside:
        return None
    branches = []
    for branch in node[key]:
        merged = merge(beside, branch)
        branches.append(merged if merged is not None else {"allOf": [beside, branch]})
    if all(b is False for b in branches):
        return None  # leave a schema no document satisfies as written: the check says so
    kept = {k: v for k, v in node.items() if k not in beside}
    kept[key] = branches
    return kept


def split_by_type(node: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """`node` as an `anyOf` of one branch per type family its keywords bind, plus one of the
    other types, when it has no `type` (nor `enum`, a `$ref`, a combinator) and a keyword the
    engines ignore without one; else None."""
    if any(k in node for k in _WHOLE) or not any(k in node for k in _IGNORED_UNTYPED):
        return None
    branches, covered = [], set()
    for family, keys in FAMILIES.items():
        bound = {k: node[k] for k in keys if k in node}
        if bound:
            branches.append({"type": family, **bound})
            covered |= {family, "integer"} if family == "number" else {family}
    others = [t for t in TYPES if t not in covered and not (t == "integer" and "number" not in covered)]
    if others:
        branches.append({"type": others[0] if len(others) == 1 else others})
    kept = {k: v for k, v in node.items() if not any(k in keys for keys in FAMILIES.values())}
    kept["anyOf"] = branches
    return kept


def _discriminator(member: Any) -> Optional[Tuple[str, str]]:
    """(key, value) of an `allOf` member `{"if": {"properties": {key: {"const": value}}}, "then":
    ...}` (a `required: [key]` in the `if` allowed, annotations anywhere), else None."""
    if not isinstance(member, dict) or "else" in member or not isinstance(member.get("then"), (dict, bool)) \
            or set(member) & ASSERTIONS != {"if", "then"}:
        return None
    test = member.get("if")
    if not isinstance(test, dict) or set(test) & ASSERTIONS - {"properties", "required"}:
        return None
    properties = test.get("properties")
    if not isinstance(properties, dict) or len(properties) != 1:
        return None
    (key, sub), = properties.items()
    if test.get("required", [key]) != [key] or not isinstance(sub, dict) or set(sub) & ASSERTIONS != {"const"}:
        return None
    return (key, sub["const"]) if isinstance(sub["const"], str) else None


def split_by_discriminator(node: Dict[str, Any], root: Any) -> Optional[Dict[str, Any]]:
    """`node` with an `allOf` of `if: {properties: {key: {const: v}}}, then: T` conditionals on
    one key it requires, whose values its own `key` property lists (an `enum` of strings, maybe
    behind a local `$ref`), as an `anyOf` with one branch per listed value: the value as a
    `const` with every `then` whose `if` names it (JSON Schema Store's discriminated unions,
    which the engines serve without the conditionals). An object whose key has value v
    satisfies exactly the conditionals on v, so the two agree on every instance; None where
    the shape differs."""
    members = node.get("allOf")
    if node.get("type") != "object" or not isinstance(members, list) or not members or "anyOf" in node \
            or "oneOf" in node:
        return None
    found = [_discriminator(m) for m in members]
    if any(f is None for f in found) or len({key for key, _ in found}) != 1:
        return None
    key = found[0][0]
    declared = (node.get("properties") or {}).get(key) if isinstance(node.get("properties"), dict) else None
    if isinstance(declared, dict) and isinstance(declared.get("$ref"), str):
        from gpustack_dspark.worker.request_limits import ref_target

        declared = ref_target(root, declared["$ref"])
    values = declared.get("enum") if isinstance(declared, dict) else None
    if key not in (node.get("required") or []) or not isinstance(values, list) or not values \
            or not all(isinstance(v, str) for v in values) or len(values) > 64:
        return None
    branches = []
    for value in dict.fromkeys(values):
        branch: Any = {"properties": {key: {"const": value}}}
        for (_, wanted), member in zip(found, members):
            if wanted == value:
                merged = merge(branch, member["then"])
                branch = merged if merged is not None else {"allOf": [branch, member["then"]]}
        if branch is not False:
            branches.append(branch)
    if not branches:
        return None
    kept = {k: v for k, v in node.items() if k != "allOf"}
    kept["anyOf"] = branches
    return kept


def normalized(schema: Any) -> Tuple[Any, List[str]]:
    """`schema` with `distribute` and `split_by_type` applied at every subschema (a new object
    where something changed; the input is never modified), and where (JSON pointers), empty
    when nothing changed."""
    notes: List[str] = []

    def walk(node: Any, where: str) -> Any:
        if not isinstance(node, dict):
            return node
        out = dict(node)
        for key in _ONE:
            if isinstance(node.get(key), dict):
                out[key] = walk(node[key], f"{where}/{key}")
        for key in _MANY:
            if isinstance(node.get(key), list):
                subs = [walk(sub, f"{where}/{key}/{i}") for i, sub in enumerate(node[key])]
                out[key] = node[key] if all(a is b for a, b in zip(subs, node[key])) else subs
        for key in _MAP:
            if isinstance(node.get(key), dict):
                subs = {name: walk(sub, f"{where}/{key}/{name}") for name, sub in node[key].items()}
                out[key] = node[key] if all(subs[n] is s for n, s in node[key].items()) else subs
        split = split_by_type(out)
        if split is not None:
            notes.append(f"{where or '/'}: keywords without a type split by the type they bind")
            return split
        cases = split_by_discriminator(out, schema)
        if cases is not None:
            notes.append(f"{where or '/'}: if/then conditionals on a required key as one branch per value")
            out = cases
        spread = distribute(out)
        if spread is not None:
            key = "oneOf" if "oneOf" in spread else "anyOf"
            notes.append(f"{where or '/'}: keywords beside {key} moved into its branches")
            # A merged branch may hold keywords beside a combinator of its own, or untyped ones.
            spread[key] = [walk(b, f"{where}/{key}/{i}") for i, b in enumerate(spread[key])]
            return spread
        if cases is not None:
            out["anyOf"] = [walk(b, f"{where}/anyOf/{i}") for i, b in enumerate(out["anyOf"])]
            return out
        return node if all(out[k] is node[k] for k in node) else out

    result = walk(schema, "")
    return (result, notes) if notes else (schema, [])
