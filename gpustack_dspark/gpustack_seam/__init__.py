"""The GPUStack seam: the one package of gpustack-dspark that imports `gpustack.*`.

Why: GPUStack moves fast and the plugin reaches into its internals. An upgrade should be a
one-folder job: `shapes.py` names every internal the features use (module, attribute,
parameters) and which feature needs which; `guard.py` checks them (version, presence,
signature) and marks our patches. Features ask this package, never GPUStack:

    from gpustack_dspark import gpustack_seam as gs
    gs.require_feature("console")      # SeamMismatch (a FeatureOff) naming what is missing
    async with gs.async_session() as session: ...   # a row of shapes.SHAPES, resolved lazily

Names are resolved on first use (importing this package imports nothing of GPUStack), so
the CLI and the worker, which have no GPUStack, never pay for it.
"""

from typing import Any

from gpustack_dspark.gpustack_seam.guard import (  # noqa: F401  (the seam's API)
    MARK,
    PatchResult,
    SeamMismatch,
    is_patched,
    problems,
    require,
    require_feature,
    resolve,
    target,
    unwrap,
    version_reason,
    wrap,
)
from gpustack_dspark.gpustack_seam.shapes import NEEDS, SHAPES  # noqa: F401

__all__ = ["MARK", "NEEDS", "SHAPES", "PatchResult", "SeamMismatch", "is_patched", "problems", "require",
           "require_feature", "resolve", "target", "unwrap", "version_reason", "wrap"]


def __getattr__(name: str) -> Any:
    if name in SHAPES:
        return resolve(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
