"""Routing decisions: JSON intent, target pools, least-connections, retry rules, policy, gateway plan."""

import asyncio
import json

import pytest

from gpustack_dspark.routing import targets
from gpustack_dspark.routing.context import current_slot
from gpustack_dspark.routing.gateway import plan_route
from gpustack_dspark.routing.inflight import ROUND_ROBIN, InFlightTracker, pick_least_loaded
from gpustack_dspark.routing.intent import has_json_intent
from gpustack_dspark.routing.middleware import InFlightMiddleware
from gpustack_dspark.routing.policy import (
    DEFAULT_POLICY_PATH, GatewayPolicy, NoJsonIntentOnJsonOnly, PolicyError, load_policy, parse_policy,
)
from gpustack_dspark.routing.retry import retryable_answer, retryable_exception


@pytest.mark.parametrize("body", [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"structured_outputs": {"json": {"type": "object"}}},
    {"structured_outputs": {"json_object": True}},
    {"guided_json": {"type": "object"}},
    {"extra_body": {"guided_json": {"type": "object"}}},
])
def test_json_intent_is_seen(body):
    assert has_json_intent({"model": "m", "messages": [], **body})


@pytest.mark.parametrize("body", [
    None, {}, {"response_format": {"type": "text"}}, {"structured_outputs": {"regex": "a+"}},
    {"structured_outputs": {"json_object": False}}, {"guided_json": None}, {"response_format": "json_object"},
])
def test_no_json_intent(body):
    assert not has_json_intent(body)


J1, J2, G1 = ("j1", True), ("j2", True), ("g1", False)


def _choose(route, intent, policy=NoJsonIntentOnJsonOnly.SERVE_AS_JSON):
    return targets.choose_targets(route, lambda t: t[1], intent, policy)


def test_mixed_route_splits_by_intent():
    assert _choose([J1, G1, J2], True) == targets.TargetChoice([J1, J2], targets.JSON)
    assert _choose([J1, G1, J2], False) == targets.TargetChoice([G1], targets.GENERAL)


def test_json_only_route_follows_the_policy():
    assert _choose([J1], False) == targets.TargetChoice([J1], targets.JSON_ONLY)
    assert _choose([J1], False, NoJsonIntentOnJsonOnly.REFUSE) == targets.TargetChoice([], targets.REFUSED)
    assert _choose([J1], True, NoJsonIntentOnJsonOnly.REFUSE) == targets.TargetChoice([J1], targets.JSON)


def test_routes_without_json_targets_are_untouched():
    assert _choose([G1], True) == targets.TargetChoice([G1], targets.UNCHANGED)
    assert _choose([G1], False) == targets.TargetChoice([G1], targets.UNCHANGED)


def test_refusal_message_names_model_and_what_to_send():
    text = targets.refusal_message("extractor")
    assert "'extractor'" in text and "json_object" in text and "refuse" in text


def test_least_loaded_with_round_robin_ties():
    assert pick_least_loaded([1, 2, 3], {1: 2, 2: 0, 3: 1}, 0) == 2
    assert [pick_least_loaded([3, 1, 2], {}, turn) for turn in range(4)] == [1, 2, 3, 1]
    with pytest.raises(ValueError):
        pick_least_loaded([], {}, 0)


def test_tracker_spreads_and_never_goes_negative():
    tracker = InFlightTracker()
    chosen = []
    for _ in range(6):
        instance = tracker.choose(7, [10, 11, 12])
        tracker.acquire(instance, 7)
        chosen.append(instance)
    assert sorted(chosen) == [10, 10, 11, 11, 12, 12]
    for instance in chosen:
        tracker.release(instance)
    tracker.release(10)  # one too many
    assert tracker.count(10) == 0 and tracker.total() == 0
    assert tracker.unmatched_releases == 1
    row = tracker.snapshot()[10]
    level = row.pop("affinity_level")  # its in-flight averaged over the six choices: between 0 and 2
    assert row.pop("affinity_keyed_share") is None  # no keyed request: no key lives there
    assert row == {"in_flight": 0, "model_id": 7, "seconds_per_token": None, "samples": 0,
                   "weight": 1.0, "affinity_keys": 0, "affinity_home": 0, "affinity_spilled_in": 0}
    assert 0 < level < 2, level


