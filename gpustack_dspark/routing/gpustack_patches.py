"""Every hook routing puts into GPUStack's proxy (`gpustack.routes.openai`), in one place.

GPUStack 2.3's `/v1` handler (`proxy_request_by_model`) resolves the route's targets,
picks one by weight, picks an instance with `load_balancer`, and sends the request to
the instance's worker once. The hooks, all on that module only:

- `load_balancer.set_strategy(...)`: GPUStack's own seam; the policy's balance (expected
  finish time, least in-flight or round-robin; ties round-robin) with slow start.
- `parse_request_body`: wrapped to note the request's JSON intent in the routing slot.
- `ModelRouteService`: a subclass whose `resolve_route_targets` keeps the JSON pool or the
  general pool of a route's active targets (GPUStack's weights then split the pool).
- `_stream_response`: wrapped so a stream whose replica received nothing goes once to
  another instance (as a non-streamed request does), and an SSE stream that stops before
  `data: [DONE]` without an error event (a replica that died mid-stream reaches the server
  as a clean end) gets one, and the client is never left guessing.
- `request_to_worker`: wrapped to retry a non-streamed request once on another instance
  when the first one received nothing (see `retry.py`), and to return a replica's own error
  answer (4xx, a withheld reply's 500) with its status and body instead of GPUStack's 503
  (see `upstream_status.py`); streamed, `_stream_response` gives such an answer its JSON
  content type.

Each hook is its own unit below (a factory taking what it wraps and a `_Context`);
`apply_routing_hooks` checks, builds and installs them. Each hook checks the GPUStack version and the exact shape of what it wraps
(the GPUStack seam: `gpustack_seam/shapes.py`, the feature `routing`); on any
mismatch nothing is applied and the reason is returned, and GPUStack proxies as it
always did. Everything acts only inside a request slot set by `middleware.py`.
"""

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpustack_dspark import backend
from gpustack_dspark import gpustack_seam as seam
from gpustack_dspark.gpustack_seam import PatchResult
from gpustack_dspark.routing import affinity, retry, silence, stream_end, targets, upstream_status
from gpustack_dspark.routing.context import RequestSlot, current_slot
from gpustack_dspark.routing.inflight import InFlightTracker
from gpustack_dspark.routing.speed import LEAST_CONNECTIONS, ROUND_ROBIN
from gpustack_dspark.routing.intent import has_json_intent, requested_schema
from gpustack_dspark.routing.policy import RoutingPolicy

logger = logging.getLogger(__name__)

_MARK = "_dspark_routing"

@dataclass
class RoutingStats:
    """Counters the status API and the Prometheus collector read."""

    decisions: Dict[str, int] = field(default_factory=lambda: {d: 0 for d in targets.DECISIONS})
    retries: Dict[str, int] = field(default_factory=lambda: {"retried": 0, "no_other_instance": 0, "broken_streams": 0,
                                                              "silent_given_up": 0})
    # Replica error answers passed through with their own status (see upstream_status.py).
    statuses: Dict[str, int] = field(default_factory=lambda: {"replica_4xx": 0, "replica_5xx": 0, "withheld": 0})
    worker_snapshots: Any = None  # the hooks' WorkerSnapshots, once applied
    # Tries whose replica went silent (silence.py): health checks made, answered alive, tries
    # given up, the longest a given-up try waited from its start to the give-up, and the
    # longest from its last sign of life (its start or an alive check) to the give-up: how long
    # a dead replica held a try. Also the longest wait that was checked, kept and then
    # answered: how close working replicas come to being given up.
    silence: Dict[str, float] = field(default_factory=lambda: {"checked": 0, "alive": 0, "given_up": 0,
                                                               "longest_given_up_wait_s": 0.0,
                                                               "longest_given_up_silence_s": 0.0,
                                                               "longest_kept_wait_s": 0.0})

    def decided(self, decision: str) -> None:
        self.decisions[decision] = self.decisions.get(decision, 0) + 1

    def count_status(self, key: str) -> None:
        self.statuses[key] = self.statuses.get(key, 0) + 1


RoutingHooks = PatchResult  # applied, or why not; the hooks put in place


def release_slot(tracker: InFlightTracker, slot: RequestSlot) -> None:
    """The request is over: drop its count, and when its answer went out whole and
    successful, feed the time from choice to last byte to the instance's estimate."""
    if slot.instance_id is not None:
        if slot.completed and not slot.broken and slot.status is not None and slot.status < 400:
            tracker.record(slot.instance_id, time.monotonic() - slot.chosen_at, slot.output_tokens or 1)
        tracker.release(slot.instance_id)
        slot.instance_id = None


