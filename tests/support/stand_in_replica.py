"""Test stand-ins for vLLM replicas: tiny OpenAI-compatible servers on 127.0.0.1.

Not vLLM: they answer `/v1/chat/completions` (plain and SSE) after a controllable delay,
count their own in-flight requests (peak and time-averaged), and can refuse, stall or
break a stream on demand. Routing tests and the routing benchmark point GPUStack model
instances at them, so requests really flow server -> worker -> replica.

`reply_content` sets what every reply says (non-streamed: the message content; streamed:
split over the chunks) — e.g. `BROKEN_JSON`, so a test can check that the proxy's format
check counts a JSON replica that answers invalid JSON.

Two ways to die: `stop()` as a killed process (every connection reset, the port closed), and
`freeze()` as a frozen process or a host gone from the network (the port still accepts, nothing
is answered, no connection is ever closed: requests in flight and new ones, `/health`
included, wait for good), until `stop()`.

Latency model: `base_s * slowdown`, stretched by `max(1, in_flight / capacity)` when a
capacity is set — a replica's time grows with its own load, as a batching engine's does.
A request's `metadata.work` (default 1) scales its time, its `usage.completion_tokens`
(`tokens_per_work` per unit, default `TOKENS_PER_WORK`) and its number of SSE chunks, as a
longer answer would; a stream asked with `stream_options.include_usage` ends with a usage
chunk, as vLLM's does.
"""

import asyncio
import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from gpustack_dspark.devstack.ports import free_port


TOKENS_PER_WORK = 16
BROKEN_JSON = '{"user_id": 7, "action": "buy", "amount": '  # cut off: not JSON


@dataclass
class ReplicaStats:
    in_flight: int = 0
    peak: int = 0
    served: int = 0
    json_requests: int = 0
    models: Dict[str, int] = field(default_factory=dict)
    _area: float = 0.0  # integral of in_flight over time
    _last: float = field(default_factory=time.monotonic)
    _since: float = field(default_factory=time.monotonic)

    def _tick(self) -> None:
        now = time.monotonic()
        self._area += self.in_flight * (now - self._last)
        self._last = now

    def enter(self) -> None:
        self._tick()
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        self._tick()
        self.in_flight -= 1

    def reset(self) -> None:
        self._tick()
        self.peak, self.served, self.json_requests, self.models = self.in_flight, 0, 0, {}
        self._area, self._since = 0.0, time.monotonic()

    def time_averaged(self) -> float:
        self._tick()
        elapsed = time.monotonic() - self._since
        return self._area / elapsed if elapsed > 0 else 0.0


