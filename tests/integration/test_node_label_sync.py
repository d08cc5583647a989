"""The node-label sync in a real GPUStack 2.3.0 server (real PostgreSQL, real CPU workers),
reading nodes with the real `kubernetes` client from a Kubernetes API STAND-IN
(`tests/support/stand_in_kube_api.py`: no kube-apiserver can run on these machines).

One server for the module. (A bad kubeconfig turning off only this feature is checked on the
config-file server of test_fault_safety.py, which starts anyway.) Negative checks ("still labelled", "untouched") wait for two
more sync passes after the change first, so they are judged after the sync had its chance.
"""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.worker import join_cpu_worker
from gpustack_dspark.k8s.node_labels import MARKER_KEY, MARKER_VALUE
from gpustack_dspark.k8s.gpustack_writes import ADVISORY_LOCK_KEY
from tests.conftest import admin_api, dspark_status, wait_for
from tests.support.stand_in_kube_api import StandInKubeAPI

pytestmark = pytest.mark.integration

SELECTOR = "gpustack-dspark.io/json-inference=true"
POOL = {"gpustack-dspark.io/json-inference": "true", "kubernetes.io/os": "linux"}
PLAIN = {"kubernetes.io/os": "linux"}
JSON_KEY, JSON_VALUE = "role", "json-inference"
NODE, LAPTOP, NO_WORKER = "k8s-node-a", "laptop", "k8s-node-without-worker"


@pytest.fixture(scope="module")
def kube():
    api = StandInKubeAPI().start()
    api.set_node(NODE, POOL)
    api.set_node("k8s-node-b", PLAIN)
    api.set_node(NO_WORKER, POOL)
    yield api
    api.stop()


@pytest.fixture(scope="module")
def stack(kube, start_server, tmp_path_factory):
    kubeconfig = kube.write_kubeconfig(tmp_path_factory.mktemp("kube") / "kubeconfig")
    server = start_server(extra_args=["--dspark-node-label-sync-selector", SELECTOR,
                                      "--dspark-node-label-sync-kubeconfig", str(kubeconfig)])
    api = admin_api(server)
    base = tmp_path_factory.mktemp("workers")
    workers = {}

    def join(name, labels=None):
        own = GPUStackAPI(server.url, api.api_key)
        try:
            return join_cpu_worker(own, server.url, name, base / name, labels=labels)
        finally:
            own.close()

    api.ensure_cluster("dspark-local")  # before the parallel joins, so they share one cluster
    try:
        with ThreadPoolExecutor(2) as pool:
            # `laptop` runs on no Kubernetes node; its JSON label is set by hand.
            futures = {NODE: pool.submit(join, NODE), LAPTOP: pool.submit(join, LAPTOP, {JSON_KEY: JSON_VALUE})}
            for name, future in futures.items():
                workers[name] = future.result()
        yield server, api, workers
    finally:
        for worker in workers.values():
            worker.stop()
        api.close()


def _labels(api, worker):
    return api.get(f"/v2/workers/{worker.id}")["labels"]


def _sync(server, api):
    return dspark_status(server, api.api_key)["node_label_sync"]


def _passes_later(server, api, more=2):
    """Wait until the sync has made `more` further passes (a barrier for negative checks)."""
    start = _sync(server, api)["passes"]
    wait_for(lambda: _sync(server, api)["passes"] >= start + more, 60, f"{more} more sync passes")


def _pool_member(api, worker):
    labels = _labels(api, worker)
    return labels.get(JSON_KEY) == JSON_VALUE and labels.get(MARKER_KEY) == MARKER_VALUE


def _not_member(api, worker):
    labels = _labels(api, worker)
    return JSON_KEY not in labels and MARKER_KEY not in labels