def _take(tracker: InFlightTracker, slot: RequestSlot, instance) -> None:
    """Move the slot's count onto `instance` (a retry moves it, never doubles it)."""
    if slot.instance_id is not None:
        tracker.release(slot.instance_id)
    tracker.acquire(instance.id, getattr(instance, "model_id", None))
    slot.instance_id = instance.id
    slot.chosen_at = time.monotonic()
    slot.tried.add(instance.id)


class WorkerSnapshots:
    """GPUStack 2.3 hands its proxy a `Worker` row shared by every request (the cached
    `WorkerService.get_by_id`). Once another session has expired it, reading its attributes
    lazy-loads through that session, and concurrent requests then fail with SQLAlchemy's
    "This session is provisioning a new connection; concurrent operations are not permitted"
    — a 503 to the client before anything reached the replica (found by the 1,000-request
    soak). The proxy hooks give GPUStack's request functions a transient copy instead, made
    by one request at a time and reused for `TTL_S` seconds."""

    TTL_S = 2.0

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self._copies: Dict[Any, Tuple[float, Any]] = {}
        self.copied = 0
        self.failed = 0

    @staticmethod
    def _key(worker) -> Any:
        try:
            from sqlalchemy import inspect as sa_inspect

            state = sa_inspect(worker, raiseerr=False)
        except Exception:
            state = None
        # The identity key is read from the instance state: no attribute load.
        return state.identity_key if state is not None and state.identity_key is not None else id(worker)

    async def get(self, worker):
        if worker is None:
            return worker
        key = self._key(worker)
        now = time.monotonic()
        entry = self._copies.get(key)
        if entry is not None and now - entry[0] < self.TTL_S:
            return entry[1]
        async with self._lock:
            entry = self._copies.get(key)
            if entry is not None and now - entry[0] < self.TTL_S:
                return entry[1]
            try:
                # Read through the ORM's attributes (an expired row loads here, once, under the
                # lock; `model_dump()` would read the bare instance dict and see None); a table
                # model's constructor does not validate: the row as it is, transient.
                copy = type(worker)(**{name: getattr(worker, name) for name in type(worker).model_fields})
            except Exception as e:  # the shared row as GPUStack would use it
                self.failed += 1
                logger.debug("could not copy worker row: %s", e)
                return worker
            if getattr(copy, "port", None) is None:  # not a row GPUStack could reach either
                self.failed += 1
                return worker
            if len(self._copies) > 256:
                self._copies.clear()
            self._copies[key] = (now, copy)
            self.copied += 1
            return copy


@dataclass
class _Context:
    """What the hooks share: the policy, the tracker, the counters and GPUStack's symbols."""

    policy: RoutingPolicy
    tracker: InFlightTracker
    stats: RoutingStats
    gs: Dict[str, Any]  # GPUStack symbols imported once by apply_routing_hooks
    workers: WorkerSnapshots = field(default_factory=WorkerSnapshots)
    liveness: silence.Liveness = field(default_factory=silence.Liveness)
    probe_request: Optional[Callable] = None  # GPUStack's own request_to_worker: the health checks

    @property
    def mode(self) -> str:
        return self.policy.proxy.balance.value


def make_strategy(base_class, tracker: InFlightTracker, mode: str = LEAST_CONNECTIONS):
    class BalancingStrategy(base_class):
        """GPUStack's load-balancing strategy: the policy's balance over in-flight requests
        counted by the plugin's middleware (ties round-robin per model), weighted by slow
        start; counts only inside a request slot. `round_robin` still counts, so the
        in-flight figures stay visible when the policy turns the choice off."""

        async def select_instance(self, instances):
            if not instances:
                raise Exception("No instances available")
            slot = current_slot()
            by_id = {instance.id: instance for instance in instances}
            group = instances[0].model_id
            tracker.see(group, [(i.id, getattr(i, "restart_count", None)) for i in instances])
            key = slot.affinity_key if slot is not None else None
            chosen = by_id[tracker.choose(group, list(by_id), mode, key)]
            if slot is not None:
                slot.candidates = list(instances)
                _take(tracker, slot, chosen)
            return chosen

    return BalancingStrategy


