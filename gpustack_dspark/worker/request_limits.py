"""Hostile or pathological requests become a 400 that names the problem, fast (pure).

Checked before any JSON Schema library or grammar compiler sees a schema (they recurse, loop
or take seconds on these): nesting depth of the body and of a schema, the size of a schema
(nodes, bytes), the largest `enum` and `properties`, `$ref`s that lead back to the same
schema without a value in between (`{"$ref": "#"}`), and patterns with a nested unbounded
quantifier over a lone atom (`(a+)+$`, the classic catastrophic regex). Every walk here is
iterative and bounded. The limits sit well above what real schemas use: over the 333
JSONSchemaBench schemas the deepest nests 21 levels, the largest enum has 1,554 values, the
largest object 131 properties, the largest schema 13,696 nodes and 1.3 MB.
"""

import json
import re
from typing import Any, Dict, Iterator, List, Optional, Tuple
from urllib.parse import unquote

MAX_BODY_DEPTH = 100
MAX_SCHEMA_DEPTH = 64
MAX_SCHEMA_NODES = 100_000
MAX_SCHEMA_BYTES = 4 * 1024 * 1024
MAX_ENUM_VALUES = 4096
MAX_PROPERTIES = 2048
MAX_PATTERN_CHARS = 2000

# Keywords whose subschemas apply to the same value (no value consumed between them).
_SAME_VALUE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_VALUE_ONE = ("not", "if", "then", "else")


class LimitExceeded(ValueError):
    """A one-line reason, meant for a 400."""


def nesting_depth(value: Any, stop_at: int) -> int:
    """Container nesting depth of a parsed JSON value (a scalar is 0), counted up to `stop_at`+1."""
    deepest = 0
    stack: List[Tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, depth)
            if deepest > stop_at:
                return deepest
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def check_body_depth(body: Any) -> None:
    depth = nesting_depth(body, MAX_BODY_DEPTH)
    if depth > MAX_BODY_DEPTH:
        raise LimitExceeded(f"the request body is nested more than {MAX_BODY_DEPTH} levels deep "
                            f"(at most {MAX_BODY_DEPTH} allowed)")


def _pointer(path: Tuple[Any, ...]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in path) if path else "(root)"


def _walk(schema: Any) -> Iterator[Tuple[Tuple[Any, ...], Any]]:
    stack: List[Tuple[Tuple[Any, ...], Any]] = [((), schema)]
    while stack:
        path, item = stack.pop()
        yield path, item
        if isinstance(item, dict):
            stack.extend((path + (k,), v) for k, v in item.items() if isinstance(v, (dict, list)))
        elif isinstance(item, list):
            stack.extend((path + (i,), v) for i, v in enumerate(item) if isinstance(v, (dict, list)))


def check_schema(schema: Any, where: str = "the schema") -> None:
    """Raise LimitExceeded naming the first problem found; None when within the limits."""
    depth = nesting_depth(schema, MAX_SCHEMA_DEPTH)
    if depth > MAX_SCHEMA_DEPTH:
        raise LimitExceeded(f"{where} is nested more than {MAX_SCHEMA_DEPTH} levels deep "
                            f"(at most {MAX_SCHEMA_DEPTH} allowed)")
    nodes = 0
    for path, item in _walk(schema):
        nodes += 1
        if nodes > MAX_SCHEMA_NODES:
            raise LimitExceeded(f"{where} has more than {MAX_SCHEMA_NODES} JSON nodes (at most {MAX_SCHEMA_NODES} allowed)")
        if not isinstance(item, dict):
            continue
        enum = item.get("enum")
        if isinstance(enum, list) and len(enum) > MAX_ENUM_VALUES and path[-1:] != ("properties",):
            raise LimitExceeded(f"{where} at {_pointer(path + ('enum',))}: enum has {len(enum)} values "
                                f"(at most {MAX_ENUM_VALUES} allowed)")
        properties = item.get("properties")
        if isinstance(properties, dict) and len(properties) > MAX_PROPERTIES and path[-1:] != ("properties",):
            raise LimitExceeded(f"{where} at {_pointer(path + ('properties',))}: {len(properties)} properties "
                                f"(at most {MAX_PROPERTIES} allowed)")
        pattern = item.get("pattern")
        if isinstance(pattern, str) and path[-1:] != ("properties",):
            problem = pattern_problem(pattern)
            if problem:
                raise LimitExceeded(f"{where} at {_pointer(path + ('pattern',))}: pattern {pattern[:80]!r} {problem}")
    size = len(json.dumps(schema))
    if size > MAX_SCHEMA_BYTES:
        raise LimitExceeded(f"{where} is {size} bytes as JSON (at most {MAX_SCHEMA_BYTES} allowed)")
    cycle = ref_cycle(schema)
    if cycle:
        raise LimitExceeded(f"{where}: $ref at {cycle[0]} leads back to itself ({' -> '.join(cycle)}) "
                            "without a value in between (left recursion: no grammar engine can serve it)")


