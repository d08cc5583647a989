"""Glue: the Kubernetes side of the node-label sync (the `kubernetes` client, in a thread).

LIST the nodes matching the selector, then WATCH from the list's resourceVersion; a watch
that ends (its `timeoutSeconds`, a closed connection) is restarted from the last
resourceVersion seen. 410 Gone — an ERROR event with code 410 in the stream, or an HTTP 410
— means the resourceVersion is too old: relist. Any other error: back off (1 s, doubling
to 30 s) and relist; the reason stays in `status()` until a list succeeds. During an error
the last known view is kept, so an API outage removes no labels.

The `kubernetes` client is synchronous (urllib3), so this runs in a daemon thread and
tells the server's event loop through `on_change` (called from the thread).
"""

import logging
import threading
import time
from typing import Callable, Dict, Optional

from gpustack_dspark.k8s.node_labels import NodeView

logger = logging.getLogger(__name__)

WATCH_TIMEOUT_S = 240  # the server ends each watch after this; the client then re-watches
READ_TIMEOUT_S = WATCH_TIMEOUT_S + 30  # client side: a silent connection is given up
CONNECT_TIMEOUT_S = 5
BACKOFF_FIRST_S = 1.0
BACKOFF_MAX_S = 30.0


def load_api_client(kubeconfig: Optional[str]):
    """The client's configuration: the kubeconfig file when given, else the in-cluster
    service account. Raises (ConfigException, OSError, ...) with the reason when neither
    works; the caller turns that into a disabled feature."""
    from kubernetes import client, config

    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration, persist_config=False)
    else:
        # Sets the hook that re-reads the projected (rotating) service-account token.
        config.load_incluster_config(client_configuration=configuration)
    # One attempt per call (urllib3 would retry 3 times at once): the loop below retries,
    # with back-off. Read when the ApiClient builds its connection pool, so set it first.
    configuration.retries = 0
    return client.ApiClient(configuration)


def describe_error(e: BaseException) -> str:
    from kubernetes.client.rest import ApiException

    if isinstance(e, ApiException):
        return f"Kubernetes API answered {e.status} {e.reason}".strip()
    reason = getattr(e, "reason", None)  # urllib3's MaxRetryError: the connection error inside
    if type(e).__name__ == "MaxRetryError" and reason is not None:
        return f"cannot reach the Kubernetes API: {type(reason).__name__}: {reason}"
    return f"{type(e).__name__}: {e}"


class NodeWatcher:
    def __init__(self, api_client, view: NodeView, selector: str, on_change: Callable[[], None]) -> None:
        self.api_client = api_client
        self.view = view
        self.selector = selector
        self.on_change = on_change
        self.lock = threading.Lock()
        self.counters: Dict[str, int] = {"lists": 0, "watches": 0, "events": 0, "gone": 0, "errors": 0}
        self.last_error: Optional[str] = None
        self.retry_at: Optional[float] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="dspark-node-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def matching(self):
        with self.lock:
            return self.view.matching() if self.view.synced else None

    def status(self) -> Dict[str, object]:
        with self.lock:
            retry_in = None if self.retry_at is None else max(0.0, round(self.retry_at - time.monotonic(), 1))
            return {
                "synced": self.view.synced,
                "resource_version": self.view.resource_version,
                "matching_nodes": sorted(self.view.matching()),
                "last_error": self.last_error,
                "retry_in_s": retry_in,
                **self.counters,
            }

    def _count(self, name: str) -> None:
        with self.lock:
            self.counters[name] += 1

    def _run(self) -> None:
        from kubernetes.client.rest import ApiException

        delay = BACKOFF_FIRST_S
        while not self._stop.is_set():
            try:
                self._list()
                delay = BACKOFF_FIRST_S
                while not self._stop.is_set():
                    started, events = time.monotonic(), self.counters["events"]
                    self._watch_once()
                    if time.monotonic() - started < 1.0 and self.counters["events"] == events:
                        self._stop.wait(1.0)  # a watch that ends at once, again and again: no busy loop
            except ApiException as e:
                if e.status == 410:
                    self._count("gone")
                    logger.info("node watch: resourceVersion expired (410 Gone); relisting")
                    continue
                self._failed(e, delay)
            except Exception as e:  # network errors, decoding errors: all retried
                self._failed(e, delay)
            else:
                continue
            self._stop.wait(delay)
            delay = min(delay * 2, BACKOFF_MAX_S)

    def _failed(self, e: BaseException, delay: float) -> None:
        reason = describe_error(e)
        logger.warning("node watch: %s; retrying in %.0f s", reason, delay)
        with self.lock:
            self.counters["errors"] += 1
            self.last_error = reason
            self.retry_at = time.monotonic() + delay

    def _core(self):
        from kubernetes import client

        return client.CoreV1Api(self.api_client)

    def _list(self) -> None:
        listed = self._core().list_node(label_selector=self.selector,
                                        _request_timeout=(CONNECT_TIMEOUT_S, 60))
        nodes = {n.metadata.name: dict(n.metadata.labels or {}) for n in listed.items}
        with self.lock:
            self.view.replace(nodes, listed.metadata.resource_version)
            self.counters["lists"] += 1
            self.last_error = None
            self.retry_at = None
        logger.info("node watch: %d node(s) match %s (resourceVersion %s)", len(nodes), self.selector,
                    listed.metadata.resource_version)
        self.on_change()  # after every list: workers may have joined meanwhile

    def _watch_once(self) -> None:
        from kubernetes import watch

        with self.lock:
            since = self.view.resource_version
            self.counters["watches"] += 1
        watcher = watch.Watch()
        # timeout_seconds also turns off the client's own one-time 410 retry: a 410 reaches
        # us as ApiException(status=410), from the stream's ERROR event or the HTTP status.
        for event in watcher.stream(self._core().list_node, label_selector=self.selector,
                                    resource_version=since, timeout_seconds=WATCH_TIMEOUT_S,
                                    allow_watch_bookmarks=False,
                                    _request_timeout=(CONNECT_TIMEOUT_S, READ_TIMEOUT_S)):
            if self._stop.is_set():
                watcher.stop()
                return
            kind = event["type"]
            raw = event["raw_object"] or {}
            metadata = raw.get("metadata") or {}
            with self.lock:
                self.counters["events"] += 1
                changed = self.view.event(kind, metadata.get("name", ""), metadata.get("labels") or {},
                                          metadata.get("resourceVersion"))
            if changed:
                self.on_change()
