"""Routing to real DSpark replicas: GPUStack's `/v1` proxy -> real CPU worker -> two real
`dspark-serve` processes (real vLLM on CPU). The instances are pointed at the replicas by
hand (no container runtime here to let GPUStack's worker start them; the end-to-end issue
does that with Podman), everything on the request path is real.

The soak adds a second model over three replicas: two stand-ins for vLLM with a realistic
latency (tests/support/stand_in_replica.py) and one of the real replicas (it also serves that
model's name). The server runs the shipped routing policy (`proxy.silence_timeout_s` 15 s)."""

import asyncio
import gc
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, List

import httpx
import pytest

from gpustack_dspark.devstack.replica import SERVED_NAME
from gpustack_dspark.routing import speed
from tests.conftest import dspark_status, wait_for
from tests.integration.shared_stack import SOAK_MODEL
from tests.support.stand_in_instances import instances_of
from tests.support.stand_in_replica import StandInReplica

pytestmark = pytest.mark.integration


# The shipped proxy.silence_timeout_s. Not shorter here: at 3 s and at 5 s, with the machine
# also running other engineers' vLLM, the saturated real CPU replica (in-process engine: a long
# step holds back its /health too) and then the stand-ins were given up with requests on them,
# and retried requests got 504s. The short timeouts are tested on idle stand-ins (test_routing.py).
SILENCE_S = 15
# How long a try may wait on a silent replica (routing/silence.py): twice the timeout (the replica
# may have answered another request just before it went silent), then its health check (5 s),
# plus 15 s for the server's event loop, late under the soak on this loaded 2-core machine
# (measured: 37.2 s in one stream, 45 s beside the other pytest worker; the logic's bound is
# 35 s), still well inside the requests' own 120 s.
GIVE_UP_BOUND_S = 2 * SILENCE_S + 5 + 15


TABLES_BEFORE: dict = {}


@pytest.fixture(scope="module")
def stack(shared_stack, tmp_path_factory):
    base = tmp_path_factory.mktemp("routing-dspark")
    stand_ins = [StandInReplica(f"soak-{n}", base_s=1.0, capacity=200).start() for n in ("a", "b")]
    for r in stand_ins:
        r.tokens_per_work = 48  # answers about as long as the real replica's order records
    try:
        server, api = shared_stack.up()
        replicas = shared_stack.replicas()  # they serve SOAK_MODEL too (--served-model-name)
        # The shared server kept the proxy's per-instance entries of the modules before this one
        # (instances of deleted models, idle, pruned past 512): the soak counts its own on top.
        TABLES_BEFORE.update(dspark_status(server, api.api_key)["routing"]["tables"])
        with shared_stack.models_on(base, {SERVED_NAME: ([r.port for r in replicas], 180),
                                           SOAK_MODEL: ([*(r.port for r in stand_ins), replicas[0].port], 180)}):
            yield server, api, replicas, stand_ins
    finally:
        for r in stand_ins:
            r.stop()




