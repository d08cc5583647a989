"""Routing through GPUStack's real `/v1` proxy: server -> real CPU worker -> stand-in replicas.

The replicas are test stand-ins for vLLM (tests/support/stand_in_replica.py):
no container runtime or GPU exists here, so GPUStack cannot start real replicas yet.
The server runs with `proxy.silence_timeout_s: 3` (SILENCE_S), so giving up on a silent
replica takes seconds; every stand-in here answers well within that.
"""

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpustack_dspark import backend
from tests.conftest import admin_api, dspark_status, wait_for
from tests.integration.shared_stack import join_listening_cpu_worker
from tests.support.stand_in_instances import (
    RunningStateKeeper, STAND_IN_BACKEND, STAND_IN_VERSION, create_stand_in_model, ensure_stand_in_backend,
    instances_of, set_running, wait_routable,
)
from tests.support.stand_in_replica import StandInReplica

pytestmark = pytest.mark.integration

SILENCE_S = 3
JSON_BODY = {"messages": [{"role": "user", "content": "a record"}], "response_format": {"type": "json_object"}}
PLAIN_BODY = {"messages": [{"role": "user", "content": "a poem"}]}


class Stack:
    def __init__(self, server, api, worker, replicas, models):
        self.server, self.api, self.worker, self.replicas, self.models = server, api, worker, replicas, models
        self.headers = {"Authorization": f"Bearer {api.api_key}"}

    def chat(self, model, body, timeout=30, **kwargs):
        return httpx.post(f"{self.server.url}/v1/chat/completions", headers=self.headers,
                          json={"model": model, **body}, timeout=timeout, **kwargs)

    def status(self):
        return dspark_status(self.server, self.api.api_key)

    def routing(self):
        return self.status()["routing"]

    def wait_idle(self, timeout_s=20):
        def idle():
            routing = self.routing()
            return routing if routing["in_flight_total"] == 0 else None

        routing = wait_for(idle, timeout_s, "in-flight counts to return to zero", interval_s=0.2)
        assert all(v["in_flight"] >= 0 for v in routing["in_flight"].values()), routing["in_flight"]
        assert routing["unmatched_releases"] == 0
        return routing


@pytest.fixture(scope="module")
def stack(start_server, tmp_path_factory):
    base = tmp_path_factory.mktemp("routing")
    replicas = {name: StandInReplica(name, base_s=0.05).start() for name in ("json-a", "json-b", "general")}
    quiet = [StandInReplica(f"quiet-{n}", base_s=0.2).start() for n in ("a", "b")]  # they go silent
    policies = base / "policies"
    policies.mkdir()
    (policies / "routing.yaml").write_text(f"proxy:\n  silence_timeout_s: {SILENCE_S}\n")
    server = start_server(extra_args=["--dspark-policy-dir", str(policies)])
    api = admin_api(server)
    worker, row = join_listening_cpu_worker(server, api, "route-w1", base / "w1")
    ensure_stand_in_backend(api)
    models = {
        "json-m": create_stand_in_model(api, "json-m", backend.BACKEND_NAME, backend.CPU_VERSION, row["cluster_id"],
                                        row, [replicas["json-a"].port, replicas["json-b"].port], base / "json-m"),
        "gen-m": create_stand_in_model(api, "gen-m", STAND_IN_BACKEND, STAND_IN_VERSION, row["cluster_id"],
                                       row, [replicas["general"].port], base / "gen-m"),
        "quiet-m": create_stand_in_model(api, "quiet-m", backend.BACKEND_NAME, backend.CPU_VERSION, row["cluster_id"],
                                         row, [r.port for r in quiet], base / "quiet-m"),
    }
    api.post("/v2/model-routes", {"name": "mixed", "targets": [
        {"model_id": models["json-m"]["id"], "weight": 0}, {"model_id": models["gen-m"]["id"], "weight": 0}]})
    keeper = RunningStateKeeper(admin_api(server), row).start()
    for model in models.values():
        keeper.watch(model["id"])
    st = Stack(server, api, worker, replicas, models)
    st.row, st.keeper, st.base, st.quiet = row, keeper, base, quiet
    for name in ("json-m", "gen-m", "mixed", "quiet-m"):
        wait_routable(server.url, api.api_key, name, 180)
    yield st
    keeper.stop()
    worker.stop()
    api.close()
    for replica in (*replicas.values(), *quiet):
        replica.stop()