def parse_request_body_hook(original: Callable, tracker: InFlightTracker) -> Callable:
    """Note the request's JSON intent, stream flag, model, schema and affinity key in the slot."""

    async def parse_request_body(request):
        parsed = await original(request)
        slot = current_slot()
        if slot is not None:
            model_name, stream, body_json, _form = parsed
            slot.json_intent = has_json_intent(body_json)
            slot.stream = bool(stream)
            slot.model = model_name if isinstance(model_name, str) else None
            slot.schema = requested_schema(body_json) if slot.json_intent else None
            config = tracker.affinity_config
            if config.enabled:
                try:
                    slot.affinity_key = affinity.request_keys(slot.model, body_json, config)
                except Exception:  # a body the key cannot read is balanced by load, never refused here
                    logger.debug("no affinity key for this request", exc_info=True)
        return parsed

    return parse_request_body


async def _next_attempt(ctx: "_Context", slot: RequestSlot, worker, headers) -> Optional[Tuple[Any, Dict]]:
    """Move the request to another candidate instance (the retry's choice uses the policy's
    balance); returns its worker and the headers that route to it, or None when there is
    no other instance."""
    if slot.instance_id is not None:
        ctx.tracker.failed(slot.instance_id)
    others = [i for i in slot.candidates if i.id not in slot.tried]
    if not others:
        ctx.stats.retries["no_other_instance"] += 1
        return None
    slot.retried = True
    ctx.stats.retries["retried"] += 1
    by_id = {i.id: i for i in others}
    instance = by_id[ctx.tracker.choose(others[0].model_id, list(by_id), ctx.mode, slot.affinity_key)]
    _take(ctx.tracker, slot, instance)
    logger.info("retrying a request on instance %s after instance %s received nothing",
                instance.id, sorted(slot.tried - {instance.id}))
    next_worker = worker
    if instance.worker_id != worker.id:
        async with ctx.gs["async_session"]() as session:
            next_worker = await ctx.gs["WorkerService"](session).get_by_id(instance.worker_id) or worker
        next_worker = await ctx.workers.get(next_worker)
    retry_headers = dict(headers or {})
    retry_headers[ctx.gs["router_header_key"]] = f"{ctx.gs['model_instance_prefix'](instance)}.static"
    return next_worker, retry_headers


def _may_retry(ctx: "_Context", slot: Optional[RequestSlot], data) -> bool:
    return (slot is not None and ctx.policy.proxy.retry_once and not slot.retried
            and isinstance(data, (bytes, type(None))))


def _as_bytes(chunk) -> bytes:
    return chunk if isinstance(chunk, (bytes, bytearray)) else str(chunk).encode()


def _silence_watch(ctx: "_Context", slot: Optional[RequestSlot], worker, headers, proxy_client,
                   no_proxy_client) -> silence.SilenceWatch:
    """The watch on one try (`silence.py`): the slot's current instance, checked through `worker`
    with the header that routes this try to it. No ORM row is read here: GPUStack's instance
    rows are shared between requests, and reading an expired one outside its session fails
    ("This session is provisioning a new connection")."""
    seconds = ctx.policy.proxy.silence_timeout_s
    instance_id = slot.instance_id if slot is not None else None
    route = (headers or {}).get(ctx.gs["router_header_key"])
    if instance_id is None or route is None or ctx.probe_request is None:
        seconds = 0  # outside a slot, or nothing to check: GPUStack's own bounds only

    async def alive() -> silence.Verdict:
        return await ctx.liveness.check(instance_id, lambda: _health_check(ctx, worker, route, proxy_client,
                                                                            no_proxy_client, seconds),
                                        heard_within_s=seconds)

    def on_check(answered: bool) -> None:
        ctx.stats.silence["checked"] += 1
        ctx.stats.silence["alive"] += 1 if answered else 0

    def on_kept(waited_s: float) -> None:
        stats = ctx.stats.silence
        stats["longest_kept_wait_s"] = round(max(stats["longest_kept_wait_s"], waited_s), 3)

    return silence.SilenceWatch(seconds, alive, on_check, on_kept=on_kept)


async def _health_check(ctx: "_Context", worker, route: str, proxy_client, no_proxy_client,
                        silence_s: float) -> silence.Verdict:
    """`GET /health` of the instance's replica, through its worker, routed as the try was."""
    import aiohttp

    bound = silence.probe_timeout(silence_s)
    headers = {ctx.gs["router_header_key"]: route}
    try:
        resp, body = await ctx.probe_request(worker, "GET", silence.HEALTH_PATH, proxy_client=proxy_client,
                                             no_proxy_client=no_proxy_client, headers=headers,
                                             timeout=aiohttp.ClientTimeout(total=bound), raise_on_error=False)
    except asyncio.TimeoutError:
        return False, f"no answer within {bound:.0f} s"
    except Exception as e:
        return False, f"{type(e).__name__}: {e}"[:200]
    return silence.health_verdict(resp.status, body)