def test_json_through_gpustack_reaches_both_real_replicas_least_connections(stack):
    server, api, replicas, _ = stack
    headers = {"Authorization": f"Bearer {api.api_key}"}

    def one(i):
        return httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120, json={
            "model": SERVED_NAME, "max_tokens": 128, "temperature": 0,
            "messages": [{"role": "user", "content": f"Create an order record for user {200 + i}: buy {i + 1.5}."}]})

    # A replica that GPUStack's proxy saw fail once (or missed at the model's first choice) ramps
    # in from a tenth of a share for `slow_start.ramp_s` (30 s), by design; a burst then goes to
    # the other one ([0, 16] in CI). This test is about least connections between warm equals:
    # it starts once no replica is ramping (a choice starts a pending ramp: requests first).
    # Expected finish time compares the replicas' seconds-per-token estimates. [3, 13] in CI and
    # [0, 16] in a rerun: one replica's estimate came from one slow first answer (a new batch
    # shape on CPU: 0.021 against 0.0022 s/token), which routing/speed.py now clips to 2x; even
    # clipped, that replica gets about a third of a burst (seen: [13, 3]). So the priming sends
    # waves of four (the first two on each: no estimates yet, least connections) until both
    # estimates are within the band the balance treats as equal (at most five waves).
    model_id = next(m["id"] for m in api.items("/v2/models") if m["name"] == SERVED_NAME)
    port_to_replica = {r.port: n for n, r in enumerate(replicas)}
    instance_to_replica = {str(i["id"]): port_to_replica[i["ports"][0]] for i in instances_of(api, model_id)}

    def estimates(routing=None):
        """Seconds per token by replica (None: no estimate yet), from the proxy's status."""
        rows = (routing or dspark_status(server, api.api_key)["routing"])["in_flight"]
        out = [None] * len(replicas)
        for instance_id, row in rows.items():
            if instance_id in instance_to_replica and row.get("seconds_per_token"):
                out[instance_to_replica[instance_id]] = row["seconds_per_token"]
        return out

    def equal(values):
        return None not in values and max(values) <= speed.SAME_SPEED_BAND * min(values)

    for wave in range(5):
        with ThreadPoolExecutor(4) as pool:
            primed = list(pool.map(one, range(-4 * (wave + 1), -4 * wave)))
        assert [r.status_code for r in primed] == [200] * 4, [r.text[:200] for r in primed]
        if equal(estimates()):
            break
    # A burst is between warm equals only when no instance started ramping during it (GPUStack
    # listed it not RUNNING for a moment, or it received nothing and the proxy retried
    # elsewhere: CI saw [16, 0] with a ramp started 0.6 s before the end), and both estimates
    # were within the band before and after it (CI saw [3, 13] from a clean burst whose
    # estimates had drifted apart: the faster replica rightly took more). Other bursts are run
    # again (at most three). Between equals each replica takes at least 4 of 16; if no burst
    # was between equals, the last clean one must follow the rule: both take part, and the
    # replica with the lower estimate before and after it takes at least as many as the other.
    def routing_once_no_ramp():
        routing = dspark_status(server, api.api_key)["routing"]
        return None if routing["slow_start"]["ramping"] else routing

    bursts = []
    for attempt in range(3):
        routing = wait_for(routing_once_no_ramp, 60, "no instance ramping in (slow start)")
        ramps, retries, est_before = routing["slow_start"]["ramps_started"], dict(routing["retries"]), estimates(routing)
        before = [r.info()["requests"]["json_injected"] for r in replicas]

        # All 16 in flight at once: the split is the balance's choice on the in-flight counts
        # (seconds pass before the first answer). Four at a time made it the replicas' speed of
        # the moment instead (the one that answers first gets the next): CI saw [13, 3] between
        # equals while the other pytest worker loaded the two cores.
        with ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(one, range(16 * attempt, 16 * (attempt + 1))))
        assert [r.status_code for r in responses] == [200] * 16
        for r in responses:  # no response_format: the replicas made it JSON
            json.loads(r.json()["choices"][0]["message"]["content"])
            assert r.json()["usage"]["dspark_stats"]["drafted_tokens"] >= 0
        served = [r.info()["requests"]["json_injected"] - b for r, b in zip(replicas, before)]
        routing = dspark_status(server, api.api_key)["routing"]
        assert sum(served) == 16, served
        clean = routing["slow_start"]["ramps_started"] == ramps and routing["retries"] == retries
        est_after = estimates(routing)
        bursts.append({"served": served, "clean": clean, "estimates": (est_before, est_after),
                       "retries": routing["retries"], "slow_start": routing["slow_start"]})
        print(f"[fair share] burst {attempt + 1}: {bursts[-1]}")
        if clean and equal(est_before) and equal(est_after):
            # both replicas took a fair share
            assert min(served) >= 4, bursts
            break
    else:
        clean_bursts = [b for b in bursts if b["clean"]]
        assert clean_bursts, f"every burst saw an instance start ramping or a retry: {bursts}"
        last = clean_bursts[-1]
        assert min(last["served"]) >= 1, bursts
        # "Faster" only where the balance sees a difference: estimates within the band are equal
        # to it (CI saw [6, 10] where the one taking 6 was "faster" by 0.4 % before the burst).
        faster = [None if equal(est) else min(range(len(replicas)), key=lambda n: est[n] or float("inf"))
                  for est in last["estimates"]]
        if equal(last["estimates"][0]):  # it began between equals: least connections, a fair share
            assert min(last["served"]) >= 4, bursts
        elif faster[0] == faster[1]:  # faster before and after the burst: it took at least as many
            assert last["served"][faster[0]] >= max(last["served"]), bursts
    assert routing["in_flight_total"] == 0 and routing["unmatched_releases"] == 0