def _reset(stack):
    for replica in stack.replicas.values():
        replica.slowdown, replica.capacity, replica.stall_s, replica.break_stream_after = 1.0, None, 0.0, None
        replica.stats.reset()


def test_status_reports_routing_on(stack):
    status = stack.status()
    assert status["features"]["routing"]["state"] == "enabled"
    assert status["features"]["routing"]["detail"]["hooks"] == [
        "expected_finish_time", "slow_start", "json_intent", "affinity", "json_aware_targets", "stream_end_event",
        "retry_once", "replica_status", "silence_timeout"]
    assert status["routing"]["balance"] == "expected_finish_time"
    assert status["routing"]["affinity"]["active"] and status["routing"]["gc"]["freeze"]  # the shipped defaults
    assert status["routing"]["policy"]["json_only_without_json_intent"] == "serve_as_json"


def test_json_requests_land_only_on_json_targets(stack):
    _reset(stack)
    before = stack.routing()["decisions"]
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: stack.chat("mixed", JSON_BODY if i % 2 else PLAIN_BODY), range(40)))
    assert [a.status_code for a in answers] == [200] * 40
    json_a, json_b, general = (stack.replicas[n].stats for n in ("json-a", "json-b", "general"))
    # Which JSON target takes each is the balance's business (expected finish time on speeds
    # learned so far: one may take all 20), tested below; here only that none lands elsewhere.
    assert json_a.served + json_b.served == 20 and json_a.json_requests + json_b.json_requests == 20
    assert general.served == 20 and general.json_requests == 0
    after = stack.routing()["decisions"]
    assert after["json"] - before["json"] == 20 and after["general"] - before["general"] == 20
    # A JSON-only model serves a request without JSON intent (policy serve_as_json).
    assert stack.chat("json-m", PLAIN_BODY).status_code == 200
    assert stack.routing()["decisions"]["json_only"] >= 1
    stack.wait_idle()


