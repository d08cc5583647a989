"""A STAND-IN for the Kubernetes API server (tests only): no kube-apiserver can be installed
on the CI machines (not in Debian, PyPI or npm), so this speaks Kubernetes' wire format for
the one resource the node-label sync uses, on 127.0.0.1:

- `GET /api/v1/nodes?labelSelector=...` (LIST): a `NodeList` with `metadata.resourceVersion`.
- `GET /api/v1/nodes?watch=true&resourceVersion=N&timeoutSeconds=S&labelSelector=...` (WATCH):
  HTTP/1.1 chunked body, one JSON event per line (`{"type": "ADDED"|"MODIFIED"|"DELETED",
  "object": {...}}`), the events after N, then new ones until S seconds pass. As in the API
  server's watch cache, a node that stops matching the selector comes as DELETED and one
  that starts matching as ADDED. No resourceVersion (or "0"): the current matching nodes as
  ADDED first.
- 410 Gone: a watch from a resourceVersion older than the retained history gets HTTP 200 and
  one `ERROR` event whose object is a `Status` with `code: 410, reason: Expired` (what
  kube-apiserver sends); with `gone_as_http=True` it answers HTTP 410 with the Status instead.
- Bearer-token authentication (401 Status otherwise); anything else is a 404 Status.

Control from the test: `set_node`, `delete_node`, `expire` (compact the history and close open
watches, so the next watch is 410), `stop` / `start` (an outage: the port stops listening),
and `requests` (what the client asked, for checks that a path was really taken).
"""

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Dict, List, Optional, Tuple
from urllib.parse import parse_qs, urlparse

from gpustack_dspark.labels import parse_selector, selector_matches

TOKEN = "stand-in-token"


