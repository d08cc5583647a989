"""The missed-start repair as the plugin sees it: off (with what GPUStack lacks) or a task
that re-announces DSpark instances stuck STARTING (missed_start.py says why and when)."""

from typing import List, Optional

from gpustack_dspark.feature import Context, Feature, FeatureOff, On, Report, Task
from gpustack_dspark.lifecycle import gpustack_patches
from gpustack_dspark.lifecycle.missed_start import MissedStart


class MissedStartRepair(Feature):
    name = "missed_start_repair"

    def __init__(self) -> None:
        self.tracker = MissedStart()
        self.report: Optional[Report] = None

    def start(self, ctx: Context) -> On:
        problems = gpustack_patches.check()
        if problems:
            raise FeatureOff("; ".join(problems))
        self.report = ctx.report
        return On(self.tracker.snapshot())

    def tasks(self) -> List[Task]:
        return [self.missed_start_task]

    async def missed_start_task(self) -> None:
        await gpustack_patches.task(self.tracker, lambda reason: self.report.on(reason, **self.tracker.snapshot()))
