"""The one guard around GPUStack internals: version gate, import, shape check, patch mark.

Why: the version gate, the import, the signature check, the patch mark and the result used to
be written three times with three conventions (placement, admission, routing). Here once:
- `problems(*names)`: the version first (a GPUStack that is not the supported release makes
  every name a problem: the internals were written for one release), then each name's row in
  `shapes.SHAPES` — importable, present, parameter names in order, coroutine-ness. One line
  per problem, naming what is missing or what it takes and what was expected.
- `require(*names)` / `require_feature(name)`: the same, raised as `SeamMismatch` (a
  `FeatureOff`: the feature that asked is off with that reason, nothing applied).
- `wrap(original, wrapper)`, `is_patched`, `unwrap`: one patch mark (`_dspark_patched`) and
  `__wrapped__` on everything we put in GPUStack's place, so a re-apply replaces, never stacks.
"""

import importlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, List, Optional, Tuple

from gpustack_dspark import versions
from gpustack_dspark.feature import FeatureOff
from gpustack_dspark.gpustack_seam.shapes import NEEDS, SHAPES, Shape

MARK = "_dspark_patched"


class SeamMismatch(FeatureOff):
    """GPUStack does not have the shape a feature needs; the message says which."""


@dataclass(frozen=True)
class PatchResult:
    """What applying a patch did: applied, or why not (one line); the hooks put in place."""

    applied: bool
    reason: str = ""
    hooks: List[str] = field(default_factory=list)

    def or_off(self) -> "PatchResult":
        """This result when applied; else `FeatureOff` with its reason (the feature that applied
        it is off, nothing was put in place)."""
        if not self.applied:
            raise FeatureOff(self.reason)
        return self


def version_reason() -> Optional[str]:
    check = versions.check_gpustack()
    return None if check.ok else check.reason


def _import(module: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise SeamMismatch(f"{module} is not importable: {e}") from None


def resolve_shape(shape: Shape) -> Any:
    """The object a row names; SeamMismatch naming it when it is not there."""
    found = _import(shape.module)
    for part in filter(None, shape.attr.split(".")):
        found = getattr(found, part, None)
        if found is None:
            raise SeamMismatch(f"{shape.where} is missing")
    return found


def resolve(name: str) -> Any:
    return resolve_shape(SHAPES[name])


def params_of(function: Callable) -> List[str]:
    return list(inspect.signature(function).parameters)


def shape_problem(shape: Shape, found: Any) -> Optional[str]:
    """Why `found` does not have the row's shape (None: it has)."""
    target = unwrap(found)
    if shape.method:
        target = getattr(target, shape.method, None)
        if target is None:
            return f"{shape.where}.{shape.method} is missing"
    if shape.coroutine and not inspect.iscoroutinefunction(target):
        return f"{shape.where} is no longer a coroutine function"
    if shape.params is not None:
        try:
            params = params_of(target)
        except (TypeError, ValueError) as e:
            return f"cannot read the signature of {shape.where}: {e}"
        if params != list(shape.params):
            return f"{shape.where} takes {params}, expected {list(shape.params)}"
    return None


def problems(*names: str) -> List[str]:
    """One line per name GPUStack lacks or has in another shape; the version first."""
    reason = version_reason()
    if reason:
        return [reason]
    out = []
    for name in names:
        shape = SHAPES[name]
        try:
            problem = shape_problem(shape, resolve_shape(shape))
        except SeamMismatch as e:
            problem = str(e)
        if problem and problem not in out:
            out.append(problem)
    return out


def require(*names: str) -> None:
    found = problems(*names)
    if found:
        raise SeamMismatch("; ".join(found))


def require_feature(feature: str) -> None:
    """Everything `feature` needs (shapes.NEEDS) is there, or SeamMismatch says what is not."""
    require(*NEEDS[feature])


def target(name: str) -> Tuple[Any, Any]:
    """(owner, current) of a row to be replaced: the module (or class) holding it and what is
    there now, checked (version, presence, shape). A current value that is already our patch
    is returned as it is (`is_patched` tells). Raises SeamMismatch."""
    reason = version_reason()
    if reason:
        raise SeamMismatch(reason)
    shape = SHAPES[name]
    owner_path, _, attr = shape.attr.rpartition(".")
    owner = resolve_shape(Shape(shape.module, owner_path))
    current = getattr(owner, attr, None)
    if current is None:
        raise SeamMismatch(f"{shape.where} is missing")
    if not is_patched(current):
        problem = shape_problem(shape, current)
        if problem:
            raise SeamMismatch(problem)
    return owner, current


def wrap(original: Any, replacement: Any) -> Any:
    """Mark `replacement` as ours, standing in for `original` (which `unwrap` gives back)."""
    setattr(replacement, MARK, True)
    replacement.__wrapped__ = original
    if callable(original) and not isinstance(replacement, type):
        replacement.__doc__ = original.__doc__
    return replacement


def is_patched(value: Any) -> bool:
    return bool(getattr(value, MARK, False))


def unwrap(value: Any) -> Any:
    """GPUStack's own object under any of our patches."""
    while is_patched(value) and hasattr(value, "__wrapped__"):
        value = value.__wrapped__
    return value