def _resolve(root: Any, ref: str) -> Optional[Tuple[Any, ...]]:
    """A local `$ref` ("#", "#/$defs/a") -> the path it names, or None (remote, anchor, missing)."""
    if not ref.startswith("#"):
        return None
    fragment = unquote(ref[1:])
    if fragment == "":
        return ()
    if not fragment.startswith("/"):
        return None  # a named anchor: not followed here
    node, path = root, ()
    for raw in fragment[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node, path = node[part], path + (part,)
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node, path = node[int(part)], path + (int(part),)
        else:
            return None
    return path


def _at(root: Any, path: Tuple[Any, ...]) -> Any:
    node = root
    for part in path:
        node = node[part]
    return node


def ref_target(root: Any, ref: Any) -> Any:
    """The subschema a local `$ref` names, or None (not a string, remote, anchor, missing)."""
    path = _resolve(root, ref) if isinstance(ref, str) else None
    return None if path is None else _at(root, path)


def ref_cycle(schema: Any) -> Optional[List[str]]:
    """A chain of same-value edges ($ref, allOf/anyOf/oneOf/not/if/then/else) from a schema back
    to itself, as JSON pointers; None when there is none."""
    if not isinstance(schema, dict):
        return None

    def edges(path: Tuple[Any, ...]) -> List[Tuple[Any, ...]]:
        node = _at(schema, path)
        out: List[Tuple[Any, ...]] = []
        if not isinstance(node, dict):
            return out
        ref = node.get("$ref")
        if isinstance(ref, str):
            target = _resolve(schema, ref)
            if target is not None:
                out.append(target)
        for key in _SAME_VALUE_LISTS:
            if isinstance(node.get(key), list):
                out.extend(path + (key, i) for i, v in enumerate(node[key]) if isinstance(v, dict))
        for key in _SAME_VALUE_ONE:
            if isinstance(node.get(key), dict):
                out.append(path + (key,))
        return out

    # Iterative DFS with colours over every schema object reachable by any edge.
    starts = [path for path, item in _walk(schema) if isinstance(item, dict)]
    colour: Dict[Tuple[Any, ...], int] = {}
    for start in starts:
        if colour.get(start):
            continue
        stack: List[Tuple[Tuple[Any, ...], Iterator[Tuple[Any, ...]]]] = [(start, iter(edges(start)))]
        colour[start] = 1
        trail = [start]
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = 2
                stack.pop()
                trail.pop()
                continue
            state = colour.get(nxt, 0)
            if state == 1:
                cycle = trail[trail.index(nxt):] + [nxt]
                return [_pointer(p) for p in cycle]
            if state == 0:
                colour[nxt] = 1
                trail.append(nxt)
                stack.append((nxt, iter(edges(nxt))))
    return None


_ATOM = r"(?:\\.|\[(?:\\.|[^\]\\])*\]|[^()\[\]\\|*+?{}])"
_UNBOUNDED = r"(?:[+*]|\{\d+,\})"
# A group holding only unboundedly quantified atoms, itself unboundedly quantified: (a+)+, (\d*)*, ([a-z]+b*)+
_NESTED_QUANTIFIER = re.compile(r"\((?:\?:)?(?:" + _ATOM + _UNBOUNDED + r"[?+]?)+\)" + _UNBOUNDED)


def pattern_problem(pattern: str) -> Optional[str]:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"is {len(pattern)} characters long (at most {MAX_PATTERN_CHARS} allowed)"
    match = _NESTED_QUANTIFIER.search(pattern)
    if match:
        return (f"nests an unbounded quantifier inside another ({match.group(0)!r}): it matches the same "
                "text in exponentially many ways; write it without the outer repetition")
    return None


def schemas_in_body(body: Dict[str, Any]) -> Iterator[Tuple[str, Any]]:
    """Every JSON Schema a chat/completions body carries, with where it is (for messages)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and isinstance(fmt.get("json_schema"), dict) and "schema" in fmt["json_schema"]:
        yield "response_format.json_schema.schema", fmt["json_schema"]["schema"]
    so = body.get("structured_outputs")
    if isinstance(so, dict) and so.get("json") is not None:
        yield "structured_outputs.json", so["json"]
    if body.get("guided_json") is not None:
        yield "guided_json", body["guided_json"]
    for i, tool in enumerate(body.get("tools") or []):
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(function, dict) and function.get("parameters") is not None:
            yield f"tools[{i}].function.parameters", function["parameters"]


def check_body(body: Dict[str, Any]) -> None:
    check_body_depth(body)
    for where, schema in schemas_in_body(body):
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except (ValueError, RecursionError):
                continue  # the schema check says what is wrong with it
        check_schema(schema, where)
