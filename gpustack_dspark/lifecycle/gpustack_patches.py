"""Glue: re-announce DSpark instances that stay STARTING (missed_start.py says why and when).

GPUStack internals used (the GPUStack seam's `NEEDS["missed_start_repair"]`), checked by
`check()` when the plugin starts (the feature is off with the reason when any is missing):
- `gpustack.worker.backends.base.InferenceServer._until_model_instance_starting`: the watch
  that can miss the event;
- `gpustack.server.services.ModelInstanceService.update`: saving the row, which publishes
  UPDATED after the commit and clears GPUStack's caches for the instance;
- `ModelInstance.all_by_field` and `Model.one_by_id`.
"""

import asyncio
import logging
import time
from typing import Callable, List, Optional

from gpustack_dspark import backend_ids
from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.lifecycle.missed_start import INTERVAL_S, MissedStart, starting_ids

logger = logging.getLogger(__name__)


def check() -> List[str]:
    """What this repair needs from GPUStack that is missing (empty: all there)."""
    return gs.problems(*gs.NEEDS["missed_start_repair"])


async def pass_once(tracker: MissedStart) -> List[int]:
    """One pass: the DSpark instances STARTING now, re-announced where due. Returns those."""
    Model, ModelInstance, ModelInstanceService = gs.Model, gs.ModelInstance, gs.ModelInstanceService
    async with gs.async_session() as session:
        instances = await ModelInstance.all_by_field(session, "state", gs.ModelInstanceStateEnum.STARTING)
        backends = {}
        for instance in instances:
            if instance.model_id not in backends:
                model = await Model.one_by_id(session, instance.model_id)
                backends[instance.model_id] = model.backend if model is not None else None
        rows = [(i.id, getattr(i.state, "value", i.state), backends.get(i.model_id)) for i in instances]
        due = tracker.due(starting_ids(rows, backend_ids.BACKEND_NAME), time.monotonic())
        by_id = {i.id: i for i in instances}
        for instance_id in due:
            await ModelInstanceService(session).update(by_id[instance_id], {})
            tracker.done(instance_id)
            logger.info("DSpark: instance %s (%s) still STARTING; its state re-announced in case its worker "
                        "missed the event (GPUStack 2.3 race, lifecycle/missed_start.py)",
                        instance_id, by_id[instance_id].name)
    return due


async def task(tracker: MissedStart, report: Callable[[Optional[str]], None]) -> None:
    failures = 0
    while True:
        await asyncio.sleep(INTERVAL_S)
        try:
            await pass_once(tracker)
            failures = 0
            report(None)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a failing pass is reported; the next one tries again
            failures += 1
            if failures == 1:
                logger.exception("DSpark missed-start repair: a pass failed")
            report(f"last pass failed: {type(e).__name__}: {e}"[:300])
