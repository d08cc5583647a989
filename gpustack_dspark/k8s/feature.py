"""The node-label sync as the plugin sees it (`NodeLabelSyncFeature`): start it, run its task,
report it.

Off unless `--dspark-node-label-sync-selector` is given. A kubeconfig (or in-cluster
config) that cannot be loaded turns off this feature only. Once running, nothing raises
out of the task: Kubernetes API errors are retried by the watch thread with back-off,
database errors by the pass loop, and the current reason is reported through `report`
(the feature stays `enabled`, with `reason` set while something is failing).
"""

import asyncio
import logging
import time
from collections import deque
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.feature import Context, Feature, FeatureOff, On, Report as FeatureReport, Task, TurnedOff
from gpustack_dspark.k8s import node_watch, gpustack_writes
from gpustack_dspark.k8s.node_labels import MARKER_KEY, NodeView, plan_labels
from gpustack_dspark.labels import parse_selector

logger = logging.getLogger(__name__)

RESYNC_S = 5.0  # a pass at least this often: workers that joined after their node matched
GUARD_RETRY_S = 10.0
DB_BACKOFF_MAX_S = 30.0

Report = Callable[..., None]  # report(reason: Optional[str], **detail)


class NodeLabelSync:
    def __init__(self, selector: str, kubeconfig: Optional[str], json_label: Tuple[str, str],
                 report: Report) -> None:
        self.selector = selector
        self.kubeconfig = kubeconfig
        self.json_label = json_label
        self.report = report
        self.guard = gpustack_writes.WriterGuard()
        self.watcher: Optional[node_watch.NodeWatcher] = None
        self.passes = 0
        self.last_pass: Dict[str, Any] = {}
        self.history: deque = deque(maxlen=20)
        self.db_error: Optional[str] = None
        self.writer = "waiting for the writer lock"
        self._wake: Optional[asyncio.Event] = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def start(self) -> None:
        """Load the client configuration; raises with the reason the feature is off."""
        requirements = parse_selector(self.selector)
        try:
            api_client = node_watch.load_api_client(self.kubeconfig)
        except Exception as e:
            where = f"kubeconfig {self.kubeconfig}" if self.kubeconfig else "in-cluster config"
            detail = " ".join(str(e).split())  # YAML parser errors span lines
            raise RuntimeError(f"cannot load the {where}: {type(e).__name__}: {detail}") from e
        self.watcher = node_watch.NodeWatcher(api_client, NodeView(requirements), self.selector, self._changed)

    def _changed(self) -> None:  # from the watch thread
        if self._loop is not None and self._wake is not None:
            self._loop.call_soon_threadsafe(self._wake.set)

    async def task(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._report()
        while not await self._hold_writer_lock():
            await asyncio.sleep(GUARD_RETRY_S)
        self.watcher.start()
        delay = 1.0
        try:
            while True:
                try:
                    await asyncio.wait_for(self._wake.wait(), RESYNC_S)
                except asyncio.TimeoutError:
                    pass
                self._wake.clear()
                try:
                    if await self._hold_writer_lock():
                        await self._pass()
                    self.db_error = None
                    delay = 1.0
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    self.db_error = f"writing worker labels failed: {type(e).__name__}: {e}"
                    logger.warning("node-label sync: %s; retrying in %.0f s", self.db_error, delay)
                    self._report()
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, DB_BACKOFF_MAX_S)
                    continue
                self._report()
        finally:
            self.watcher.stop()
            await self.guard.release()

    async def _hold_writer_lock(self) -> bool:
        try:
            held = await self.guard.acquire()
        except asyncio.CancelledError:
            raise
        except Exception as e:
            self.writer = f"writer lock unavailable: {type(e).__name__}: {e}"
            self._report()
            return False
        self.writer = f"this server ({self.guard.kind})" if held else \
            f"standby: another server process holds the {self.guard.kind}"
        if not held:
            self._report()
        return held

    async def _pass(self) -> None:
        matching = self.watcher.matching()
        if matching is None:  # no successful list yet: nothing known, nothing touched
            return
        workers = await gpustack_writes.read_workers()
        plan = plan_labels(matching, workers, self.json_label)
        written = await gpustack_writes.apply_plan(matching, [c.worker_id for c in plan.changes], self.json_label)
        self.passes += 1
        for change in plan.changes:
            if change.worker_name in written:
                self.history.append({"at": round(time.time(), 3), "worker": change.worker_name,
                                     "action": "added" if change.set else "removed"})
                logger.info("node-label sync: %s %s on worker %s", "set" if change.set else "removed",
                            f"{self.json_label[0]}={self.json_label[1]}", change.worker_name)
        known = {w.name for w in workers}
        self.last_pass = {
            "labelled_workers": list(plan.labelled),
            "nodes_without_worker": sorted(matching - known),
            "ambiguous_worker_names": list(plan.ambiguous),
        }

    def _reason(self) -> Optional[str]:
        watch = self.watcher.status() if self.watcher else {}
        if watch.get("last_error"):
            retry = watch.get("retry_in_s")
            return f"{watch['last_error']}; retrying" + (f" in {retry:.0f} s" if retry is not None else "")
        if self.db_error:
            return self.db_error
        if not self.guard.held:
            return self.writer
        if not watch.get("synced"):
            return "waiting for the first list of nodes"
        return None

    def _report(self) -> None:
        try:
            watch = self.watcher.status() if self.watcher else {}
            self.report(self._reason(), selector=self.selector, json_label="=".join(self.json_label),
                        matching_nodes=len(watch.get("matching_nodes", [])),
                        labelled_workers=len(self.last_pass.get("labelled_workers", [])),
                        writer=self.writer)
        except Exception:  # reporting never breaks the sync
            logger.exception("node-label sync: status report failed")

    def status(self) -> Dict[str, Any]:
        return {
            "selector": self.selector,
            "kubeconfig": self.kubeconfig or "in-cluster",
            "json_label": "=".join(self.json_label),
            "marker_label": MARKER_KEY,
            "writer": self.writer,
            "reason": self._reason(),
            "watch": self.watcher.status() if self.watcher else None,
            "passes": self.passes,
            "last_pass": dict(self.last_pass),
            "recent_changes": list(self.history),
            "database_error": self.db_error,
        }


class NodeLabelSyncFeature(Feature):
    """`node_label_sync`: off unless a selector is configured; its section of the status is the
    running sync's (None while off)."""

    name = "node_label_sync"
    section = "node_label_sync"

    def __init__(self) -> None:
        self.sync: Optional[NodeLabelSync] = None
        self.report: Optional[FeatureReport] = None

    def start(self, ctx: Context) -> On:
        settings = ctx.settings
        selector = settings.node_label_sync_selector
        if not selector:
            raise TurnedOff("not configured (--dspark-node-label-sync-selector)")
        sync = NodeLabelSync(selector, settings.node_label_sync_kubeconfig, settings.json_label, ctx.report.on)
        try:  # a bad selector or kubeconfig, a GPUStack without what the sync writes through
            gs.require_feature(self.name)
            sync.start()
        except Exception as e:
            raise FeatureOff(str(e), selector=selector) from e
        self.sync, self.report = sync, ctx.report
        return On({"selector": selector}, reason="starting")

    def tasks(self) -> List[Task]:
        return [self.run_node_label_sync]

    async def run_node_label_sync(self) -> None:
        try:
            await self.sync.task()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug in the sync: this feature off, the server unaffected
            logger.exception("DSpark node-label sync stopped")
            self.report.off(f"stopped: {type(e).__name__}: {e}")

    def status(self) -> Optional[Dict[str, Any]]:
        return self.sync.status() if self.sync else None
