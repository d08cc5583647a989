"""A replica that goes silent (pure: asyncio only, no GPUStack).

Found by the 1,000-request soak: a replica can stop answering without closing its connections
(a frozen process, a host gone from the network, or a connection it accepted while dying).
No reset and no end-of-file ever reaches the proxy. GPUStack 2.3 then waits up to 1800 s for a
non-streamed answer (its worker bounds only a stream: 300 s to the first chunk, 60 s between
chunks). So the request waits for the client's own timeout, and the client gets nothing.

The routing policy's `proxy.silence_timeout_s` bounds that wait for every try:
- a try whose replica has sent nothing for `silence_timeout_s` seconds (no first byte yet, or
  nothing since its last stream event) is checked. A replica that sent anything to any
  request within the last `silence_timeout_s` is alive. Otherwise the check is the replica's
  `GET /health` through its worker, bounded by `PROBE_TIMEOUT_S`;
- a replica that answers keeps the request. A non-streamed answer only arrives once its whole
  generation is done, so a long generation is never cut. The try is checked again after as
  long again;
- a replica that does not answer is given up: the try is cancelled, which closes its
  connection (the worker then drops the replica's). The glue retries the request once on
  another replica, or answers a 504 that says why. A stream that had already started ends
  with an error event.
One check per instance at a time; its answer is shared with every try that asks within
`FRESH_S` (`Liveness`). A try on a dead replica is therefore given up at most
2 x `silence_timeout_s` + the check after its replica's last byte to anyone. It is 2 x, not
1 x, because the replica may have answered another request just before it died.

Why the activity comes first: in the 1,000-request soak on a loaded 2-core machine, a health
check alone (3 s bound) timed out on working replicas, and half the requests got a 504.
"""

import asyncio
import json
import time
from typing import Any, Awaitable, Callable, Dict, Optional, Tuple

from gpustack_dspark.routing import upstream_status

PROBE_TIMEOUT_S = 5.0  # the health check's bound (or the silence timeout, if shorter)
FRESH_S = 1.0  # a check's answer is shared with the tries that ask within this long
HEALTH_PATH = "health"  # vLLM's (and dspark-serve's) liveness endpoint, through the worker

Verdict = Tuple[bool, str]  # (alive, why not)


def probe_timeout(silence_s: float) -> float:
    return min(PROBE_TIMEOUT_S, silence_s)


class ReplicaSilent(Exception):
    """The try's replica sent nothing for `waited_s` seconds and failed its health check;
    `silent_s` of them since the try's last sign of life (its wait's start, or a health check
    that found the replica alive): how long the give-up took once the replica stopped answering.
    A slow replica checked alive and kept for minutes before it died has a long `waited_s` and
    a short `silent_s`."""

    def __init__(self, waited_s: float, silent_s: float, reason: str):
        super().__init__(f"sent nothing for {waited_s:.0f} s and failed its health check ({reason})")
        self.waited_s = waited_s
        self.silent_s = silent_s
        self.reason = reason


def health_verdict(status: int, body: Optional[bytes]) -> Verdict:
    """The health check's answer through the worker: alive if the replica itself answered
    (any status below 500: a replica without /health still answers 404); dead if its worker
    answered for it (replica unreachable, gone, timed out) or it answered 5xx."""
    kind = upstream_status.classify(status, body)
    if kind == upstream_status.OK or (kind == upstream_status.REPLICA and status < 500):
        return True, ""
    text = (body or b"").decode("utf-8", "replace").strip().replace("\n", " ")
    return False, f"HTTP {status}: {text[:200]}" if text else f"HTTP {status}"


def given_up_message(instance_id: Any, silent: ReplicaSilent, retried_on: Optional[Any] = None) -> str:
    """One line for the client and the log."""
    head = f"the replica of model instance {instance_id} {silent}"
    if retried_on is not None:
        return f"{head}; the request was retried on instance {retried_on}"
    return head


def error_body(message: str) -> bytes:
    """A 504 answer's body, OpenAI-style (a stream given up before its first byte)."""
    return json.dumps({"error": {"message": message, "type": "GatewayTimeout", "code": 504}}).encode()


def error_event(message: str) -> str:
    """The last event of a stream whose replica went silent after it had started."""
    return "data: " + json.dumps({"error": {"message": message + "; retry the request",
                                            "type": "GatewayTimeout", "code": 504}}) + "\n\n"


