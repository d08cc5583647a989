"""Answers on the replica's port while vLLM loads the model, so the health check gets a
prompt 503 ("loading") instead of a connection that hangs until the model is in memory.

vLLM binds its socket before it builds the engine; this thread listens and accepts on that
same socket until vLLM's app has started, then steps aside (uvicorn takes over the socket).
"""

import json
import select
import socket
import threading
from typing import Callable

RESPONSE_TIMEOUT_S = 0.5


class LoadingResponder(threading.Thread):
    def __init__(self, sock: socket.socket, describe: Callable[[], dict], backlog: int = 128) -> None:
        super().__init__(name="dspark-loading", daemon=True)
        self.sock, self.describe, self.backlog = sock, describe, backlog
        self._halt = threading.Event()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=2.0)

    def run(self) -> None:
        self.sock.listen(self.backlog)
        while not self._halt.is_set():
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.1)
            except (OSError, ValueError):
                return
            if not ready or self._halt.is_set():
                continue
            try:
                self.sock.setblocking(False)
                conn, _ = self.sock.accept()
            except (BlockingIOError, OSError):
                continue
            finally:
                self.sock.setblocking(True)
            self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(RESPONSE_TIMEOUT_S)
            try:
                conn.recv(65536)  # the request head; the answer is the same for every path
            except socket.timeout:
                pass
            body = json.dumps({"ready": False, **self.describe()}).encode()
            conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
                         b"connection: close\r\nretry-after: 1\r\ncontent-length: " + str(len(body)).encode()
                         + b"\r\n\r\n" + body)
        except OSError:
            pass
        finally:
            conn.close()
