"""Glue: the GPUStack side of the node-label sync — worker labels in GPUStack's database,
and the one-writer guard.

Label writes do what GPUStack 2.3's `POST /v2/workers/labels` does (`routes/workers.py`):
lock the worker rows (`WorkerService.get_workers_for_update`), change `worker.labels`, and
save through `WorkerService.batch_update`, which publishes GPUStack's worker UPDATED events
and drops its worker caches. The decision is re-made on the locked rows, so a label a user
changed between our read and our write is judged as it is now.
"""

import logging
from typing import List, Optional, Sequence, Tuple

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.k8s.node_labels import WorkerLabels, plan_labels

logger = logging.getLogger(__name__)

# pg_advisory_lock key: "dspknls" (gpustack-dspark node-label sync) as a 64-bit integer.
ADVISORY_LOCK_KEY = 0x6473706B6E6C73
MYSQL_LOCK_NAME = "gpustack-dspark-node-label-sync"


async def read_workers() -> List[WorkerLabels]:
    from sqlmodel import select

    Worker = gs.Worker
    async with gs.async_session() as session:
        result = await session.exec(select(Worker).where(Worker.deleted_at.is_(None)))
        return [WorkerLabels(w.id, w.name, dict(w.labels or {})) for w in result.all()]


async def apply_plan(matching: frozenset, worker_ids: Sequence[int], json_label: Tuple[str, str]) -> List[str]:
    """Re-plan the given workers under row locks and write what changed; returns the names
    of the workers written."""
    if not worker_ids:
        return []
    async with gs.async_session() as session:
        service = gs.WorkerService(session)
        rows = await service.get_workers_for_update(sorted(set(worker_ids)))
        plan = plan_labels(matching, [WorkerLabels(w.id, w.name, dict(w.labels or {})) for w in rows], json_label)
        by_id = {c.worker_id: c for c in plan.changes}
        changed = []
        for worker in rows:
            change = by_id.get(worker.id)
            if change is None:
                continue
            worker.labels = change.apply(worker.labels or {})
            changed.append(worker)
        if changed:
            await service.batch_update(changed)
        else:
            await session.rollback()  # release the row locks
        return [w.name for w in changed]


class WriterGuard:
    """Only one server process writes labels: a session-level PostgreSQL advisory lock (MySQL:
    GET_LOCK) held on a connection of its own for as long as the sync runs. OSS GPUStack 2.3
    runs one server, but plugin tasks run in every server process, so a future multi-server
    GPUStack on one database gets one writer and standbys. Other databases: no guard."""

    def __init__(self) -> None:
        self._connection = None
        self.kind: Optional[str] = None
        self.held = False

    async def acquire(self) -> bool:
        from sqlalchemy import text

        db = gs.db
        if self.held and await self._alive():
            return True
        await self.release()
        dialect = db.engine.dialect.name
        if dialect == "postgresql":
            self.kind = "postgresql advisory lock"
            statement, params = text("SELECT pg_try_advisory_lock(:key)"), {"key": ADVISORY_LOCK_KEY}
        elif dialect in ("mysql", "mariadb"):
            self.kind = "mysql GET_LOCK"
            statement, params = text("SELECT GET_LOCK(:name, 0)"), {"name": MYSQL_LOCK_NAME}
        else:
            self.kind = f"none ({dialect}: one server assumed)"
            self.held = True
            return True
        connection = await db.engine.connect()
        try:
            got = (await connection.execute(statement, params)).scalar()
            await connection.commit()
        except Exception:
            await connection.close()
            raise
        if got in (True, 1):
            self._connection = connection
            self.held = True
        else:
            await connection.close()
            self.held = False
        return self.held

    async def _alive(self) -> bool:
        from sqlalchemy import text

        if self._connection is None:
            return self.held  # no-guard databases
        try:
            await self._connection.execute(text("SELECT 1"))
            await self._connection.commit()
            return True
        except Exception as e:
            logger.warning("node-label sync: the writer lock's connection is gone (%s); re-acquiring", e)
            return False

    async def release(self) -> None:
        connection, self._connection, self.held = self._connection, None, False
        if connection is not None:
            try:
                # Ends the database session (a pooled connection going back to the pool
                # would keep a session-level lock).
                await connection.invalidate()
            except Exception:
                pass