def _watching(server, api, kube) -> bool:
    """The sync is watching now: its newest request is a watch still open and it reports no
    error. (An older watch record can still read as open while the sync backs off after an
    error and will relist: an expiry then would reach it through that list, not a 410.)"""
    latest = [r for r in kube.requests if r["path"] == "/api/v1/nodes"]
    watch = _sync(server, api)["watch"]
    return bool(latest) and latest[-1]["watch"] and bool(latest[-1].get("open")) \
        and watch["last_error"] is None and not watch.get("retry_in_s")


def _laptop_untouched(api, workers):
    laptop = _labels(api, workers[LAPTOP])  # no node of that name: hand-set label, no marker
    assert laptop[JSON_KEY] == JSON_VALUE and MARKER_KEY not in laptop
    assert laptop["worker-name"] == LAPTOP  # GPUStack's own labels stay


def test_workers_of_matching_nodes_get_the_json_label(stack, kube):
    server, api, workers = stack
    wait_for(lambda: _pool_member(api, workers[NODE]), 60, f"{NODE} to get {JSON_KEY}={JSON_VALUE}")
    _passes_later(server, api)
    _laptop_untouched(api, workers)

    status = dspark_status(server, api.api_key)
    feature = status["features"]["node_label_sync"]
    assert feature["state"] == "enabled" and "reason" not in feature, feature
    assert feature["detail"]["selector"] == SELECTOR and feature["detail"]["json_label"] == "role=json-inference"
    sync = status["node_label_sync"]
    assert sync["writer"] == "this server (postgresql advisory lock)"
    assert sync["watch"]["matching_nodes"] == [NODE, NO_WORKER]
    assert sync["last_pass"]["labelled_workers"] == [NODE]
    assert sync["last_pass"]["nodes_without_worker"] == [NO_WORKER]
    listed = [r for r in kube.requests if not r["watch"]]
    assert listed and listed[0]["query"]["labelSelector"] == SELECTOR
    watches = [r for r in kube.requests if r["watch"]]
    assert watches and watches[0]["query"]["resourceVersion"] and watches[0]["query"]["timeoutSeconds"]


def test_labels_follow_the_node_label_both_ways(stack, kube):
    server, api, workers = stack
    wait_for(lambda: _pool_member(api, workers[NODE]), 60, f"{NODE} in the pool")
    kube.set_node(NODE, PLAIN)  # the watch sends DELETED: the node no longer matches
    wait_for(lambda: _not_member(api, workers[NODE]), 30, f"{NODE} to leave the pool")
    kube.set_node(NODE, POOL)
    wait_for(lambda: _pool_member(api, workers[NODE]), 30, f"{NODE} to join the pool again")
    _passes_later(server, api)
    _laptop_untouched(api, workers)
    actions = [(c["worker"], c["action"]) for c in _sync(server, api)["recent_changes"]]
    assert actions[-3:] == [(NODE, "added"), (NODE, "removed"), (NODE, "added")]


