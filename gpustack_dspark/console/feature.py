"""The console as the plugin sees it: the DSpark page in GPUStack's web UI, its menu entry and
the sampler behind it.

Off (with the reason) if GPUStack lacks what it needs or the UI assets are missing; GPUStack's
own UI is then untouched. It reads the routing layer's live counts through the two callables it
is given (the console never imports routing), and the feature states through a third.
"""

from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.console.index_inject import IndexInjectMiddleware
from gpustack_dspark.console.rolling import Rollouts
from gpustack_dspark.console.routes import build_console_router, missing_assets
from gpustack_dspark.console.sampler import ConsoleSampler
from gpustack_dspark.feature import Context, Feature, On, Task

PAGE = "/dspark/console"


class Console(Feature):
    name = "console"
    section = "replica_caches"

    def __init__(self, in_flight: Callable[[], Mapping[Any, Mapping[str, Any]]],
                 format_checks: Callable[[], Dict[Tuple[str, str, str], int]],
                 feature_states: Callable[[], Dict[str, Any]]) -> None:
        self.in_flight = in_flight
        self.format_checks = format_checks
        self.feature_states = feature_states
        self.sampler: Optional[ConsoleSampler] = None

    def start(self, ctx: Context) -> On:
        gs.require_feature(self.name)
        missing = missing_assets()
        if missing:  # a broken install, not a setting: reported as the fault it is
            raise RuntimeError(f"ui-patches/ lacks {', '.join(missing)}")
        detail = {"page": PAGE}
        sampler = ConsoleSampler(self.in_flight, self.format_checks, lambda reason: ctx.report.on(reason, **detail))
        ctx.app.include_router(build_console_router(sampler, Rollouts(), self.feature_states))
        ctx.app.add_middleware(IndexInjectMiddleware)
        self.sampler = sampler
        return On(detail)

    def tasks(self) -> List[Task]:
        return [self.sampler.task]

    def status(self) -> Optional[Dict[str, Any]]:
        """`replica_caches`: per DSpark deployment and replica, from the sampler's last pass, what
        affinity routing is for — each replica's prefix-cache hit rate and grammar compiles —
        beside the proxy's affinity counts for it (None while the console is off)."""
        return self.sampler.replica_caches() if self.sampler else None