def _given_up(ctx: "_Context", slot: RequestSlot, silent: silence.ReplicaSilent) -> str:
    """Count a try given up for silence; its instance ramps in again. Returns the one-line why."""
    stats = ctx.stats.silence
    stats["given_up"] += 1
    ctx.stats.retries["silent_given_up"] = ctx.stats.retries.get("silent_given_up", 0) + 1
    stats["longest_given_up_wait_s"] = round(max(stats["longest_given_up_wait_s"], silent.waited_s), 3)
    stats["longest_given_up_silence_s"] = round(max(stats["longest_given_up_silence_s"], silent.silent_s), 3)
    if slot.instance_id is not None:
        ctx.tracker.failed(slot.instance_id)
    message = silence.given_up_message(slot.instance_id, silent)
    logger.warning("%s", message)
    return message


def _heard(ctx: "_Context", slot: Optional[RequestSlot], status: int, body: Any = None) -> None:
    """The slot's instance answered (not its worker for it): its replica is alive (silence.py)."""
    if slot is not None and slot.instance_id is not None and (
            status < 400 or upstream_status.classify(status, _as_bytes(body)) == upstream_status.REPLICA):
        ctx.liveness.heard(slot.instance_id)


async def _first_item(ctx: "_Context", slot: Optional[RequestSlot], watch: silence.SilenceWatch,
                      stream) -> Tuple[Any, Optional[silence.ReplicaSilent]]:
    try:
        item = await watch.wait(anext(stream, None))
    except silence.ReplicaSilent as silent:  # the stream was cancelled: its connection is closed
        return None, silent
    if item is not None:
        _heard(ctx, slot, item[2], item[0] if item[2] >= 400 else None)
    return item, None


def stream_response_hook(original: Callable, ctx: "_Context") -> Callable:
    """A stream whose replica received nothing (the worker's own 503/404 before any byte)
    is sent once to another instance, as a non-streamed request is; a stream that stops
    before `data: [DONE]` without an error event gets one; a replica's refusal before
    streaming keeps its status with a JSON content type; the stream's output tokens go to
    the slot."""

    async def _stream_response(worker, method, path, headers, data, proxy_client, no_proxy_client):
        slot = current_slot()
        if slot is not None:
            worker = await ctx.workers.get(worker)
        watch = _silence_watch(ctx, slot, worker, headers, proxy_client, no_proxy_client)
        stream = original(worker, method, path, headers, data, proxy_client, no_proxy_client)
        try:
            item, silent = await _first_item(ctx, slot, watch, stream)
            if silent is not None:
                message = _given_up(ctx, slot, silent)
                again = _may_retry(ctx, slot, data)
            else:
                again = (item is not None and item[2] >= 400 and _may_retry(ctx, slot, data)
                         and retry.retryable_answer(item[2], _as_bytes(item[0])))
            if again:
                attempt = await _next_attempt(ctx, slot, worker, headers)
                if attempt is None and silent is not None:
                    message += "; no other instance to retry on"
                if attempt is not None:
                    await stream.aclose()
                    watch.close()
                    worker, headers = attempt
                    watch = _silence_watch(ctx, slot, worker, headers, proxy_client, no_proxy_client)
                    stream = original(worker, method, path, headers, data, proxy_client, no_proxy_client)
                    item, silent = await _first_item(ctx, slot, watch, stream)
                    if silent is not None:
                        message = _given_up(ctx, slot, silent)
            if silent is not None:  # nothing reached the client yet: a 504 that says why
                yield silence.error_body(message), {"content-type": "application/json"}, 504
                return
            state = stream_end.StreamWatch()
            status = 200
            first = True
            while item is not None:
                chunk, resp_headers, resp_status = item
                status = resp_status
                if first and resp_status >= 400 and ctx.policy.proxy.pass_replica_status:
                    body = _as_bytes(chunk)
                    if upstream_status.classify(resp_status, body) == upstream_status.REPLICA:
                        # The replica refused before streaming: its status and JSON error body, with
                        # only its content type (the worker's framing headers do not apply here).
                        ctx.stats.count_status(upstream_status.count_key(resp_status, body))
                        resp_headers = {"content-type": "application/json"}
                first = False
                state.see(chunk)
                yield chunk, resp_headers, resp_status
                try:
                    item = await watch.wait(anext(stream, None))
                    if slot is not None and slot.instance_id is not None:
                        ctx.liveness.heard(slot.instance_id)
                except silence.ReplicaSilent as silent:  # mid-stream: end it with an error event now
                    message = _given_up(ctx, slot, silent)
                    slot.broken = True
                    ctx.stats.retries["broken_streams"] = ctx.stats.retries.get("broken_streams", 0) + 1
                    yield silence.error_event(message), {}, status
                    return
            if slot is not None:
                slot.output_tokens = state.output_tokens()
            if status < 400 and state.truncated():
                if slot is not None:
                    slot.broken = True
                ctx.stats.retries["broken_streams"] = ctx.stats.retries.get("broken_streams", 0) + 1
                logger.warning("stream from worker %s ended before [DONE]; sent an error event", worker.id)
                yield stream_end.TRUNCATED_ERROR_EVENT, {}, status
        finally:
            watch.close()

    return _stream_response