def test_a_watch_expiry_relists(stack, kube):
    server, api, workers = stack
    wait_for(lambda: _pool_member(api, workers[NODE]), 60, f"{NODE} in the pool")
    lists_before = _sync(server, api)["watch"]["lists"]
    # The history is compacted and the open watch ends: the change below reaches the sync only
    # through a relist after the resumed watch's 410 (an ERROR event in the stream).
    # Expire while a watch is open (not between a relist and the next watch, where the next
    # watch would start from the fresh resourceVersion and never see a 410).
    # The watch open when checked may end on its own before the expiry (its timeout, sooner
    # under load), and the change then reaches the sync by the next list: the experiment is
    # repeated (the node's label flipped back), up to three times, until a 410 carried it.
    stories = []
    for attempt, (label, member) in enumerate([(PLAIN, _not_member), (POOL, _pool_member), (PLAIN, _not_member)]):
        wait_for(lambda: _watching(server, api, kube), 30, "the sync's latest watch open")
        seen = len(kube.requests)
        gone_before = sum(1 for r in kube.requests if r.get("gone") == "event")
        kube.expire()
        kube.set_node(NODE, label)
        wait_for(lambda: member(api, workers[NODE]), 30, f"{NODE} pool membership after the 410 ({attempt})")
        if sum(1 for r in kube.requests if r.get("gone") == "event") > gone_before:
            break
        stories.append(kube.requests[seen - 2:])
    else:  # the whole story, untruncated
        pytest.fail(f"the change reached the sync without a 410 three times; requests from just before each "
                    f"expiry: {stories}; the sync: {_sync(server, api)}")
    if label == POOL:  # left in the pool: out again, for the HTTP 410 below to bring it back
        kube.set_node(NODE, PLAIN)
        wait_for(lambda: _not_member(api, workers[NODE]), 30, f"{NODE} out of the pool")
    # The same with the 410 as the HTTP status of the watch request; then the node is deleted.
    wait_for(lambda: _watching(server, api, kube), 30, "the sync's latest watch open")
    kube.expire(gone_as_http=True)
    kube.set_node(NODE, POOL)
    wait_for(lambda: _pool_member(api, workers[NODE]), 30, f"{NODE} back in the pool after the HTTP 410")
    assert [r for r in kube.requests if r.get("gone") == "http"]
    watch = _sync(server, api)["watch"]
    assert watch["gone"] >= 2 and watch["lists"] >= lists_before + 2 and watch["last_error"] is None
    kube.delete_node(NODE)
    wait_for(lambda: _not_member(api, workers[NODE]), 30, f"{NODE} out of the pool after its node went")


def test_an_api_outage_keeps_labels_reports_and_recovers(stack, kube):
    server, api, workers = stack
    kube.set_node(NODE, POOL)
    wait_for(lambda: _pool_member(api, workers[NODE]), 60, f"{NODE} in the pool")
    kube.stop()
    feature = wait_for(lambda: (f := dspark_status(server, api.api_key)["features"]["node_label_sync"])
                       .get("reason") and f, 60, "the outage in the status")
    assert feature["state"] == "enabled"
    assert feature["reason"].startswith("cannot reach the Kubernetes API: ") and "retrying" in feature["reason"]
    kube.set_node(NODE, PLAIN)  # changed while the sync cannot see it
    _passes_later(server, api)
    assert _pool_member(api, workers[NODE])  # an outage removes nothing
    assert httpx.get(f"{server.url}/healthz", timeout=10).status_code == 200
    kube.start()
    wait_for(lambda: _not_member(api, workers[NODE]), 60, f"{NODE} out of the pool after the outage")
    wait_for(lambda: "reason" not in dspark_status(server, api.api_key)["features"]["node_label_sync"], 30,
             "the reason to clear")
    assert _sync(server, api)["watch"]["errors"] >= 1


def test_one_writer_holds_the_lock_and_another_stands_by(stack, postgres):
    """The server holds the advisory lock; a second guard (this process, same database, the
    plugin's own WriterGuard on GPUStack's db module) does not get it."""
    from sqlalchemy.ext.asyncio import create_async_engine

    from gpustack.server import db
    from gpustack_dspark.k8s.gpustack_writes import WriterGuard

    async def second_writer():
        engine = create_async_engine(postgres.url.replace("postgresql://", "postgresql+asyncpg://"))
        saved, db.engine = db.engine, engine
        try:
            guard = WriterGuard()
            held = await guard.acquire()
            await guard.release()
            async with engine.connect() as connection:
                from sqlalchemy import text

                holders = (await connection.execute(
                    text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted "
                         "AND ((classid::bigint << 32) | objid::bigint) = :key"), {"key": ADVISORY_LOCK_KEY})).scalar()
            return held, guard.kind, holders
        finally:
            db.engine = saved
            await engine.dispose()

    held, kind, holders = asyncio.run(second_writer())
    assert (held, kind, holders) == (False, "postgresql advisory lock", 1)
