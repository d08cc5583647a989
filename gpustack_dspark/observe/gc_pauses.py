"""The server's garbage-collector pauses, timed; and `gc.freeze()` once startup is over.

Stock GPUStack 2.3 under load showed full (generation 2) collections of 0.6-0.9 s about
once per 1,000 requests: every request through the proxy waits for them. CPython's
`gc.freeze()` moves every object alive at that moment into a permanent generation that
collections no longer walk, so after startup (GPUStack's models, SQLAlchemy metadata,
FastAPI routes) a full collection only walks what came later. On by default
(`proxy.gc_freeze` in the routing policy); the pauses are timed either way and shown in
`GET /v2/dspark/status` (`routing.gc`).
"""

import asyncio
import gc
import logging
import threading
import time
from collections import deque
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)

FREEZE_AFTER_S = 20.0  # after the server started: its startup allocations are done by then


class GcPauses:
    def __init__(self) -> None:
        # Re-entrant: a collection can start inside `snapshot()` itself (any allocation there),
        # and its callback then runs on the same thread, inside the `with`. With a plain Lock that
        # callback waited on its own thread forever and froze the server's event loop (found by
        # the affinity benchmark polling the status 4 times a second: every request hung).
        self._lock = threading.RLock()
        self._started: Optional[float] = None
        self.by_generation: Dict[int, Dict[str, float]] = {g: {"count": 0, "total_s": 0.0, "max_s": 0.0} for g in range(3)}
        self.frozen_at: Optional[float] = None
        self.frozen_objects = 0
        self.installed = False
        self.recent_full = deque(maxlen=64)  # (wall time, seconds) of the last full collections
        self._quiet = False  # our own gc.collect() in freeze() is not a stall

    def _callback(self, phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        if self._started is None or self._quiet:
            return
        took = time.perf_counter() - self._started
        self._started = None
        entry = self.by_generation.get(info.get("generation", 2))
        if entry is None:
            return
        with self._lock:
            entry["count"] += 1
            entry["total_s"] += took
            entry["max_s"] = max(entry["max_s"], took)
            if info.get("generation") == 2:
                self.recent_full.append((time.time(), took))

    def install(self) -> None:
        if not self.installed:
            gc.callbacks.append(self._callback)
            self.installed = True

    def freeze(self) -> int:
        self._quiet = True
        try:
            gc.collect()
        finally:
            self._quiet = False
        gc.freeze()
        self.frozen_at = time.time()
        self.frozen_objects = gc.get_freeze_count()
        logger.info("gc.freeze(): %d objects alive after startup moved out of the collector's walk",
                    self.frozen_objects)
        return self.frozen_objects

    async def freeze_after_startup(self, delay_s: float = FREEZE_AFTER_S) -> None:
        await asyncio.sleep(delay_s)
        self.freeze()

    def snapshot(self) -> Dict[str, Any]:
        with self._lock:
            generations = {str(g): {"count": int(v["count"]), "total_ms": round(v["total_s"] * 1000, 2),
                                    "max_ms": round(v["max_s"] * 1000, 2)} for g, v in self.by_generation.items()}
            recent = [[round(t, 3), round(took * 1000, 2)] for t, took in list(self.recent_full)[-16:]]
        return {"timed": self.installed, "frozen_objects": self.frozen_objects, "frozen_at": self.frozen_at,
                "collections": generations, "recent_full_ms": recent}