class StandInReplica:
    """One stand-in replica in a background thread with its own event loop."""

    def __init__(self, name: str, base_s: float = 0.05, slowdown: float = 1.0, capacity: Optional[int] = None,
                 chunks: int = 5):
        self.name = name
        self.base_s = base_s
        self.slowdown = slowdown
        self.capacity = capacity
        self.chunks = chunks
        self.tokens_per_work = TOKENS_PER_WORK  # usage.completion_tokens per unit of work
        self.break_stream_after: Optional[int] = None  # break SSE streams after N chunks
        self.stall_s: float = 0.0  # extra delay before answering
        self.reply_content: Optional[str] = None  # what replies say (default: '{"ok": true}' / "0 1 2 ")
        self.api_key: Optional[str] = None  # when set, /v1/* without this Bearer key get 401
        self.frozen = False  # see freeze()
        # Cold after turning warm: the capacity grows from 1 to `capacity` over `cold_s`
        # seconds from `warm_at` (caches and pools filling), see `turned_warm()`.
        self.cold_s: float = 0.0
        self.warm_at: Optional[float] = None
        self.stats = ReplicaStats()
        self.port = free_port()
        self._server: Optional[uvicorn.Server] = None
        self._thread: Optional[threading.Thread] = None

    # ---- app ----
    @staticmethod
    def _work(body: dict) -> float:
        return float((body.get("metadata") or {}).get("work", 1.0)) if isinstance(body.get("metadata"), dict) else 1.0

    def _delay(self, body: dict) -> float:
        scale = self._work(body)
        capacity = self.capacity
        if capacity and self.cold_s and self.warm_at is not None and time.monotonic() - self.warm_at < self.cold_s:
            capacity = max(1.0, capacity * (time.monotonic() - self.warm_at) / self.cold_s)
        load = max(1.0, self.stats.in_flight / capacity) if capacity else 1.0
        return self.base_s * self.slowdown * scale * load + self.stall_s

    def turned_warm(self, cold_s: float) -> None:
        """From now on, for `cold_s` seconds, serve at a capacity growing from 1 to `capacity`."""
        self.cold_s, self.warm_at = cold_s, time.monotonic()

    def _denied(self, request: Request) -> Optional[JSONResponse]:
        if self.api_key and request.headers.get("authorization") != f"Bearer {self.api_key}":
            return JSONResponse({"error": {"message": "invalid API key", "code": 401}}, status_code=401)
        return None

    def freeze(self) -> None:
        """From now on answer nothing and close nothing, like a frozen process (SIGSTOP) or a host
        gone from the network: connections stay open, no byte more is sent, until `stop()`."""
        self.frozen = True

    async def _still(self) -> None:
        """A frozen replica: waits until `stop()` cancels it (nothing sent, nothing closed)."""
        if self.frozen:
            await asyncio.Event().wait()

    async def _chat(self, request: Request):
        await self._still()
        denied = self._denied(request)
        if denied is not None:
            return denied
        body = await request.json()
        self.stats.enter()
        counted = True
        model = str(body.get("model"))
        self.stats.models[model] = self.stats.models.get(model, 0) + 1
        rf = body.get("response_format") or {}
        if isinstance(rf, dict) and rf.get("type") in ("json_object", "json_schema"):
            self.stats.json_requests += 1
        try:
            if not body.get("stream"):
                await asyncio.sleep(self._delay(body))
                await self._still()
                self.stats.served += 1
                return JSONResponse(self._completion(model, self._work(body)))
            counted = False  # the stream generator owns the count from here
            return StreamingResponse(self._stream(model, body), media_type="text/event-stream")
        finally:
            if counted:
                self.stats.leave()

    async def _stream(self, model: str, body: dict):
        try:
            chunks = max(1, round(self.chunks * self._work(body)))
            per_chunk = self._delay(body) / chunks
            pieces = _split(self.reply_content, chunks) if self.reply_content is not None else None
            for index in range(chunks):
                if self.break_stream_after is not None and index >= self.break_stream_after:
                    raise ConnectionAbortedError(f"stand-in replica {self.name} broke the stream")
                await asyncio.sleep(per_chunk)
                await self._still()
                last = index == chunks - 1
                chunk = {"id": "x", "object": "chat.completion.chunk", "model": model,
                         "choices": [{"index": 0, "delta": {"content": pieces[index] if pieces else f"{index} "},
                                      "finish_reason": "stop" if last and pieces else None}]}
                yield f"data: {json.dumps(chunk)}\n\n"
            options = body.get("stream_options")
            if isinstance(options, dict) and options.get("include_usage"):  # as vLLM: a last chunk with usage
                tokens = max(1, round(self.tokens_per_work * self._work(body)))
                yield "data: " + json.dumps({"id": "x", "object": "chat.completion.chunk", "model": model, "choices": [],
                                             "usage": {"prompt_tokens": 1, "completion_tokens": tokens,
                                                       "total_tokens": 1 + tokens}}) + "\n\n"
            await self._still()
            self.stats.served += 1
            yield "data: [DONE]\n\n"
        finally:
            self.stats.leave()

    def _completion(self, model: str, work: float = 1.0) -> dict:
        tokens = max(1, round(self.tokens_per_work * work))
        return {"id": "x", "object": "chat.completion", "created": int(time.time()), "model": model,
                "replica": self.name,
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": self.reply_content or "{\"ok\": true}"}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": 1 + tokens}}

    def _app(self) -> Starlette:
        async def health(_request):
            await self._still()
            return JSONResponse({"ok": True})

        async def models(request):
            await self._still()
            denied = self._denied(request)
            if denied is not None:
                return denied
            return JSONResponse({"object": "list", "data": [{"id": self.name, "object": "model"}]})

        return Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                 Route("/health", health), Route("/v1/models", models)])

    # ---- lifecycle ----
    def _run(self) -> None:
        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._server.serve())
        finally:
            self._drop_the_rest()
            self._loop.close()

    def _drop_the_rest(self) -> None:
        """After the server stopped: reset every connection still open and end every request
        task, as a killed process's kernel would. Without this, a connection accepted while the
        server was stopping stays open with nobody answering, until the garbage collector frees
        it — found by the soak: a request on such a connection waited for the client's timeout."""
        for connection in list(self._server.server_state.connections):
            transport = getattr(connection, "transport", None)
            if transport is not None:
                transport.abort()
        pending = [t for t in asyncio.all_tasks(self._loop) if not t.done()]
        for task in pending:
            task.cancel()
        # Runs the loop until the tasks are cancelled and the aborted sockets closed.
        self._loop.run_until_complete(asyncio.gather(*pending, asyncio.sleep(0), return_exceptions=True))

    def start(self) -> "StandInReplica":
        if _QUIET not in logging.getLogger("uvicorn.error").filters:
            logging.getLogger("uvicorn.error").addFilter(_QUIET)
        config = uvicorn.Config(self._app(), host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", timeout_keep_alive=30)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._run, name=f"replica-{self.name}", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline:
                raise TimeoutError(f"stand-in replica {self.name} did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Like a killed process: open connections are dropped without an answer (requests
        in flight get a reset, not a reply), the port closes, new connections are refused;
        so is a frozen replica's."""
        if self._server is not None:
            server = self._server
            loop = getattr(self, "_loop", None)
            if loop is not None and loop.is_running():
                def drop_all():
                    for connection in list(server.server_state.connections):
                        transport = getattr(connection, "transport", None)
                        if transport is not None:
                            transport.abort()
                try:
                    loop.call_soon_threadsafe(drop_all)
                    time.sleep(0.05)
                except RuntimeError:  # the loop just ended
                    pass
            server.should_exit = True
            server.force_exit = True
            self._thread.join(timeout=10)
            self._server = None


class _QuietCancellations(logging.Filter):
    """uvicorn logs a request task cancelled at `stop()` as "Exception in ASGI application" with
    a traceback: a stopped stand-in's requests end that way by design, so that is not logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not isinstance(exc, asyncio.CancelledError)


_QUIET = _QuietCancellations()


def _split(text: str, parts: int) -> List[str]:
    size = max(1, -(-len(text) // max(1, parts)))
    return [text[i * size:(i + 1) * size] for i in range(max(1, parts))]


def start_replicas(names: List[str], **kwargs) -> List[StandInReplica]:
    return [StandInReplica(name, **kwargs).start() for name in names]
