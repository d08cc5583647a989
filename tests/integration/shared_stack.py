"""One GPUStack platform for every module that only needs one to exist: a GPUStack server with
the plugin on its own PostgreSQL, one listening CPU worker labelled `role=json-inference`, and
two real `dspark-serve` replicas. Started once per test session, on first use.

Why: a GPUStack server, a worker joining it and two vLLM replicas are each tens of seconds of
CPU on this 2-core machine, and the modules that used them each started their own (console,
request path, routing over real replicas, observability, the deploy form): minutes of the
suite spent starting the same things. What a module needs fresh it still starts itself (a
server with its own flags or a fault, a replica with other knobs).

Isolation is by names and by cleanup, not by processes: each module creates its models under
its own names on the shared server (`models_on`), and at the module's end every model it made
is deleted again, so the next module sees the platform as the last one left it: no model of
anyone else's, replicas that served some requests (tests read their counters as differences).

The replicas serve two names (`tiny-order` and `dspark-soak`): the soak model of the routing
module puts stand-ins and a real replica under one GPUStack model of the second name.

The session keeps this up only while modules that use it run: tests/conftest.py runs those
modules one after another and stops the platform after the last of them (a vLLM replica holds
about a gigabyte; the drafting module starts five of its own).
"""

from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import httpx

from gpustack_dspark import backend
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.postgres import Postgres, start_postgres
from gpustack_dspark.devstack.replica import SERVED_NAME, Replica, start_replica
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.worker import GPUStackWorker, join_cpu_worker
from tests.conftest import admin_api, wait_backend_registered, wait_for
from tests.support.stand_in_instances import RunningStateKeeper, create_stand_in_model, wait_routable

SOAK_MODEL = "dspark-soak"
# The knobs every user of the shared replicas was written against.
REPLICA_ARGS = ["--enable-dspark", "--dspark-warmup-requests", "2", "--served-model-name", SERVED_NAME, SOAK_MODEL]
WORKER_NAME = "shared-json-w1"
WORKER_LABELS = {"role": "json-inference"}

# {name: (replica ports, seconds to wait until it answers through /v1, or None: not waited for)}
ModelSpec = Dict[str, Tuple[Sequence[int], Optional[float]]]


def listening(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code < 500
    except httpx.HTTPError:
        return False


def join_listening_cpu_worker(server: GPUStackServer, api: GPUStackAPI, name: str, folder: Path,
                              labels: Optional[Dict[str, str]] = None) -> Tuple[GPUStackWorker, Dict]:
    """A CPU worker joined to `server` once the plugin registered its backend, returned (with its
    row) only when its HTTP server listens: READY comes first, and until it listens GPUStack
    marks the worker's models unavailable."""
    wait_backend_registered(server, api.api_key, 60)
    worker = join_cpu_worker(api, server.url, name, folder, labels=labels)
    try:
        row = api.get(f"/v2/workers/{worker.id}")
        wait_for(lambda: listening(worker.worker_port), 120, "the worker's API port")
    except BaseException:
        worker.stop()
        raise
    return worker, row


@contextmanager
def stand_in_models(server: GPUStackServer, api: GPUStackAPI, row: Dict, base: Path,
                    models: ModelSpec) -> Iterator[Dict[str, Dict]]:
    """One GPUStack model per entry of `models`, its instances RUNNING on the worker `row` at
    the given replica ports (kept RUNNING by a keeper), waited for until each answers through
    /v1. Yields {name: model}; at the end the keeper stops and the models are deleted."""
    created: Dict[str, Dict] = {}
    keeper = None
    try:
        for i, (name, (ports, _)) in enumerate(models.items()):
            created[name] = create_stand_in_model(api, name, backend.BACKEND_NAME, backend.CPU_VERSION,
                                                  row["cluster_id"], row, list(ports), base / f"model-{i}")
        keeper = RunningStateKeeper(admin_api(server), row).start()
        for model in created.values():
            keeper.watch(model["id"])
        for name, (_, timeout_s) in models.items():
            if timeout_s is not None:
                wait_routable(server.url, api.api_key, name, timeout_s)
        yield created
    finally:
        if keeper:
            keeper.stop()
        delete_models(api, [m["id"] for m in created.values()])


def delete_models(api: GPUStackAPI, ids: Sequence[int], timeout_s: float = 60) -> None:
    """Deletes the models and waits until GPUStack lists neither them nor their instances."""
    for model_id in ids:
        api.client.delete(f"/v2/models/{model_id}")
    wanted = set(ids)
    wait_for(lambda: not ({m["id"] for m in api.items("/v2/models")} & wanted)
             and not ({i["model_id"] for i in api.items("/v2/model-instances")} & wanted),
             timeout_s, f"models {sorted(wanted)} and their instances deleted")


@dataclass
class SharedStack:
    """The platform; each part starts the first time it is asked for."""

    base: Path
    postgres: Optional[Postgres] = None
    server: Optional[GPUStackServer] = None
    api: Optional[GPUStackAPI] = None
    worker: Optional[GPUStackWorker] = None
    worker_row: Optional[Dict] = None
    _replicas: List[Replica] = field(default_factory=list)

    def start_replicas(self) -> None:
        """Starts the replicas' processes (they load while the server starts)."""
        if not self._replicas:
            self._replicas = [start_replica(self.base / f"shared-replica-{i}.log", REPLICA_ARGS) for i in range(2)]

    def replicas(self) -> List[Replica]:
        self.start_replicas()
        for replica in self._replicas:
            replica.wait_ready(420)
        return self._replicas

    def up(self) -> Tuple[GPUStackServer, GPUStackAPI]:
        """Everything: the replicas' processes first (they load while the server starts and the
        worker joins), then the server and the worker. Returns the server and its admin API;
        `replicas()` then waits until the replicas are warm."""
        self.start_replicas()
        self.json_worker()
        return self.gpustack()

    def gpustack(self) -> Tuple[GPUStackServer, GPUStackAPI]:
        if self.server is None:
            self.postgres = start_postgres(self.base / "postgres")
            self.server = GPUStackServer(data_dir=self.base / "server", database_url=self.postgres.url).start()
            self.api = admin_api(self.server)
            wait_backend_registered(self.server, self.api.api_key, 90)
        return self.server, self.api

    def json_worker(self) -> Tuple[GPUStackWorker, Dict]:
        server, api = self.gpustack()
        if self.worker is None:
            self.worker, self.worker_row = join_listening_cpu_worker(server, api, WORKER_NAME, self.base / "worker",
                                                                     labels=WORKER_LABELS)
        return self.worker, self.worker_row

    @contextmanager
    def models_on(self, base: Path, models: ModelSpec) -> Iterator[Dict[str, Dict]]:
        """`stand_in_models` on the shared server and worker."""
        server, api = self.gpustack()
        _, row = self.json_worker()
        with stand_in_models(server, api, row, base, models) as created:
            yield created

    def stop(self) -> None:
        for replica in self._replicas:
            replica.stop()
        self._replicas = []
        if self.worker:
            self.worker.stop()
        if self.api:
            self.api.close()
        if self.server:
            self.server.stop()
        if self.postgres:
            self.postgres.stop()
        self.worker = self.api = self.server = self.postgres = None
