"""The watch thread (real `kubernetes` client) against the Kubernetes API stand-in, without
GPUStack: list, watch events, both forms of 410, an outage, a rejected token. In-process,
loopback, a few seconds."""

import pytest

from gpustack_dspark.k8s.node_labels import NodeView
from gpustack_dspark.k8s.node_watch import NodeWatcher, load_api_client
from gpustack_dspark.labels import parse_selector
from tests.conftest import wait_for as _wait_for
from tests.support.stand_in_kube_api import StandInKubeAPI

SELECTOR = "pool=json"


@pytest.fixture
def kube():
    api = StandInKubeAPI().start()
    yield api
    api.stop()


def wait_for(predicate, timeout_s, what):
    return _wait_for(predicate, timeout_s, what, interval_s=0.05)


def _watcher(kube, tmp_path, token=None):
    config = kube.write_kubeconfig(tmp_path / "kubeconfig", **({"token": token} if token else {}))
    changes = []
    watcher = NodeWatcher(load_api_client(str(config)), NodeView(parse_selector(SELECTOR)), SELECTOR,
                          lambda: changes.append(1))
    watcher.start()
    return watcher, changes


def _matching(watcher, names):
    return watcher.matching() == frozenset(names)


def test_list_then_watch_events_follow_the_selector(kube, tmp_path):
    kube.set_node("a", {"pool": "json"})
    kube.set_node("b", {"pool": "general"})
    watcher, changes = _watcher(kube, tmp_path)
    try:
        wait_for(lambda: _matching(watcher, {"a"}), 20, "the first list")
        kube.set_node("b", {"pool": "json"})  # starts matching: ADDED
        wait_for(lambda: _matching(watcher, {"a", "b"}), 20, "b to match")
        kube.set_node("a", {})  # stops matching: DELETED
        wait_for(lambda: _matching(watcher, {"b"}), 20, "a to stop matching")
        kube.delete_node("b")
        wait_for(lambda: _matching(watcher, set()), 20, "b deleted")
        status = watcher.status()
        assert status["lists"] == 1 and status["events"] == 3 and status["gone"] == 0 and changes
        first_list = next(r for r in kube.requests if not r["watch"])
        assert first_list["query"] == {"labelSelector": SELECTOR}
        watch = next(r for r in kube.requests if r["watch"])
        assert watch["query"]["labelSelector"] == SELECTOR and watch["query"]["timeoutSeconds"] == "240"
        assert watch["query"]["resourceVersion"] == "102"  # the list's (two nodes written after rv 100)
    finally:
        watcher.stop()


@pytest.mark.parametrize("as_http", [False, True])
def test_a_410_relists_and_sees_what_the_watch_missed(kube, tmp_path, as_http):
    kube.set_node("a", {"pool": "json"})
    watcher, _ = _watcher(kube, tmp_path)
    try:
        wait_for(lambda: _matching(watcher, {"a"}) and kube.watchers() == 1, 20, "the watch to open")
        kube.expire(gone_as_http=as_http)  # history compacted, open watch closed
        kube.set_node("c", {"pool": "json"})  # only a relist can see this
        wait_for(lambda: _matching(watcher, {"a", "c"}), 20, "the relist")
        assert [r for r in kube.requests if r.get("gone") == ("http" if as_http else "event")]
        status = watcher.status()
        assert status["gone"] == 1 and status["lists"] == 2 and status["errors"] == 0
    finally:
        watcher.stop()


def test_an_outage_keeps_the_view_reports_and_recovers(kube, tmp_path):
    kube.set_node("a", {"pool": "json"})
    watcher, _ = _watcher(kube, tmp_path)
    try:
        wait_for(lambda: _matching(watcher, {"a"}) and kube.watchers() == 1, 20, "the watch to open")
        kube.stop()
        status = wait_for(lambda: (s := watcher.status())["last_error"] and s, 20, "the error")
        assert status["last_error"].startswith("cannot reach the Kubernetes API: NewConnectionError")
        assert "Connection refused" in status["last_error"] and status["retry_in_s"] is not None
        assert _matching(watcher, {"a"})  # the last view stands
        kube.set_node("a", {})
        kube.start()
        wait_for(lambda: _matching(watcher, set()) and watcher.status()["last_error"] is None, 60, "recovery")
    finally:
        watcher.stop()


def test_a_rejected_token_is_reported_and_retried(kube, tmp_path):
    watcher, _ = _watcher(kube, tmp_path, token="wrong")
    try:
        status = wait_for(lambda: (s := watcher.status())["errors"] >= 2 and s, 20, "two failed lists")
        assert status["last_error"] == "Kubernetes API answered 401 Unauthorized"
        assert watcher.matching() is None  # never listed: the sync touches nothing
    finally:
        watcher.stop()


def test_the_thread_stops(kube, tmp_path):
    watcher, _ = _watcher(kube, tmp_path)
    wait_for(lambda: watcher.status()["lists"] == 1, 20, "the first list")
    watcher.stop()
    kube.expire()  # ends the open watch; the loop sees the stop
    watcher._thread.join(10)
    assert not watcher._thread.is_alive()