def route_service_hook(base_class, ctx: _Context):
    """Keep the JSON pool or the general pool of a route's active targets."""
    model_service = ctx.gs["ModelService"]
    bad_request = ctx.gs["BadRequestException"]

    class JsonAwareModelRouteService(base_class):
        async def resolve_route_targets(self, name):
            resolved = await super().resolve_route_targets(name)
            slot = current_slot()
            if slot is None or not resolved:
                return resolved
            json_models = set()
            for target in resolved:
                model = await model_service(self.session).get_by_id(target.model_id) if target.model_id else None
                if model is not None and model.backend == backend.BACKEND_NAME:
                    json_models.add(target.model_id)
            choice = targets.choose_targets(resolved, lambda t: t.model_id in json_models, slot.json_intent,
                                            ctx.policy.json_only_without_json_intent)
            slot.decision = choice.decision
            ctx.stats.decided(choice.decision)
            if choice.decision == targets.REFUSED:
                raise bad_request(message=targets.refusal_message(name), is_openai_exception=True)
            return choice.targets

    return JsonAwareModelRouteService


def _worker_error(worker, method, path, status, body):
    import aiohttp

    text = (body or b"").decode("utf-8", "replace")
    return aiohttp.ClientError(f"Worker request failed: {worker.id} {method} {path} status={status}, error={text}")


def request_to_worker_hook(original: Callable, ctx: _Context) -> Callable:
    """Non-streamed: retry once on another instance when the first received nothing
    (`retry.py`), pass a replica's own error answer through (`upstream_status.py`), and
    note the answer's output tokens in the slot."""
    policy, stats = ctx.policy, ctx.stats

    def answer(slot, worker, method, path, resp, body, raise_on_error):
        """A replica's own error answer goes back as it is (with its status and OpenAI error
        body); the worker's own answers (replica unreachable, timed out) keep GPUStack's 503."""
        if resp.status < 400:
            slot.output_tokens = stream_end.completion_tokens(body)
            return resp, body
        if policy.proxy.pass_replica_status and upstream_status.classify(resp.status, body) == upstream_status.REPLICA:
            stats.count_status(upstream_status.count_key(resp.status, body))
            return resp, body
        if raise_on_error:
            raise _worker_error(worker, method, path, resp.status, body)
        return resp, body

    async def request_to_worker(worker, method, path, proxy_client=None, no_proxy_client=None, params=None,
                                data=None, headers=None, timeout=None, raise_on_error=True):
        slot = current_slot()
        call = dict(method=method, path=path, proxy_client=proxy_client, no_proxy_client=no_proxy_client,
                    params=params, data=data, timeout=timeout)
        if slot is None:
            return await original(worker, headers=headers, raise_on_error=raise_on_error, **call)
        worker = await ctx.workers.get(worker)

        async def tried(try_worker, try_headers, on_error: bool):
            """One try, given up if its replica goes silent (silence.py)."""
            watch = _silence_watch(ctx, slot, try_worker, try_headers, proxy_client, no_proxy_client)
            try:
                resp, body = await watch.wait(original(try_worker, headers=try_headers, raise_on_error=on_error,
                                                       **call))
            finally:
                watch.close()
            _heard(ctx, slot, resp.status, body)
            return resp, body

        def timed_out(silent: silence.ReplicaSilent) -> asyncio.TimeoutError:
            # GPUStack answers a TimeoutError with its 504 "Request to worker N timed out: <why>".
            return asyncio.TimeoutError(_given_up(ctx, slot, silent))

        if slot.stream or not isinstance(data, (bytes, type(None))):
            try:
                return await tried(worker, headers, raise_on_error)
            except silence.ReplicaSilent as silent:
                raise timed_out(silent) from None
        may_retry = _may_retry(ctx, slot, data)
        first_failure: Any = None
        try:
            resp, body = await tried(worker, headers, False)
        except silence.ReplicaSilent as silent:
            if not may_retry:
                raise timed_out(silent) from None
            first_failure = _given_up(ctx, slot, silent)
        except Exception as e:
            if not (may_retry and retry.retryable_exception(e)):
                raise
            first_failure = e
        else:
            if resp.status < 400 or not (may_retry and retry.retryable_answer(resp.status, body)):
                return answer(slot, worker, method, path, resp, body, raise_on_error)
        attempt = await _next_attempt(ctx, slot, worker, headers)
        if attempt is None:
            if isinstance(first_failure, str):  # the silent try's why
                raise asyncio.TimeoutError(f"{first_failure}; no other instance to retry on")
            if first_failure is not None:
                raise first_failure
            return answer(slot, worker, method, path, resp, body, raise_on_error)
        next_worker, retry_headers = attempt
        try:
            resp, body = await tried(next_worker, retry_headers, False)
        except silence.ReplicaSilent as silent:
            raise timed_out(silent) from None
        return answer(slot, next_worker, method, path, resp, body, raise_on_error)

    return request_to_worker