class Liveness:
    """Is an instance's replica alive? Yes if it sent anything to any request lately (`heard`):
    a replica that keeps answering others is working, however late this try's answer is. That
    needs no health check, and one made to an overloaded replica could time out. Otherwise, a
    health check: one per instance at a time, its answer shared for `fresh_s`."""

    def __init__(self, fresh_s: float = FRESH_S, clock: Callable[[], float] = time.monotonic):
        self.fresh_s = fresh_s
        self.clock = clock
        self._checks: Dict[Any, Tuple[float, "asyncio.Future[Verdict]"]] = {}
        self._heard: Dict[Any, float] = {}

    def heard(self, key: Any) -> None:
        """The instance's replica sent something (an answer, a stream item) to some request."""
        if len(self._heard) > 1024 and key not in self._heard:  # bounded: forget the longest quiet
            cutoff = sorted(self._heard.values())[len(self._heard) // 2]
            self._heard = {k: t for k, t in self._heard.items() if t > cutoff}
        self._heard[key] = self.clock()

    async def check(self, key: Any, probe: Callable[[], Awaitable[Verdict]], heard_within_s: float = 0.0) -> Verdict:
        now = self.clock()
        if now - self._heard.get(key, float("-inf")) < heard_within_s:
            return True, ""
        entry = self._checks.get(key)
        if entry is None or (entry[1].done() and now - entry[0] >= self.fresh_s):
            if len(self._checks) > 256:  # bounded: keep only checks still running
                self._checks = {k: v for k, v in self._checks.items() if not v[1].done()}
            entry = (now, asyncio.ensure_future(_safely(probe)))
            self._checks[key] = entry
        # Shielded: a try that stops waiting (its client left) does not cancel the others' check.
        return await asyncio.shield(entry[1])


async def _safely(probe: Callable[[], Awaitable[Verdict]]) -> Verdict:
    try:
        return await probe()
    except Exception as e:  # a check that cannot be made says the replica is not reachable
        return False, f"{type(e).__name__}: {e}"[:200]


class SilenceWatch:
    """One try: `await watch.wait(awaitable)` for each thing awaited from its replica (the
    answer, the first stream item, each next one). Raises ReplicaSilent when the replica has
    been silent for `silence_s` and `alive()` says it is not; `close()` when the try is over.

    One watchdog task per try; a wait only notes when it started (a task per stream chunk would
    cost ~70 µs a chunk). To give up, the watchdog cancels the waiting task, and the wait turns
    that one cancellation into ReplicaSilent, as `asyncio.timeout` does. `on_check(alive)`
    counts the checks."""

    def __init__(self, silence_s: float, alive: Callable[[], Awaitable[Verdict]],
                 on_check: Callable[[bool], None] = lambda alive: None,
                 clock: Callable[[], float] = time.monotonic,
                 on_kept: Callable[[float], None] = lambda waited_s: None):
        self.silence_s = silence_s
        self.alive = alive
        self.on_check = on_check
        self.on_kept = on_kept  # a wait that was checked and kept, then answered: how long it was
        self.clock = clock
        self._dog: Optional[asyncio.Task] = None
        self._task: Optional[asyncio.Task] = None
        self._waiting_since: Optional[float] = None
        self._wait_no = 0
        self._alive_at = 0.0
        self._given_up: Optional[ReplicaSilent] = None

    async def wait(self, awaitable: Awaitable[Any]) -> Any:
        if self.silence_s <= 0:
            return await awaitable
        if self._dog is None or self._dog.done():
            self._dog = asyncio.ensure_future(self._watch())
        task = self._task = asyncio.current_task()
        cancelling = task.cancelling()
        since = self._waiting_since = self.clock()
        self._wait_no += 1
        try:
            result = await awaitable
        except asyncio.CancelledError:
            # Ours (the watchdog gave up) or someone else's (the client left, a shutdown): as
            # asyncio.timeout tells them apart, by the task's count of cancellations asked.
            given_up, self._given_up = self._given_up, None
            if given_up is not None and task.uncancel() <= cancelling:
                raise given_up from None
            raise
        finally:
            self._waiting_since = None
        if self._alive_at > since:  # checked while it waited, kept, and answered after all
            self.on_kept(self.clock() - since)
        return result

    def close(self) -> None:
        if self._dog is not None and not self._dog.done():
            self._dog.cancel()
        self._dog = None

    async def _watch(self) -> None:
        while True:
            since, wait_no = self._waiting_since, self._wait_no
            if since is None:  # not waiting on the replica now
                await asyncio.sleep(self.silence_s)
                continue
            due = max(since, self._alive_at) + self.silence_s
            now = self.clock()
            if now < due:
                await asyncio.sleep(due - now)
                continue
            alive, reason = await self.alive()
            self.on_check(alive)
            if self._wait_no != wait_no or self._waiting_since is None:
                continue  # the replica sent something meanwhile
            if alive:
                self._alive_at = self.clock()
                continue
            # The waiting task is suspended in `await awaitable` (the only place it waits while
            # `_waiting_since` is set): the cancellation lands there.
            now = self.clock()
            self._given_up = ReplicaSilent(now - since, now - max(since, self._alive_at), reason)
            self._task.cancel()
            return
