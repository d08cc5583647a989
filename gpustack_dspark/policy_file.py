"""One loader for the policy files (`placement.yaml`, `routing.yaml`): bounded reading and
one error format for every policy, pure apart from reading the file.

Messages: `<file>: key 'a.b': <problem> (got <value>)`, or
`<file>: key 'x' is not a <kind> policy key (allowed: ...)`, several joined by "; ".
"""

from pathlib import Path
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type, TypeVar

from pydantic import BaseModel, ValidationError

from gpustack_dspark import bounded


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the file and the key."""


def read_policy_yaml(path: Path) -> Any:
    """The YAML document of a policy file (None when empty), bounded; PolicyError names the
    file and, where known, the line."""
    try:
        return bounded.read_yaml(path, bounded.POLICY_FILE)
    except bounded.BoundedError as e:
        raise PolicyError(f"{path}: cannot read it as YAML: {e}") from None


M = TypeVar("M", bound=BaseModel)


def _key(loc: Tuple) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


def describe(error: dict, kind: str, allowed_keys: Callable[[Tuple], Sequence[str]]) -> str:
    loc = tuple(error["loc"])
    key = _key(loc)
    if error["type"] == "extra_forbidden":
        return f"key {key!r} is not a {kind} policy key (allowed: {', '.join(allowed_keys(loc))})"
    message = error["msg"].removeprefix("Value error, ")
    expected = (error.get("ctx") or {}).get("expected")
    tail = f"; allowed: {expected}" if expected else ""
    return f"key {key!r}: {message} (got {error.get('input')!r}{tail})"


def validate(model: Type[M], data: Any, source: str, kind: str,
             allowed_keys: Optional[Callable[[Tuple], Sequence[str]]] = None) -> M:
    """A loaded document -> the policy model; PolicyError lists every problem."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise PolicyError(f"{source}: expected a mapping of policy keys, got {type(data).__name__}")
    keys = allowed_keys or (lambda loc: _nested_fields(model, loc))
    try:
        return model.model_validate(data)
    except ValidationError as e:
        problems: List[str] = [describe(err, kind, keys) for err in e.errors()]
        raise PolicyError(f"{source}: " + "; ".join(problems)) from None


def _nested_fields(model: Type[BaseModel], loc: Tuple) -> List[str]:
    """The keys allowed where `loc` points (its parent's fields)."""
    current: Type[BaseModel] = model
    for part in loc[:-1]:
        field = current.model_fields.get(str(part))
        annotation = getattr(field, "annotation", None)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
        else:
            break
    return list(current.model_fields)