def _status(code: int, reason: str, message: str) -> Dict:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class StandInKubeAPI:
    def __init__(self, port: int = 0) -> None:
        self.port = port
        self.cond = threading.Condition()
        self.rv = 100
        self.nodes: Dict[str, Dict] = {}
        self.history: List[Tuple[int, Optional[Dict], Optional[Dict]]] = []  # (rv, old, new)
        self.oldest_rv = self.rv  # watches from before this are 410
        self.generation = 0  # bumped to end every open watch
        self.gone_as_http = False
        self.requests: List[Dict] = []
        self.sent_gone = 0
        self._server: Optional[ThreadingHTTPServer] = None

    # -- lifecycle ------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "StandInKubeAPI":
        api = self

        class Handler(_Handler):
            stand_in = api

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, name="stand-in-kube-api", daemon=True).start()
        return self

    def stop(self) -> None:
        """An outage: open watches end, the port stops listening (connections are refused)."""
        with self.cond:
            self.generation += 1
            self.cond.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def write_kubeconfig(self, path: Path, token: str = TOKEN) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "stand-in", "user": {"token": token}}],
            "contexts": [{"name": "stand-in", "context": {"cluster": "stand-in", "user": "stand-in"}}],
        }))
        return path

    # -- the store ------------------------------------------------------------------------
    def set_node(self, name: str, labels: Dict[str, str]) -> None:
        with self.cond:
            self.rv += 1
            old = self.nodes.get(name)
            new = {
                "kind": "Node", "apiVersion": "v1",
                "metadata": {
                    "name": name, "uid": old["metadata"]["uid"] if old else str(uuid.uuid4()),
                    "resourceVersion": str(self.rv), "labels": dict(labels),
                    "creationTimestamp": old["metadata"]["creationTimestamp"] if old
                    else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
                "spec": {}, "status": {},
            }
            self.nodes[name] = new
            self.history.append((self.rv, old, new))
            self.cond.notify_all()

    def delete_node(self, name: str) -> None:
        with self.cond:
            old = self.nodes.pop(name)
            self.rv += 1
            self.history.append((self.rv, old, None))
            self.cond.notify_all()

    def expire(self, gone_as_http: bool = False) -> None:
        """Compact: the history so far is gone (like etcd compaction) and open watches end.
        A watch resumed from an older resourceVersion now gets 410."""
        with self.cond:
            self.rv += 1
            self.history.clear()
            self.oldest_rv = self.rv
            self.gone_as_http = gone_as_http
            self.generation += 1
            self.cond.notify_all()

    def watchers(self) -> int:
        return sum(1 for r in self.requests if r.get("open"))

    # -- what LIST and WATCH see -----------------------------------------------------------
    def list_nodes(self, requirements) -> Tuple[List[Dict], str]:
        with self.cond:
            items = [n for n in self.nodes.values() if selector_matches(requirements, n["metadata"]["labels"])]
            return json.loads(json.dumps(sorted(items, key=lambda n: n["metadata"]["name"]))), str(self.rv)

    def events_after(self, since: int, requirements) -> List[Dict]:
        out = []
        for rv, old, new in self.history:
            if rv <= since:
                continue
            was = old is not None and selector_matches(requirements, old["metadata"]["labels"])
            now = new is not None and selector_matches(requirements, new["metadata"]["labels"])
            if now:
                out.append({"type": "MODIFIED" if was else "ADDED", "object": new})
            elif was:
                obj = json.loads(json.dumps(new or old))
                obj["metadata"]["resourceVersion"] = str(rv)
                out.append({"type": "DELETED", "object": obj})
        return out


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    stand_in: StandInKubeAPI

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send_json(self, code: int, body: Dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _chunk(self, body: Dict) -> None:
        data = (json.dumps(body) + "\n").encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def do_GET(self) -> None:
        api = self.stand_in
        url = urlparse(self.path)
        query = {k: v[-1] for k, v in parse_qs(url.query, keep_blank_values=True).items()}
        record = {"path": url.path, "query": query, "watch": query.get("watch") in ("1", "t", "T", "true", "True", "TRUE")}  # Go ParseBool
        api.requests.append(record)
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._send_json(401, _status(401, "Unauthorized", "Unauthorized"))
        if url.path != "/api/v1/nodes":
            return self._send_json(404, _status(404, "NotFound", f"the server could not find {url.path}"))
        try:
            requirements = parse_selector(query["labelSelector"]) if query.get("labelSelector") else ()
        except ValueError as e:
            return self._send_json(400, _status(400, "BadRequest", f"unable to parse requirement: {e}"))
        if not record["watch"]:
            items, rv = api.list_nodes(requirements)
            return self._send_json(200, {"kind": "NodeList", "apiVersion": "v1",
                                         "metadata": {"resourceVersion": rv}, "items": items})
        self._watch(api, query, requirements, record)

    def _watch(self, api: StandInKubeAPI, query: Dict[str, str], requirements, record: Dict) -> None:
        since_text = query.get("resourceVersion", "")
        timeout_s = float(query.get("timeoutSeconds") or 1800)
        with api.cond:
            generation = api.generation
            since = int(since_text) if since_text not in ("", "0") else None
            expired = since is not None and since < api.oldest_rv
            if expired:
                api.sent_gone += 1
                gone = _status(410, "Expired", f"too old resource version: {since} ({api.oldest_rv})")
            if expired and api.gone_as_http:
                record["gone"] = "http"
                return self._send_json(410, gone)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        # This stand-in closes the connection when a watch ends (below), so it says so: without
        # the header a client's pool may send its next request on the closing connection and
        # get a reset, an error a real API server (which keeps the connection) never causes —
        # seen as a relist that took a watch-expiry test's change past its 410.
        self.send_header("Connection", "close")
        self.end_headers()
        record["open"] = True
        try:
            if expired:
                record["gone"] = "event"
                self._chunk({"type": "ERROR", "object": gone})
            elif since is None:
                items, rv = api.list_nodes(requirements)
                for item in items:
                    self._chunk({"type": "ADDED", "object": item})
                since = int(rv)
            deadline = time.monotonic() + timeout_s
            while not expired:
                with api.cond:
                    if api.generation != generation:  # expired or stopped: end before any later event
                        break
                    events = api.events_after(since, requirements)
                    if not events:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        api.cond.wait(min(remaining, 1.0))
                        continue
                    since = api.rv
                for event in events:
                    self._chunk(event)
        except (BrokenPipeError, ConnectionResetError):
            return
        finally:
            record["open"] = False
        try:
            self.wfile.write(b"0\r\n\r\n")  # end of the chunked body: the watch ended normally
            self.wfile.flush()
        except OSError:
            pass
        self.close_connection = True