PRICE_FORMAT = {"type": "json_schema", "json_schema": {"name": "price", "schema": {
    "type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]}}}


def test_the_format_check_judges_multiple_of_exactly_through_the_proxy(stack):
    """A reply with 37.3 for `multipleOf: 0.01` (a binary-float non-multiple) counts as ok,
    37.305 as a schema mismatch, streamed and not, through GPUStack's real proxy."""
    before = stack.routing()["json_format_checks"]

    def counted():
        now = stack.routing()["json_format_checks"]
        return now if now["ok"] - before["ok"] == 2 and now["schema_mismatch"] > before["schema_mismatch"] else None

    try:
        for content, stream in (('{"price": 37.3}', False), ('{"price": 37.3}', True), ('{"price": 37.305}', False)):
            for name in ("json-a", "json-b"):
                stack.replicas[name].reply_content = content
            answer = stack.chat("json-m", {**JSON_BODY, "response_format": PRICE_FORMAT, "stream": stream})
            assert answer.status_code == 200, answer.text  # the proxy's check counts, it never withholds
    finally:
        for name in ("json-a", "json-b"):
            stack.replicas[name].reply_content = None
    after = wait_for(counted, 10, "the format check to count the three replies", interval_s=0.2)
    assert after["schema_mismatch"] - before["schema_mismatch"] == 1
    assert after["not_json"] == before["not_json"]
    stack.wait_idle()


def _instance_of(stack, replica_name):
    port = stack.replicas[replica_name].port
    return next(str(i["id"]) for i in instances_of(stack.api, stack.models["json-m"]["id"]) if i["ports"] == [port])


def test_expected_finish_time_sends_long_requests_to_the_fast_replica(stack):
    _reset(stack)
    slow, fast = stack.replicas["json-a"], stack.replicas["json-b"]
    slow.slowdown = 3.0  # json-a is 3x slower
    # Delays long enough that the proxy's own CPU time (large on this 2-core machine)
    # does not hide the replicas' speeds.
    slow.base_s = fast.base_s = 0.4
    try:
        # Learn both speeds (earlier tests left estimates of 0.05 s replies): rounds of four
        # concurrent requests, so both replicas keep getting some.
        def estimates():
            rows = stack.routing()["in_flight"]
            return tuple(rows[_instance_of(stack, n)]["seconds_per_token"] or 0 for n in ("json-a", "json-b"))

        with ThreadPoolExecutor(4) as pool:
            for _ in range(10):
                assert [a.status_code for a in pool.map(lambda i: stack.chat("json-m", JSON_BODY), range(4))] == [200] * 4
                slow_est, fast_est = estimates()
                if slow_est > 2 * fast_est:
                    break
        rows = stack.routing()["in_flight"]
        assert slow_est > 2 * fast_est, rows
        # Counts equal (nothing in flight): every long request goes to the fast replica.
        slow.stats.reset()
        fast.stats.reset()
        for _ in range(4):
            assert stack.chat("json-m", {**JSON_BODY, "metadata": {"work": 4}}).status_code == 200
        assert (fast.stats.served, slow.stats.served) == (4, 0)
        # Under concurrency the slow replica still serves, its share shrunk towards its speed.
        slow.stats.reset()
        fast.stats.reset()
        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(lambda i: stack.chat("json-m", JSON_BODY), range(30)))
        assert [a.status_code for a in answers] == [200] * 30
        assert fast.stats.served >= 2 * slow.stats.served and slow.stats.served >= 1, (fast.stats.served,
                                                                                       slow.stats.served)
    finally:
        slow.base_s = fast.base_s = 0.05
    stack.wait_idle()


def test_a_freshly_warm_replica_ramps_in_instead_of_taking_the_burst(stack):
    api = stack.api
    ramp = [StandInReplica(f"ramp-{i}", base_s=1.0).start() for i in range(3)]
    stop, loaders, model = threading.Event(), [], None
    try:
        model = create_stand_in_model(api, "ramp-m", backend.BACKEND_NAME, backend.CPU_VERSION,
                                      stack.row["cluster_id"], stack.row, [r.port for r in ramp],
                                      stack.base / "ramp-m", running=2)
        stack.keeper.watch(model["id"])
        wait_routable(stack.server.url, stack.api.api_key, "ramp-m", 120)
        body = {"model": "ramp-m", **JSON_BODY}

        def steady():
            with httpx.Client(timeout=60) as client:
                while not stop.is_set():
                    client.post(f"{stack.server.url}/v1/chat/completions", headers=stack.headers, json=body)

        loaders = [threading.Thread(target=steady, daemon=True) for _ in range(6)]
        for t in loaders:
            t.start()
        wait_for(lambda: all(r.stats.in_flight >= 2 for r in ramp[:2]), 30, "steady load on the two replicas")
        for r in ramp:
            r.stats.reset()
        newcomer = instances_of(api, model["id"])[2]
        set_running(api, newcomer, stack.row, ramp[2].port)
        stack.keeper.watch(model["id"])
        wait_for(lambda: str(newcomer["id"]) in stack.routing()["slow_start"]["ramping"], 30,
                 "the proxy to see the new replica RUNNING")
        with ThreadPoolExecutor(12) as pool:  # a burst right after it turned warm
            answers = list(pool.map(lambda i: stack.chat("ramp-m", JSON_BODY), range(12)))
        assert [a.status_code for a in answers] == [200] * 12
        got = [r.stats.served + r.stats.in_flight for r in ramp]
        ramping = stack.routing()["slow_start"]["ramping"][str(newcomer["id"])]
        # Least-connections alone would give the newcomer (0 in flight) more than either
        # other replica; slow start gives it a small share that grows over ramp_s.
        assert got[2] <= 0.35 * (got[0] + got[1]) / 2, got
        assert 0.1 <= ramping["weight"] < 0.7 and ramping["ramp_left_s"] > 0, ramping

        def weight_now():
            entry = stack.routing()["slow_start"]["ramping"].get(str(newcomer["id"]))
            return entry["weight"] if entry else 1.0

        wait_for(lambda: weight_now() > ramping["weight"] + 0.1, 20, "the newcomer's weight to grow")
        # Ramped in, not starved: the steady load reaches it as its weight grows.
        wait_for(lambda: ramp[2].stats.served >= 3, 40, "the newcomer to serve the steady load")
    finally:
        stop.set()
        for t in loaders:
            t.join(timeout=60)
        for r in ramp:
            r.stop()
        if model is not None:
            api.client.delete(f"/v2/models/{model['id']}")
    stack.wait_idle(30)


def test_streams_count_until_their_last_byte(stack):
    _reset(stack)
    for replica in stack.replicas.values():
        replica.base_s, replica.chunks = 1.0, 5
    try:
        with httpx.stream("POST", f"{stack.server.url}/v1/chat/completions", headers=stack.headers,
                          json={"model": "json-m", "stream": True, **JSON_BODY}, timeout=30) as response:
            lines = response.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            assert stack.routing()["in_flight_total"] == 1  # mid-stream, still counted
            rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        stack.wait_idle(5)
    finally:
        for replica in stack.replicas.values():
            replica.base_s = 0.05


def test_client_disconnect_mid_stream_releases(stack):
    _reset(stack)
    for replica in stack.replicas.values():
        replica.base_s, replica.chunks = 10.0, 10
    busy = lambda: sum(r.stats.in_flight for r in stack.replicas.values())  # noqa: E731
    try:
        started = time.monotonic()
        with httpx.stream("POST", f"{stack.server.url}/v1/chat/completions", headers=stack.headers,
                          json={"model": "json-m", "stream": True, **JSON_BODY}, timeout=30) as response:
            wait_for(busy, 5, "the replica to be streaming", interval_s=0.05)
            assert stack.routing()["in_flight_total"] == 1
            first = next(line for line in response.iter_lines() if line.startswith("data:"))
            first_after = time.monotonic() - started
        # Closed after one chunk of ten: the count drops while the replica is still busy.
        stack.wait_idle(5)
        assert first_after < 5, (first_after, first)
    finally:
        for replica in stack.replicas.values():
            replica.base_s, replica.chunks = 0.05, 5


def test_broken_stream_ends_with_an_error_event_not_a_hang(stack):
    _reset(stack)
    for replica in stack.replicas.values():
        replica.break_stream_after = 2
    started = time.monotonic()
    try:
        response = stack.chat("json-m", {"stream": True, **JSON_BODY}, timeout=30)
    finally:
        for replica in stack.replicas.values():
            replica.break_stream_after = None
    assert time.monotonic() - started < 15
    events = [line for line in response.text.splitlines() if line.startswith("data:")]
    assert len(events) >= 2 and '"error"' in events[-1], response.text[-500:]
    stack.wait_idle(5)


def test_client_timeout_and_slow_upstream_release(stack):
    _reset(stack)
    for replica in stack.replicas.values():
        replica.stall_s = 2.0
    try:
        with pytest.raises(httpx.ReadTimeout):
            stack.chat("json-m", JSON_BODY, timeout=0.5)
        # The replica is still working on it: the count stays until it answers, then drops.
        assert stack.routing()["in_flight_total"] == 1
    finally:
        for replica in stack.replicas.values():
            replica.stall_s = 0.0
    stack.wait_idle(10)


def test_upstream_error_releases(stack):
    _reset(stack)
    missing = stack.chat("no-such-model", JSON_BODY)
    assert missing.status_code == 404
    broken = stack.chat("json-m", {"messages": "not a list", "response_format": {"type": "json_object"},
                                   "metadata": {"work": "not-a-number"}})
    assert broken.status_code >= 500  # the replica failed on the request
    stack.wait_idle(5)


def test_prometheus_metrics_on_gpustack_exporter(stack):
    text = httpx.get(f"http://127.0.0.1:{stack.server.metrics_port}/metrics", timeout=10).text
    assert "dspark_routing_in_flight_requests{" in text
    assert 'dspark_routing_decisions_total{decision="json"}' in text
    assert 'dspark_routing_retries_total{outcome="retried"}' in text


def _route(api, name):
    return next(r for r in api.items("/v2/model-routes") if r["name"] == name)


def test_gateway_route_config_for_dspark_routes(stack):
    api = stack.api

    def configured():
        route = api.get(f"/v2/model-routes/{_route(api, 'json-m')['id']}")
        plugins = route.get("plugins") or {}
        ok = plugins.get("least-load", {}).get("enabled") and not plugins.get("session-affinity", {}).get("enabled")
        return route if ok else None

    route = wait_for(configured, 40, "least-load on and session affinity off on the DSpark route")
    assert route["lb_mode"] == "scoring"
    assert "dspark-routing" not in (route.get("meta") or {})  # our marker is plugin-owned, hidden
    # Not a DSpark route: left as GPUStack made it.
    general = api.get(f"/v2/model-routes/{_route(api, 'gen-m')['id']}")
    assert not (general.get("plugins") or {}).get("least-load")
    # Idempotent: later passes change nothing; a user turning affinity back on is respected.
    passes = stack.routing()["gateway"]["passes"]
    changed = len(stack.routing()["gateway"]["changed_routes"])
    response = api.client.put(f"/v2/model-routes/{route['id']}", json={
        "name": route["name"], "plugins": {"session-affinity": {"enabled": True,
                                                                "sessionKeys": [{"header": "session-id"}]}}})
    assert response.status_code == 200, response.text
    wait_for(lambda: stack.routing()["gateway"]["passes"] >= passes + 2, 40, "two more sync passes")
    assert len(stack.routing()["gateway"]["changed_routes"]) == changed
    again = api.get(f"/v2/model-routes/{route['id']}")
    assert again["plugins"]["session-affinity"]["enabled"] and again["plugins"]["least-load"]["enabled"]


def test_a_killed_replica_loses_no_request_streamed_or_not(stack):
    _reset(stack)
    before = stack.routing()["retries"]["retried"]
    stack.replicas["json-b"].stop()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda i: stack.chat("json-m", {**JSON_BODY, "stream": i % 2 == 0}), range(20)))
    assert [a.status_code for a in answers] == [200] * 20, [a.text[:200] for a in answers if a.status_code != 200]
    # A stream whose replica received nothing went to the other one too, and ended properly.
    streams = [a.text for i, a in enumerate(answers) if i % 2 == 0]
    assert all(text.rstrip().endswith("data: [DONE]") for text in streams), streams[:2]
    assert stack.replicas["json-a"].stats.served == 20
    assert stack.routing()["retries"]["retried"] > before
    stack.wait_idle(5)


