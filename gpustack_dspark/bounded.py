"""Bounded reading of the YAML and JSON the project parses (pure apart from reading files).

Every file or text a user hands us — model YAML, policy files, `dspark-serve --config`,
schema and warmup files, inline schemas in backend parameters — goes through here first, so a
hostile one (an alias bomb, a recursive alias, nesting thousands deep, a 100 MB file, bytes
that are not UTF-8) gets a one-line `BoundedError` in bounded time and memory instead of a
traceback, a RecursionError or gigabytes of memory.

How YAML is bounded: before PyYAML builds anything, its event stream (a flat, non-recursive
parse; libyaml's when available) is walked once, counting every node as it would be after
expanding aliases and the nesting depth; an alias to an anchor still open is a recursive alias.
Only a document that passes is composed and constructed. JSON: the bracket nesting is
counted outside strings before `json.loads` (CPython's decoder recurses per level).

Imports nothing of ours; `knobs.py` may import it.
"""

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, List, Optional, Union

import yaml

MiB = 1024 * 1024

@dataclass(frozen=True)
class Limits:
    """Bounds for one kind of text: bytes, nesting depth, values after alias expansion."""
    max_bytes: int
    max_depth: int = 64
    max_nodes: int = 200_000


MODEL_FILE = Limits(max_bytes=4 * MiB, max_depth=64, max_nodes=200_000)
POLICY_FILE = Limits(max_bytes=1 * MiB, max_depth=32, max_nodes=50_000)
SERVER_CONFIG = Limits(max_bytes=1 * MiB, max_depth=32, max_nodes=50_000)
SCHEMA = Limits(max_bytes=4 * MiB, max_depth=64)
WARMUP_FILE = Limits(max_bytes=64 * MiB, max_depth=64)
CONFIG_JSON = Limits(max_bytes=16 * MiB, max_depth=64)  # a model's config.json
REQUEST_BODY = Limits(max_bytes=32 * MiB, max_depth=128)


class BoundedError(ValueError):
    """What is wrong with a text, in one line; `line` (1-based) where known."""

    def __init__(self, problem: str, line: Optional[int] = None):
        self.problem, self.line = problem, line
        super().__init__(problem + (f" (line {line})" if line else ""))


def read_text(path: Union[str, Path], limits: Limits) -> str:
    """The file's text: at most `limits.max_bytes`, UTF-8 (a BOM is dropped)."""
    try:
        with open(path, "rb") as f:
            data = f.read(limits.max_bytes + 1)
    except OSError as e:
        raise BoundedError(f"cannot read the file: {e.strerror or e}") from None
    if len(data) > limits.max_bytes:
        raise _too_large(limits)
    return decode(data)


def decode(data: bytes) -> str:
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise BoundedError(f"not UTF-8 text: byte 0x{data[e.start]:02x} at offset {e.start}; "
                           "allowed: UTF-8", line) from None


def _too_large(limits: Limits) -> BoundedError:
    size = _size(limits.max_bytes)
    return BoundedError(f"larger than {size}; allowed: at most {size}")


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


# --- YAML ------------------------------------------------------------------------------

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def check_yaml(text: str, limits: Limits) -> None:
    """Raise BoundedError when `text` is too large, nested too deep, expands to too many
    nodes through aliases, or has a recursive alias; YAML syntax errors pass through as
    yaml.YAMLError."""
    if len(text) > limits.max_bytes:
        raise _too_large(limits)
    # Per open collection: [anchor, expanded node count, subtree height]
    stack: List[list] = []
    anchors = {}  # anchor -> (expanded node count, height)
    open_anchors = set()
    total = 0
    for event in yaml.parse(text, Loader=_Loader):
        line = event.start_mark.line + 1 if event.start_mark else None
        if isinstance(event, yaml.DocumentStartEvent):
            anchors.clear()  # anchors are per document
            continue
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            if len(stack) + 1 > limits.max_depth:
                raise BoundedError(f"nested deeper than {limits.max_depth} levels; allowed: at most "
                                   f"{limits.max_depth}", line)
            stack.append([event.anchor, 1, 1])
            if event.anchor:
                open_anchors.add(event.anchor)
            size, height = 1, 0
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            anchor, size, height = stack.pop()
            if anchor:
                open_anchors.discard(anchor)
                anchors[anchor] = (size, height)
            _add(stack, size, height)
            continue
        elif isinstance(event, yaml.ScalarEvent):
            size, height = 1, 1
            if event.anchor:
                anchors[event.anchor] = (1, 1)
        elif isinstance(event, yaml.AliasEvent):
            if event.anchor in open_anchors:
                raise BoundedError(f"recursive alias *{event.anchor} (it refers to a node that contains it)", line)
            if event.anchor not in anchors:
                raise BoundedError(f"alias *{event.anchor} names no anchor before it", line)
            size, height = anchors[event.anchor]
            if len(stack) + height > limits.max_depth:
                raise BoundedError(f"alias *{event.anchor} nests deeper than {limits.max_depth} levels; "
                                   f"allowed: at most {limits.max_depth}", line)
        else:
            continue
        total += size
        if total > limits.max_nodes:
            raise BoundedError(f"expands to more than {limits.max_nodes} values (aliases counted as "
                               f"copies); allowed: at most {limits.max_nodes}", line)
        if not isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            _add(stack, size, height)


def _add(stack: List[list], size: int, height: int) -> None:
    if stack:
        stack[-1][1] += size
        stack[-1][2] = max(stack[-1][2], height + 1)


def load_yaml(text: str, limits: Limits) -> Any:
    check_yaml(text, limits)
    return yaml.load(text, Loader=_Loader)


def load_yaml_all(text: str, limits: Limits) -> List[Any]:
    check_yaml(text, limits)
    return list(yaml.load_all(text, Loader=_Loader))


def yaml_problem(e: yaml.YAMLError) -> BoundedError:
    """A PyYAML error as one line with its line number."""
    mark = getattr(e, "problem_mark", None)
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    return BoundedError(f"not valid YAML: {problem}", mark.line + 1 if mark else None)


def read_yaml(path: Union[str, Path], limits: Limits) -> Any:
    """Read, bound and load one YAML document; BoundedError for every problem."""
    text = read_text(path, limits)
    try:
        return load_yaml(text, limits)
    except yaml.YAMLError as e:
        raise yaml_problem(e) from None


# --- JSON ------------------------------------------------------------------------------

_STRING = re.compile(r'"(?:[^"\\]|\\.)*"', re.S)
_BRACKETS = re.compile(r"[\[\]{}]")


def json_depth(text: str) -> int:
    """The deepest bracket nesting of a JSON text, strings skipped."""
    depth = deepest = 0
    for match in _BRACKETS.finditer(_STRING.sub('""', text)):
        if match.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads_json(text: Union[str, bytes], limits: Limits) -> Any:
    """json.loads with the size and depth bounds; BoundedError for every problem."""
    if isinstance(text, bytes):
        if len(text) > limits.max_bytes:
            raise _too_large(limits)
        text = decode(text)
    if len(text) > limits.max_bytes:
        raise _too_large(limits)
    depth = json_depth(text)
    if depth > limits.max_depth:
        raise BoundedError(f"nested {depth} levels deep; allowed: at most {limits.max_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise BoundedError(f"not valid JSON: {e.msg} at char {e.pos}", e.lineno) from None
    except RecursionError:  # depth counted above; belt and braces
        raise BoundedError(f"nested too deeply; allowed: at most {limits.max_depth} levels") from None


def read_json(path: Union[str, Path], limits: Limits) -> Any:
    return loads_json(read_text(path, limits), limits)
