"""The vLLM seam: the one package of the worker that imports vLLM's internals.

Why: vLLM moves fast and the worker follows its internals (the launcher follows `run_server`,
the drafting layer subclasses the scheduler and the structured-output manager). Every name
used is a row of `names.py` with where each supported series (0.32.x, 0.33.x) keeps it;
`resolve.py` imports them for the installed vLLM and checks them at start; `sources.py`
checks them against any release's sources (a wheel or sdist) without running it. An upgrade
is an edit of `names.py`, and `python -m gpustack_dspark.worker.vllm_seam.sources WHEEL`
says whether it is enough.
"""

from gpustack_dspark.worker.vllm_seam.names import INTERNALS, SUPPORTED_SERIES, series_of  # noqa: F401
from gpustack_dspark.worker.vllm_seam.resolve import (  # noqa: F401
    installed_series,
    installed_vllm_version,
    module_of,
    problems,
    resolve,
    version_problem,
)

__all__ = ["INTERNALS", "SUPPORTED_SERIES", "series_of", "installed_series", "installed_vllm_version", "module_of", "problems",
           "resolve", "version_problem"]
