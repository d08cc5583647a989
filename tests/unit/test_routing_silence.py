"""`routing/silence.py`: a try whose replica went silent is checked, kept while its replica
answers its health check, and given up (its wait cancelled) when it does not; one check per
instance at a time; the health check's verdict; the policy knob's errors."""

import asyncio

import pytest

from gpustack_dspark.routing.policy import PolicyError, parse_policy
from gpustack_dspark.routing.silence import Liveness, ReplicaSilent, SilenceWatch, health_verdict

WORKER_UNREACHABLE = (b'{"error": {"message": "An unexpected error occurred: Cannot connect to host '
                      b'127.0.0.1:8001 ssl:default [Connect call failed]", "code": 503}}')


def test_the_health_check_is_alive_only_when_the_replica_itself_answers():
    assert health_verdict(200, None) == (True, "")
    assert health_verdict(404, b'{"detail": "Not Found"}') == (True, "")  # a replica without /health is up
    alive, why = health_verdict(503, WORKER_UNREACHABLE)
    assert not alive and why.startswith("HTTP 503: ") and "Cannot connect to host" in why
    assert health_verdict(404, b'{"message": "No running model instance found for model name: 7"}')[0] is False
    assert health_verdict(504, b'{"message": "Upstream http://x/health sent no response data within 300s"}')[0] is False
    assert health_verdict(500, b'{"error": {"message": "engine dead"}}') == (False, 'HTTP 500: {"error": {"message": "engine dead"}}')


def _watch(silence_s, verdicts, checks):
    async def alive():
        checks.append("checked")
        return verdicts.pop(0) if len(verdicts) > 1 else verdicts[0]

    return SilenceWatch(silence_s, alive)


def test_a_slow_replica_that_answers_its_check_keeps_the_try():
    async def go():
        checks, kept = [], []
        watch = _watch(0.1, [(True, "")], checks)
        watch.on_kept = kept.append
        try:
            return await watch.wait(asyncio.sleep(0.45, result="the answer")), checks, kept
        finally:
            watch.close()

    result, checks, kept = asyncio.run(go())
    assert result == "the answer" and len(checks) >= 2  # checked, kept, checked again, kept
    assert len(kept) == 1 and kept[0] >= 0.45


def test_a_silent_replica_that_fails_its_check_is_given_up_and_its_wait_cancelled():
    cancelled = []

    async def hangs():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append("the try's connection closes here")
            raise

    async def go():
        checks = []
        watch = _watch(0.1, [(True, ""), (False, "HTTP 503: Cannot connect")], checks)
        try:
            with pytest.raises(ReplicaSilent) as given_up:
                await watch.wait(hangs())
            return given_up.value, checks
        finally:
            watch.close()

    silent, checks = asyncio.run(go())
    assert cancelled and checks == ["checked", "checked"]  # alive once, then not: given up at the second
    assert silent.reason == "HTTP 503: Cannot connect" and silent.waited_s >= 0.2
    # Silent since the alive check (~0.1 s in), not since the wait began: how long the dead
    # replica held the try, apart from the time it was kept while alive.
    assert 0.09 <= silent.silent_s <= silent.waited_s - 0.09, (silent.silent_s, silent.waited_s)
    assert "sent nothing for" in str(silent) and "failed its health check (HTTP 503: Cannot connect)" in str(silent)


def test_a_stream_that_keeps_sending_is_never_checked_and_nothing_is_left_running():
    async def go():
        checks = []
        watch = _watch(0.15, [(False, "dead")], checks)
        items = []
        try:
            for i in range(8):
                items.append(await watch.wait(asyncio.sleep(0.05, result=i)))
                await asyncio.sleep(0.05)  # the proxy sending the item on: not the replica's silence
        finally:
            watch.close()
        await asyncio.sleep(0)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return items, checks, left

    items, checks, left = asyncio.run(go())
    assert items == list(range(8)) and checks == [] and left == []