# How long a try may wait on a silent replica (routing/silence.py): twice the timeout (the replica
# may have answered another request just before it went silent), then its health check (bounded
# by min(5 s, the timeout)), plus 3 s for the server's event loop on this loaded 2-core machine.
GIVE_UP_BOUND_S = 2 * SILENCE_S + min(5, SILENCE_S) + 3


def _quiet_request(stack, streamed, i=0, timeout=60):
    started = time.monotonic()
    response = stack.chat("quiet-m", {"max_tokens": 16, "stream": streamed,
                                      "messages": [{"role": "user", "content": f"Create an order record {i}."}]},
                          timeout=timeout)
    return response, time.monotonic() - started


def test_a_silent_replica_is_given_up_and_a_slow_one_that_answers_is_not(stack):
    """`proxy.silence_timeout_s: 3`, two stand-ins. A replica slower than that, but answering
    its health check, keeps its requests (streamed or not: 200, whole). A frozen one (its port
    accepts, nothing is answered, nothing is closed) is given up within the bound: its requests
    go to the other replica, streamed or not. A stream whose replica freezes mid-way ends with
    the error event. With both frozen, a 504 that says why, streamed or not."""
    a, b = stack.quiet
    start = stack.routing()["silence"]
    assert start["timeout_s"] == SILENCE_S
    # Slow: first bytes after 2x the timeout (one chunk per stream, so its first byte is late too).
    for replica in (a, b):
        replica.stall_s, replica.chunks = 2 * SILENCE_S, 1
    try:
        with ThreadPoolExecutor(2) as pool:
            (plain, _), (streamed, _) = pool.map(lambda s: _quiet_request(stack, s), (False, True))
    finally:
        for replica in (a, b):
            replica.stall_s, replica.chunks = 0.0, 5
    assert plain.status_code == 200 and plain.json()["choices"][0]["message"]["content"], plain.text[:300]
    assert streamed.status_code == 200 and streamed.text.rstrip().endswith("data: [DONE]"), streamed.text[-300:]
    kept = stack.routing()["silence"]
    assert kept["alive"] >= start["alive"] + 2 and kept["given_up"] == start["given_up"], kept
    assert kept["longest_kept_wait_s"] >= 2 * SILENCE_S, kept

    # One frozen, the one the balancer prefers now (so requests do reach it): every request
    # answered by the other, none waiting past the bound on the frozen one.
    served = [r.stats.served for r in (a, b)]
    _quiet_request(stack, False)
    frozen, other = (a, b) if a.stats.served > served[0] else (b, a)
    frozen.freeze()
    with ThreadPoolExecutor(6) as pool:
        answers = list(pool.map(lambda i: _quiet_request(stack, i % 2 == 0, i), range(6)))
    assert [r.status_code for r, _ in answers] == [200] * 6, [r.text[:200] for r, _ in answers]
    assert all(r.text.rstrip().endswith("data: [DONE]") for i, (r, _) in enumerate(answers) if i % 2 == 0)
    given_up = stack.routing()["silence"]
    assert given_up["given_up"] > kept["given_up"], given_up  # some went to the frozen one first
    assert given_up["longest_given_up_wait_s"] <= GIVE_UP_BOUND_S, given_up

    # Mid-stream: the other streams one event a second; it freezes after the first.
    other.base_s = 5.0
    events, frozen_at = [], None
    with httpx.stream("POST", f"{stack.server.url}/v1/chat/completions", headers=stack.headers,
                      json={"model": "quiet-m", "max_tokens": 16, "stream": True,
                            "messages": [{"role": "user", "content": "Create an order record."}]},
                      timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data:"):
                events.append(line)
                if frozen_at is None:
                    other.freeze()
                    frozen_at = time.monotonic()
    ended_after = time.monotonic() - frozen_at
    assert response.status_code == 200 and len(events) >= 2, events
    assert '"error"' in events[-1] and "sent nothing for" in events[-1], events[-1]
    assert ended_after <= GIVE_UP_BOUND_S, ended_after

    # Both frozen: nowhere to go; a 504 that says why, within two give-ups.
    with ThreadPoolExecutor(2) as pool:
        (plain, plain_s), (streamed, streamed_s) = pool.map(lambda s: _quiet_request(stack, s), (False, True))
    for response, seconds in ((plain, plain_s), (streamed, streamed_s)):
        assert response.status_code == 504, response.text[:300]
        assert "sent nothing for" in response.text and "failed its health check" in response.text, response.text
        assert seconds <= 2 * GIVE_UP_BOUND_S, seconds
    routing = stack.wait_idle(30)
    assert routing["retries"]["silent_given_up"] == routing["silence"]["given_up"] > given_up["given_up"]