GPUSTACK_NAMES = ("BadRequestException", "model_instance_prefix", "router_header_key", "LoadBalancingStrategy",
                  "openai", "async_session", "ModelService", "WorkerService")


def apply_routing_hooks(policy: RoutingPolicy, tracker: InFlightTracker, stats: RoutingStats) -> RoutingHooks:
    try:
        gs = {name: seam.resolve(name) for name in GPUSTACK_NAMES}
        openai = gs["openai"]
        if getattr(openai, _MARK, None):
            return RoutingHooks(True, hooks=list(getattr(openai, _MARK)))
        seam.require_feature("routing")
    except seam.SeamMismatch as e:
        return RoutingHooks(False, str(e))
    if not callable(getattr(openai.load_balancer, "set_strategy", None)):
        return RoutingHooks(False, "gpustack.routes.openai.load_balancer has no set_strategy()")

    ctx = _Context(policy, tracker, stats, gs, probe_request=openai.request_to_worker)
    stats.worker_snapshots = ctx.workers
    tracker.configure(policy.proxy.slow_start.config(), policy.proxy.affinity.config())
    originals = {"parse_request_body": openai.parse_request_body, "request_to_worker": openai.request_to_worker,
                 "_stream_response": openai._stream_response, "ModelRouteService": openai.ModelRouteService}
    applied: List[str] = []
    openai.load_balancer.set_strategy(make_strategy(gs["LoadBalancingStrategy"], tracker, ctx.mode)())
    applied.append(ctx.mode if ctx.mode != ROUND_ROBIN else "round_robin_counted")
    if ctx.mode != ROUND_ROBIN and policy.proxy.slow_start.ramp_s > 0:
        applied.append("slow_start")
    openai.parse_request_body = parse_request_body_hook(originals["parse_request_body"], tracker)
    applied.append("json_intent")
    if ctx.mode != ROUND_ROBIN and policy.proxy.affinity.enabled:
        applied.append("affinity")
    if policy.proxy.json_aware:
        openai.ModelRouteService = route_service_hook(originals["ModelRouteService"], ctx)
        applied.append("json_aware_targets")
    openai._stream_response = stream_response_hook(originals["_stream_response"], ctx)
    applied.append("stream_end_event")
    # Always wrapped: it also reads the answers' output tokens (the service-time estimate);
    # with retry_once and pass_replica_status off it only does that.
    openai.request_to_worker = request_to_worker_hook(originals["request_to_worker"], ctx)
    applied += [name for name, on in (("retry_once", policy.proxy.retry_once),
                                      ("replica_status", policy.proxy.pass_replica_status),
                                      ("silence_timeout", policy.proxy.silence_timeout_s > 0)) if on]
    setattr(openai, _MARK, tuple(applied))
    setattr(openai, "_dspark_routing_originals", originals)
    logger.info("DSpark routing hooks applied to GPUStack's proxy: %s", ", ".join(applied))
    return RoutingHooks(True, hooks=applied)