def test_the_awaited_calls_own_timeout_stays_a_timeout_and_zero_turns_the_watch_off():
    async def times_out():
        raise asyncio.TimeoutError("the client's own timeout")

    async def go():
        watch = _watch(0.1, [(False, "dead")], [])
        with pytest.raises(asyncio.TimeoutError, match="own timeout"):
            await watch.wait(times_out())
        watch.close()
        off = _watch(0, [(False, "dead")], checks := [])
        assert await off.wait(asyncio.sleep(0.3, result="slow")) == "slow"
        return checks

    assert asyncio.run(go()) == []


def test_one_health_check_per_instance_at_a_time_shared_with_every_try():
    calls = []

    async def probe():
        calls.append("probe")
        await asyncio.sleep(0.05)
        return True, ""

    async def broken():
        raise OSError("the worker is unreachable")

    async def go():
        clock = [0.0]
        liveness = Liveness(fresh_s=1.0, clock=lambda: clock[0])
        waiters = [asyncio.ensure_future(liveness.check(7, probe)) for _ in range(5)]
        waiters[0].cancel()  # one try's client left: the others still get the answer
        answers = await asyncio.gather(*waiters[1:])
        again = await liveness.check(7, probe)  # still fresh
        clock[0] = 2.0
        later = await liveness.check(7, probe)  # stale: checked again
        other = await liveness.check(8, broken)
        return answers, again, later, other

    answers, again, later, other = asyncio.run(go())
    assert answers == [(True, "")] * 4 and again == later == (True, "") and calls == ["probe", "probe"]
    assert other == (False, "OSError: the worker is unreachable")


def test_the_silence_timeout_knob_defaults_to_15_and_names_field_value_and_allowed():
    assert parse_policy({}).proxy.silence_timeout_s == 15
    assert parse_policy({"proxy": {"silence_timeout_s": 0}}).proxy.silence_timeout_s == 0  # off
    for value in (-1, 0.5, 4000):
        with pytest.raises(PolicyError) as error:
            parse_policy({"proxy": {"silence_timeout_s": value}}, source="routing.yaml")
        assert str(error.value) == (f"routing.yaml: key 'proxy.silence_timeout_s': not allowed (got {value!r}; "
                                    "allowed: 0 (off) or seconds 1-3600)")
    with pytest.raises(PolicyError) as error:
        parse_policy({"proxy": {"silence_timeout_s": "soon"}}, source="routing.yaml")
    assert "key 'proxy.silence_timeout_s'" in str(error.value) and "'soon'" in str(error.value)


def test_a_cancellation_that_is_not_the_give_up_stays_a_cancellation():
    """The client leaves while its try waits: that is a cancellation, never a ReplicaSilent,
    even when it lands just as the watch gives up."""
    async def go():
        outcomes = []
        for with_give_up in (False, True):
            watch = _watch(0.1, [(False, "dead")], [])
            waiter = asyncio.ensure_future(watch.wait(asyncio.Event().wait()))
            await asyncio.sleep(0.05 if not with_give_up else 0.1)
            if with_give_up:
                while watch._given_up is None and not waiter.done():
                    await asyncio.sleep(0)
            waiter.cancel()  # the client left
            try:
                await waiter
            except asyncio.CancelledError:
                outcomes.append("cancelled")
            except ReplicaSilent:
                outcomes.append("given up")
            watch.close()
        return outcomes

    assert asyncio.run(go()) == ["cancelled", "cancelled"]


def test_a_replica_heard_from_lately_is_alive_without_a_health_check():
    """Activity first: a replica that answered any request within the window is alive (an
    overloaded one may be too slow for a health check); quiet longer than that, it is checked."""
    calls = []

    async def probe():
        calls.append("probe")
        return False, "no answer within 3 s"

    async def go():
        clock = [100.0]
        liveness = Liveness(clock=lambda: clock[0])
        liveness.heard(7)
        clock[0] = 102.0
        busy = await liveness.check(7, probe, heard_within_s=3)
        clock[0] = 104.0
        quiet = await liveness.check(7, probe, heard_within_s=3)
        return busy, quiet

    busy, quiet = asyncio.run(go())
    assert busy == (True, "") and quiet == (False, "no answer within 3 s") and calls == ["probe"]