def test_round_robin_mode_ignores_load():
    tracker = InFlightTracker()
    tracker.acquire(1, 1)
    tracker.acquire(1, 1)
    assert [tracker.choose(1, [2, 1], ROUND_ROBIN) for _ in range(3)] == [1, 2, 1]


def _worker_503(message):
    return json.dumps({"error": {"message": message, "code": 503, "type": "ServiceUnavailable"}}).encode()


def test_retry_only_when_the_replica_received_nothing():
    refused = "An unexpected error occurred: Cannot connect to host 127.0.0.1:9 ssl:default [Connect call failed]"
    assert retryable_answer(503, _worker_503(refused))
    assert retryable_answer(503, _worker_503("An unexpected error occurred: Server disconnected"))
    assert retryable_answer(503, _worker_503("An unexpected error occurred: [Errno None] Can not write request body "
                                             "for http://127.0.0.1:9/v1/chat/completions"))
    assert retryable_answer(503, _worker_503("An unexpected error occurred: Response payload is not completed: "
                                             "<TransferEncodingError: 400, message='Not enough data'>"))
    not_running = json.dumps({"code": 404, "reason": "Not Found",
                              "message": "No running model instance found for model name: 4"}).encode()
    assert retryable_answer(404, not_running)
    # The replica's own answers are never retried, whatever their status.
    assert not retryable_answer(503, _worker_503("engine overloaded"))
    assert not retryable_answer(503, b"warming up")
    assert not retryable_answer(500, _worker_503(refused))
    assert not retryable_answer(400, b'{"error": {"message": "bad"}}')
    assert not retryable_answer(404, b'{"detail": "Not Found"}')


def test_retryable_exceptions_are_before_any_response():
    class ClientConnectorError(Exception):
        pass

    class ServerDisconnectedError(Exception):
        pass

    class ClientPayloadError(Exception):
        pass

    assert retryable_exception(ClientConnectorError())
    assert retryable_exception(ServerDisconnectedError())
    assert not retryable_exception(ClientPayloadError())
    assert not retryable_exception(asyncio.TimeoutError())


def test_shipped_policy_file_is_valid_and_default():
    policy = load_policy(DEFAULT_POLICY_PATH)
    assert policy.json_only_without_json_intent is NoJsonIntentOnJsonOnly.SERVE_AS_JSON
    assert policy == parse_policy({})
    assert policy.proxy.balance.value == "expected_finish_time" and policy.proxy.slow_start.ramp_s == 30
    assert policy.proxy.retry_once and policy.gateway.least_load and policy.proxy.gc_freeze
    assert policy.gateway.session_affinity.value == "off"
    assert policy.proxy.affinity.enabled and policy.proxy.affinity.load_bound == 1.5


@pytest.mark.parametrize("document, names", [
    ({"json_only_without_json_intent": "drop"}, ["json_only_without_json_intent", "'drop'", "serve_as_json"]),
    ({"proxy": {"least_conections": True}}, ["proxy.least_conections"]),
    ({"version": 2}, ["key 'version'", "got 2", "allowed: 1"]),
    ({"gateway": {"sync_interval_s": 0}}, ["gateway.sync_interval_s"]),
    ({"proxy": {"affinity": {"load_bound": 0.5}}}, ["proxy.affinity.load_bound", "0.5", "1"]),
    ({"proxy": {"affinity": {"prefix_bytes": 100}}}, ["proxy.affinity.prefix_bytes", "100", "256"]),
    ({"proxy": {"affinity": {"prefix": 100}}}, ["proxy.affinity.prefix", "prefix_bytes", "load_bound"]),
    ({"proxy": {"affinity": {"enabled": "sometimes"}}}, ["proxy.affinity.enabled", "sometimes"]),
    (["a"], ["mapping"]),
])
def test_bad_policy_names_field_value_and_allowed(document, names):
    with pytest.raises(PolicyError) as error:
        parse_policy(document, source="routing.yaml")
    for name in names:
        assert name in str(error.value)


