"""Glue: a console change applied to a running deployment.

1. The model update is the one `gpustack-dspark apply` makes for a running deployment: a
   sparse `PUT /v2/models/{id}` (`backend_ids.sparse_model_update`) on GPUStack's own API, with the
   caller's own credentials, so GPUStack's validation and the plugin's knob check
   (`admission/`) judge it exactly as they judge the CLI. A refusal comes back as it is.
2. Then a rolling restart (`rollout.next_step`): one old replica deleted at a time (GPUStack
   starts its replacement with the new settings), the next only once every replica is
   RUNNING and warm again; never fewer than N-1 warm.
"""

import asyncio
import logging
import time
from typing import Any, Dict, List, Mapping, Optional

from gpustack_dspark import gpustack_seam as gs
from gpustack_dspark.backend_ids import sparse_model_update
from gpustack_dspark.console import rollout
from gpustack_dspark.console.sampler import read_deployments, read_replica

logger = logging.getLogger(__name__)

STEP_INTERVAL_S = 2.0
REPLICA_TIMEOUT_S = 900.0
CREDENTIAL_HEADERS = ("authorization", "cookie", "x-api-key")


class GPUStackRefused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def put_backend_parameters(base_url: str, headers: Mapping[str, str], model: Dict[str, Any],
                                 backend_parameters: List[str]) -> Dict[str, Any]:
    import httpx

    auth = {k: v for k, v in headers.items() if k.lower() in CREDENTIAL_HEADERS}
    async with httpx.AsyncClient(base_url=base_url, timeout=30, trust_env=False, headers=auth) as client:
        r = await client.put(f"/v2/models/{model['id']}",
                             json=sparse_model_update(model, {"backend_parameters": backend_parameters}))
    if r.status_code >= 400:
        try:
            message = r.json().get("message") or r.text
        except ValueError:
            message = r.text
        raise GPUStackRefused(r.status_code, str(message)[:2000])
    return r.json()


async def replicas_now(model_id: int) -> Optional[tuple]:
    import httpx

    for model, instances in await read_deployments():
        if model["id"] == model_id:
            async with httpx.AsyncClient(timeout=2.0, trust_env=False) as client:
                infos = await asyncio.gather(*(read_replica(client, i) for i in instances))
            return model, [rollout.Replica(i["id"], str(i.get("state")).lower() == "running"
                                           and (info or {}).get("phase") == "ready")
                           for i, (info, _, _) in zip(instances, infos)]
    return None


class Rollouts:
    """One rolling change per deployment at a time; its progress for the console."""

    def __init__(self) -> None:
        self.state: Dict[int, Dict[str, Any]] = {}
        self._tasks: Dict[int, asyncio.Task] = {}

    def running(self, model_id: int) -> bool:
        task = self._tasks.get(model_id)
        return task is not None and not task.done()

    def start(self, model_id: int, old_ids: List[int], wanted: int, changes: List[Dict[str, Any]]) -> Dict[str, Any]:
        self.state[model_id] = {"state": "rolling", "started_at": time.time(), "finished_at": None,
                                "changes": changes, "old_ids": sorted(old_ids), "restarted": [],
                                "replicas": [], "message": "starting"}
        self._tasks[model_id] = asyncio.get_running_loop().create_task(self._run(model_id, set(old_ids), wanted))
        return self.state[model_id]

    async def _run(self, model_id: int, old_ids: set, wanted: int) -> None:
        state = self.state[model_id]
        waiting_since = time.monotonic()
        try:
            while True:
                found = await replicas_now(model_id)
                if found is None:
                    state.update(state="failed", message="the deployment was deleted", finished_at=time.time())
                    return
                model, replicas = found
                state["replicas"] = rollout.progress(replicas, old_ids)
                step = rollout.next_step(replicas, model.get("replicas") or wanted, old_ids)
                state["message"] = step.why
                if step.action == rollout.DONE:
                    state.update(state="done", finished_at=time.time())
                    return
                if step.action == rollout.RESTART and step.instance_id not in state["restarted"]:
                    await self._delete_instance(step.instance_id)
                    state["restarted"].append(step.instance_id)
                    waiting_since = time.monotonic()
                elif time.monotonic() - waiting_since > REPLICA_TIMEOUT_S:
                    state.update(state="failed", finished_at=time.time(),
                                 message=f"not warm after {REPLICA_TIMEOUT_S:.0f} s: {step.why}")
                    return
                await asyncio.sleep(STEP_INTERVAL_S)
        except asyncio.CancelledError:
            raise
        except Exception as e:  # never reaches GPUStack: the console shows it
            logger.exception("DSpark rolling change of model %s failed", model_id)
            state.update(state="failed", message=f"{type(e).__name__}: {e}"[:300], finished_at=time.time())

    @staticmethod
    async def _delete_instance(instance_id: int) -> None:
        async with gs.async_session() as session:
            instance = await gs.ModelInstance.one_by_id(session, instance_id)
            if instance is not None:
                await gs.ModelInstanceService(session).delete(instance)
        logger.info("DSpark rolling change: restarted instance %s", instance_id)