def _replica_counters(replica):
    """(requests finished, prefix-cache hits, prefix-cache queries, grammar compiles, grammar
    reuses) from the replica's own /metrics (vLLM's counters and the drafting layer's)."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {"vllm:e2e_request_latency_seconds_count": 0, "vllm:prefix_cache_hits_total": 1,
              "vllm:prefix_cache_queries_total": 2, "dspark_grammar_compiles_total": 3,
              "dspark_grammar_reuses_total": 4}
    out = [0.0] * 5
    text = httpx.get(f"{replica.base_url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted:
                out[wanted[sample.name]] += sample.value
    return out


def test_requests_sharing_a_schema_and_prefix_stay_on_one_replica_until_its_bound_then_spill(stack):
    """Affinity (the shipped policy: on, load bound 1.5): one schema and one long system prompt,
    sent one after another, all land on one real replica, whose vLLM prefix cache then finds the
    prompt (hits grow) and whose grammar is compiled once; a burst of the same request spills to
    the other replica past the bound instead of piling onto the first. Every request here is
    keyed; the other tests' requests (short prompts, no schema) are not, and are balanced as before."""
    server, api, replicas, _ = stack
    headers = {"Authorization": f"Bearer {api.api_key}"}
    tag = f"t{time.time_ns()}"  # a schema and a prompt no earlier request had
    system = (f"You write order records ({tag}). Each record has an id, a user and a list of items; "
              "prices are numbers, quantities whole numbers. ") * 8  # ~1 KB: four whole 256-byte blocks
    # an id of at least 64 characters: each reply takes seconds, so the burst's twelve are in
    # flight together (with a short id some answered before the last were sent: no bound reached)
    schema = {"type": "object", "title": tag, "properties": {"order_id": {"type": "string", "minLength": 64,
                                                                          "maxLength": 96},
                                                             "total": {"type": "number"}},
              "required": ["order_id", "total"], "additionalProperties": False}

    def one(i):
        return httpx.post(f"{server.url}/v1/chat/completions", headers=headers, timeout=120, json={
            "model": SERVED_NAME, "max_tokens": 160, "temperature": 0,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": f"Order {i}."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "order", "schema": schema}}})

    wait_for(lambda: not dspark_status(server, api.api_key)["routing"]["slow_start"]["ramping"], 60,
             "no instance ramping in (slow start)")
    before = [_replica_counters(r) for r in replicas]
    outcomes_before = dspark_status(server, api.api_key)["routing"]["affinity"]["outcomes"]
    for i in range(6):
        r = one(i)
        assert r.status_code == 200, r.text[:300]
        json.loads(r.json()["choices"][0]["message"]["content"])
    after = [_replica_counters(r) for r in replicas]
    served = [a[0] - b[0] for a, b in zip(after, before)]
    assert sorted(served) == [0, 6], served  # one replica took them all
    home = served.index(6)
    hits, queries = after[home][1] - before[home][1], after[home][2] - before[home][2]
    # Requests 2-6 find the system prompt's blocks cached (vLLM caches whole 16-token blocks).
    assert queries > 0 and hits >= 0.5 * queries * 5 / 6, (hits, queries)
    compiles, reuses = after[home][3] - before[home][3], after[home][4] - before[home][4]
    assert (compiles, reuses) == (1, 5), (compiles, reuses)
    affinity = dspark_status(server, api.api_key)["routing"]["affinity"]
    assert affinity["active"] and affinity["outcomes"]["home"] - outcomes_before["home"] == 6, affinity

    # 12 at once: the home's bound is 1.5x its share of all in flight (equal shares once both
    # are warm: slow-start weights, not speed) or two standard deviations of a balanced count,
    # at most 11 of 12, and the other replica takes a request (and the key) once its level, the
    # in-flight averaged over recent choices, stays within its share / 1.5 while the home's
    # passes its share (about the burst's eighth request), so the burst spills.
    # Sent together: twelve threads started one by one on a loaded machine sent the burst over
    # long enough that the first replies were back before the last were sent (a clean-clone CI
    # run: 12 of 12 at home, no spill).
    gate = threading.Barrier(12)

    def together(i):
        gate.wait(timeout=60)
        return one(i)

    with ThreadPoolExecutor(12) as pool:
        burst = list(pool.map(together, range(100, 112)))
    assert [r.status_code for r in burst] == [200] * 12, [r.text[:200] for r in burst]
    final = [_replica_counters(r) for r in replicas]
    took = [f[0] - a[0] for f, a in zip(final, after)]
    routing = _routing_once_idle(server, api, "after the affinity burst")
    # home to its bound (or the other below its floor), the rest spilled
    assert sum(took) == 12 and min(took) >= 1, (took, routing["affinity"], routing["in_flight"])
    outcomes = routing["affinity"]["outcomes"]
    assert outcomes["spilled"] - outcomes_before["spilled"] >= 1, routing["affinity"]
    # The other replica compiled the grammar for its first spilled request only.
    assert final[1 - home][3] - after[1 - home][3] == 1
    # The status shows it per replica (the console's sampler, every 5 s): keys, hit rate, compiles.
    # Where the key lives at the end (its home, or the replica it settled on after a spill) is
    # the ledger's choice: the deployment's replicas together show the key, the prefix hits and
    # both compiles, each replica its own figures.
    seen: List[Any] = []

    def shown():
        seen[:] = [dspark_status(server, api.api_key).get("replica_caches")]
        rows = list(((seen[0] or {}).get("deployments", {}).get(SERVED_NAME) or {}).values())
        return len(rows) == 2 and sum(c["keys"] or 0 for c in rows) >= 1 \
            and max(c["prefix_cache_hit_rate"] or 0 for c in rows) > 0 \
            and all((c["grammar_compiles"] or 0) >= 1 for c in rows)

    # 60 s: a dozen of the sampler's 5 s passes, room for a pass whose replica reads timed out
    # under the machine's load; the message shows what the status did hold.
    try:
        wait_for(shown, 60, "replica_caches in the status")
    except AssertionError as e:
        raise AssertionError(f"{e}; last replica_caches: {seen}") from None


def _server_rss_mib(server) -> float:
    """Resident memory of the GPUStack server's API process (the one that proxies)."""
    import psutil

    root = psutil.Process(server.process.pid)
    procs = [root, *root.children(recursive=True)]
    return sum(p.memory_info().rss for p in procs) / 2 ** 20


async def _soak_round(server, api_key, count):
    """`count` concurrent requests, every fourth streamed and every other one JSON.
    Returns [(streamed, status, text)]."""
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=count + 10, max_keepalive_connections=count + 10)
    # 120 s: far above any answer here (a round takes about 25 s); a request left waiting fails
    # the test at that point instead of at 300 s.
    async with httpx.AsyncClient(timeout=httpx.Timeout(120, connect=60), limits=limits) as client:
        async def one(i):
            streamed, json_intent = i % 4 == 0, i % 2 == 0
            body = {"model": SOAK_MODEL, "max_tokens": 96, "temperature": 0, "stream": streamed,
                    "messages": [{"role": "user", "content": f"Create an order record for user {i}: buy {i % 7 + 1}."}]}
            if json_intent:
                body["response_format"] = {"type": "json_object"}
            try:
                if streamed:
                    async with client.stream("POST", f"{server.url}/v1/chat/completions", headers=headers,
                                             json=body) as response:
                        text = "".join([part async for part in response.aiter_text()])
                        return True, response.status_code, text
                response = await client.post(f"{server.url}/v1/chat/completions", headers=headers, json=body)
                return False, response.status_code, response.text
            except httpx.HTTPError as e:
                return streamed, None, f"{type(e).__name__}: {e}"

        return await asyncio.gather(*(one(i) for i in range(count)))


def _freeze_when_busy(replica, in_flight, frozen_at, stop):
    """Freeze `replica` (silent, nothing closed) once it has `in_flight` requests in flight
    (mid-run, not at the end)."""
    while not stop.is_set():
        if replica.stats.in_flight >= in_flight:
            frozen_at.append((time.monotonic(), replica.stats.in_flight))
            replica.freeze()
            return
        time.sleep(0.005)


def _routing_once_idle(server, api, when):
    """The routing status once nothing is in flight (waits up to 120 s)."""
    return wait_for(lambda: (r := dspark_status(server, api.api_key)["routing"])["in_flight_total"] == 0 and r,
                    120, f"in-flight to return to 0 {when}")


def _stream_ended_well(text):
    events = [line for line in text.splitlines() if line.startswith("data:")]
    return bool(events) and (events[-1].strip() == "data: [DONE]" or '"error"' in events[-1])


def test_soak_1000_concurrent_requests_one_replica_killed_nothing_lost(stack):
    """1,000 concurrent requests through GPUStack's proxy to three replicas (two stand-ins,
    one real dspark-serve); the second round kills a stand-in mid-run, the hard way: it goes
    silent without closing a connection (a frozen process, a host gone from the network; CI
    once saw a stand-in killed the easy way leave 2 connections open, and their requests waited
    for the client's 300 s timeout). Non-streamed: every one answered 200 (a request whose
    replica died goes to another); streamed: every one ends with [DONE] or the error event; no
    try waited on the dead replica past twice the silence timeout and its health check; in-flight
    back to exactly 0; the server's memory back to its level after the first round; the routing
    tables bounded."""
    server, api, replicas, stand_ins = stack
    real_before = replicas[0].info()["requests"]["json_injected"]
    # First round: the proxy's connection pools, caches and estimates reach their working size.
    started = time.monotonic()
    first = asyncio.run(_soak_round(server, api.api_key, 1000))
    print(f"[soak] round 1: {time.monotonic() - started:.0f} s")
    gc.collect()
    idle = _routing_once_idle(server, api, "after the first round")
    print(f"[soak] after round 1: served by the stand-ins {[r.stats.served for r in stand_ins]}, "
          f"estimates {idle['in_flight']}")
    time.sleep(2)
    baseline = _server_rss_mib(server)
    killed_at, stop = [], threading.Event()
    # 20 in flight: mid-run even on a loaded machine (at 40 it was once never reached).
    killer = threading.Thread(target=_freeze_when_busy, args=(stand_ins[1], 20, killed_at, stop), daemon=True)
    killer.start()
    started = time.monotonic()
    second = asyncio.run(_soak_round(server, api.api_key, 1000))
    stop.set()
    killer.join(timeout=30)
    print(f"[soak] round 2: {time.monotonic() - started:.0f} s; stand-in frozen with {killed_at[0][1] if killed_at else 0} "
          f"in flight; served by the stand-ins {[r.stats.served for r in stand_ins]}")
    assert killed_at, "the replica was not frozen mid-run"
    for name, results in (("first", first), ("second", second)):
        plain = [(status, text[:200]) for streamed, status, text in results if not streamed and status != 200]
        assert not plain, (name, len(plain), plain[:5])
        streams = [(status, text[-300:]) for streamed, status, text in results if streamed]
        bad = [s for s in streams if s[0] != 200 or not _stream_ended_well(s[1])]
        assert not bad, (name, len(bad), bad[:5])
    routing = _routing_once_idle(server, api, "after the soak")
    assert routing["unmatched_releases"] == 0
    assert routing["retries"]["retried"] > idle["retries"]["retried"], routing["retries"]  # the kill was absorbed
    # Its tries were given up (not left waiting), none later than the timeout and its check.
    silence = routing["silence"]
    print(f"[soak] silence: {silence}")
    assert silence["timeout_s"] == SILENCE_S
    assert silence["given_up"] > idle["silence"]["given_up"], silence
    # From each given-up try's last sign of life: the shared platform's server also carries the
    # earlier modules' tries, and a landing run gave up two there after 936 s of waiting on a
    # slow real-model replica that was checked alive throughout and then stopped at its module's end.
    assert silence["longest_given_up_silence_s"] <= GIVE_UP_BOUND_S, silence
    assert all(v["in_flight"] == 0 for v in routing["in_flight"].values()), routing["in_flight"]
    own = {k: v - TABLES_BEFORE.get(k, 0) for k, v in routing["tables"].items()}
    assert max(own.values()) <= 8, (routing["tables"], TABLES_BEFORE)  # per instance, not per request
    # GPUStack's shared worker row was copied for the proxy (not one failed copy).
    assert routing["worker_row_copies"]["copied"] >= 1 and routing["worker_row_copies"]["failed"] == 0, routing
    assert replicas[0].info()["requests"]["json_injected"] > real_before  # the real replica took part
    time.sleep(2)
    after = _server_rss_mib(server)
    print(f"[soak] server RSS after round 1 {baseline:.0f} MiB, after round 2 {after:.0f} MiB; "
          f"retried {routing['retries']['retried']}, broken streams {routing['retries']['broken_streams']}")
    assert after - baseline < 0.1 * baseline + 20, (baseline, after)