def test_unquoted_yaml_off_is_off(tmp_path):
    path = tmp_path / "routing.yaml"
    path.write_text("gateway:\n  session_affinity: off\n")
    assert load_policy(path).gateway.session_affinity.value == "off"
    path.write_text("json_only_without_json_intent: [\n")
    with pytest.raises(PolicyError, match="not valid YAML"):
        load_policy(path)


def test_gateway_plan_enables_least_load_and_resets_affinity_once():
    policy = GatewayPolicy()
    stock_multi = plan_route({"enabled": True}, {"enabled": True, "sessionKeys": [{"header": "session-id"}]},
                             None, {5: 0}, policy)
    assert stock_multi.least_load is None  # already on
    assert stock_multi.session_affinity == {"enabled": False, "sessionKeys": [{"header": "session-id"}]}
    assert stock_multi.marker["session_affinity_reset"]
    single = plan_route(None, None, None, {9: 100}, policy)
    assert single.least_load == {"enabled": True} and single.zero_weight_target_ids == (9,)
    # Already in shape: nothing to do (idempotent).
    done = plan_route({"enabled": True}, {"enabled": False, "sessionKeys": []}, single.marker, {9: 0}, policy)
    assert not done.changes
    # The user turned affinity back on after our reset: respected.
    user = plan_route({"enabled": True}, {"enabled": True, "sessionKeys": []}, single.marker, {9: 0}, policy)
    assert not user.changes
    # A business split between several weighted targets is the user's.
    split = plan_route({"enabled": True}, None, single.marker, {1: 70, 2: 30}, policy)
    assert not split.changes


def test_middleware_releases_once_however_the_request_ends():
    released = []

    async def ok(scope, receive, send):
        current_slot().instance_id = 1

    async def boom(scope, receive, send):
        current_slot().instance_id = 2
        raise RuntimeError("upstream broke")

    async def cancelled(scope, receive, send):
        current_slot().instance_id = 3
        raise asyncio.CancelledError()

    async def run(app, path="/v1/chat/completions"):
        middleware = InFlightMiddleware(app, release=lambda slot: released.append(slot.instance_id))
        await middleware({"type": "http", "path": path}, None, None)

    asyncio.run(run(ok))
    with pytest.raises(RuntimeError):
        asyncio.run(run(boom))
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(run(cancelled))
    async def outside(scope, receive, send):
        assert current_slot() is None

    asyncio.run(run(outside, path="/v2/models"))  # not an inference path: no slot, no release
    assert released == [1, 2, 3]
    assert current_slot() is None


def test_stream_watch_spots_a_cut_off_stream():
    from gpustack_dspark.routing.stream_end import TRUNCATED_ERROR_EVENT, StreamWatch

    def watch(*chunks):
        w = StreamWatch()
        for c in chunks:
            w.see(c)
        return w.truncated()

    assert watch('data: {"choices": []}\n\n', "data: [DONE]\n\n") is False
    assert watch('data: {"choices": []}\n\n', 'data: {"error": {"message": "x"}}\n\n') is False
    assert watch('data: {"choices": []}\n\n') is True
    assert watch() is False  # nothing at all: GPUStack already answers 503 itself
    assert watch(b'data: {"choices": []}\n\n', b"data: [DONE]\n\n") is False
    assert TRUNCATED_ERROR_EVENT.startswith('data: {"error": ') and TRUNCATED_ERROR_EVENT.endswith("\n\n")


def test_policy_file_comes_from_the_policy_dir(tmp_path, monkeypatch):
    from gpustack_dspark.routing.feature import POLICY_ENV, policy_path

    monkeypatch.delenv(POLICY_ENV, raising=False)
    assert policy_path(None) is None  # built-in defaults
    assert policy_path(str(tmp_path)) is None  # a policy dir without routing.yaml: defaults too
    (tmp_path / "routing.yaml").write_text("version: 1\n")
    assert policy_path(str(tmp_path)) == tmp_path / "routing.yaml"
    monkeypatch.setenv(POLICY_ENV, "/elsewhere/routing.yaml")
    assert str(policy_path(None)) == "/elsewhere/routing.yaml"
    with pytest.raises(PolicyError, match="not a directory"):
        policy_path(str(tmp_path / "missing"))
