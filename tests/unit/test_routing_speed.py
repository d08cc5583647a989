"""Expected finish time and slow start (routing/speed.py, routing/inflight.py), on traces."""

import pytest

from gpustack_dspark.routing.inflight import InFlightTracker
from gpustack_dspark.routing.speed import (
    EXPECTED_FINISH_TIME, LEAST_CONNECTIONS, ServiceTimes, SlowStart, SlowStartConfig, pick, ramp_weight,
)
from gpustack_dspark.routing.stream_end import StreamWatch, completion_tokens


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_pick_costs_estimate_times_in_flight_plus_one():
    # Equal counts: the faster one; B 3x slower takes a request once A has 3x its load.
    assert pick([1, 2], {}, 0, {1: 0.01, 2: 0.03}) == 1
    assert pick([1, 2], {1: 2, 2: 0}, 0, {1: 0.01, 2: 0.03}) == 1
    assert pick([1, 2], {1: 3, 2: 0}, 0, {1: 0.01, 2: 0.03}) == 2  # 0.04 vs 0.03
    # No estimate: the mean of the others'; none at all: least-connections, ties by turn.
    assert pick([1, 2], {}, 0, {1: 0.02, 2: None}) == 1 and pick([1, 2], {}, 1, {1: 0.02, 2: None}) == 2
    assert [pick([3, 1, 2], {}, t) for t in range(4)] == [1, 2, 3, 1]
    # Weight divides the cost.
    assert pick([1, 2], {}, 0, None, {1: 0.1, 2: 1.0}) == 2
    assert [pick([1, 2], {2: 9}, t, None, {1: 0.1, 2: 1.0}) for t in (0, 1)] == [1, 2]  # 1/0.1 vs 10/1: a tie
    with pytest.raises(ValueError):
        pick([], {}, 0)


def test_service_times_ewma_and_decay_towards_the_model_mean():
    times = ServiceTimes(alpha=0.5, stale_tau_s=10)
    times.observe(1, 7, seconds=1.0, tokens=100, now=0)  # 0.01 s/token
    times.observe(2, 7, seconds=1.8, tokens=100, now=0)  # 0.018
    assert times.estimate(1, 0) == pytest.approx(0.01) and times.estimate(2, 0) == pytest.approx(0.018)
    times.observe(1, 7, seconds=2.0, tokens=100, now=0)
    assert times.estimate(1, 0) == pytest.approx(0.015)
    # Not refreshed: B's estimate drifts towards the others' (A's) so it is tried again.
    assert times.estimate(2, 10) == pytest.approx(0.015 + 0.003 / 2.718281828, rel=1e-3)
    assert times.estimate(2, 1000) == pytest.approx(0.015, rel=1e-3)
    assert times.estimate(3, 0) is None
    times.observe(4, 7, seconds=-1, tokens=1, now=0)  # nonsense is ignored
    assert times.estimate(4, 0) is None
    times.forget({1})
    assert len(times) == 1


def test_one_slow_answer_moves_an_estimate_at_most_twofold_and_a_slow_replica_still_gets_there():
    times = ServiceTimes(alpha=0.3, stale_tau_s=60)
    for _ in range(18):
        times.observe(2, 7, seconds=0.22, tokens=100, now=0)  # 0.0022 s/token, as in CI
    # The other replica's first answer came at a new batch shape: 10x. It counts as 2x the
    # model's average, so that replica still takes a request once the other has one in flight.
    times.observe(3, 7, seconds=2.1, tokens=100, now=0)
    assert times.estimate(3, 0) == pytest.approx(0.0044)
    assert pick([2, 3], {2: 1}, 0, {2: times.estimate(2, 0), 3: times.estimate(3, 0)}) in (2, 3)
    assert pick([2, 3], {2: 2}, 0, {2: times.estimate(2, 0), 3: times.estimate(3, 0)}) == 3
    # Its usual answers bring it back within the same-speed band in a few answers.
    for n in range(1, 10):
        times.observe(3, 7, seconds=0.22, tokens=100, now=0)
        if times.estimate(3, 0) <= 0.0022 * 1.25:
            break
    assert n <= 6, times.estimate(3, 0)
    # A replica that stays 5x slower: 2x at once, then up to 2x per answer towards its speed.
    times.observe(4, 7, seconds=1.1, tokens=100, now=0)
    assert times.estimate(4, 0) == pytest.approx(2 * times.model_mean(7, exclude=[4]))
    for _ in range(8):
        times.observe(4, 7, seconds=1.1, tokens=100, now=0)
    assert times.estimate(4, 0) > 0.009
    # Without clipping (clip 1 or less), a sample is taken as it is.
    raw = ServiceTimes(clip=1.0)
    raw.observe(1, 7, 1.0, 100, 0)
    raw.observe(2, 7, 10.0, 100, 0)
    assert raw.estimate(2, 0) == pytest.approx(0.1)


def test_ramp_curve_is_envoys():
    config = SlowStartConfig(ramp_s=30, min_weight=0.1, aggression=1.0)
    assert [round(ramp_weight(a, config), 3) for a in (0, 1, 3, 15, 29.9, 30, 99)] == [0.1, 0.1, 0.1, 0.5, 0.997, 1, 1]
    assert ramp_weight(15, SlowStartConfig(30, 0.1, 2.0)) == pytest.approx(0.5 ** 0.5)
    assert ramp_weight(0, SlowStartConfig(0, 0.1, 1.0)) == 1.0  # ramp_s 0: off


def test_slow_start_sees_new_restarted_and_returning_instances():
    ramp = SlowStart(SlowStartConfig(ramp_s=30, min_weight=0.1))
    ramp.see(7, [(1, 0), (2, 0)], now=0)  # the model's first choice since start: no ramp
    assert ramp.weight(1, 0) == ramp.weight(2, 0) == 1.0
    ramp.see(7, [(1, 0), (2, 0), (3, 0)], now=100)  # scale-out
    assert ramp.weight(3, 100) == 0.1 and ramp.weight(3, 115) == pytest.approx(0.5) and ramp.weight(3, 130) == 1.0
    ramp.see(7, [(1, 1), (2, 0), (3, 0)], now=200)  # 1 restarted (GPUStack's restart_count)
    assert ramp.weight(1, 200) == 0.1
    ramp.see(7, [(2, 0), (3, 0)], now=300)  # 3 left RUNNING ...
    ramp.see(7, [(2, 0), (3, 0)], now=301)
    assert ramp.weight(3, 301) == 1.0
    ramp.see(7, [(1, 1), (2, 0), (3, 0)], now=310)  # ... 1 came back
    assert ramp.weight(1, 310) == 0.1 and ramp.ramps_started == 3
    assert set(ramp.ramping(311)) == {1}


def _burst(tracker, group, candidates, n):
    """n requests arriving together (none finishes): where each goes."""
    chosen = []
    for _ in range(n):
        instance = tracker.choose(group, candidates, LEAST_CONNECTIONS)
        tracker.acquire(instance, group)
        chosen.append(instance)
    return chosen


def test_a_freshly_warm_replica_gets_a_ramped_share_not_the_burst():
    for ramp_s, expect_new_at_most in ((0, 30), (30, 6)):
        clock = Clock()
        tracker = InFlightTracker(SlowStartConfig(ramp_s=ramp_s, min_weight=0.1), clock=clock)
        tracker.see(7, [(1, 0), (2, 0)])
        _burst(tracker, 7, [1, 2], 30)  # steady load: 15 in flight each
        clock.now += 60
        tracker.see(7, [(1, 0), (2, 0), (3, 0)])  # replica 3 turns warm
        burst = _burst(tracker, 7, [1, 2, 3], 30)
        assert burst.count(3) <= expect_new_at_most, (ramp_s, burst.count(3))
        if ramp_s == 0:
            assert burst[:15] == [3] * 15  # least-connections alone: the new one absorbs the burst
        else:
            assert burst.count(3) >= 1  # not starved either
            clock.now += 30  # the window is over: a full share
            assert tracker.choose(7, [1, 2, 3], LEAST_CONNECTIONS) == 3


def test_expected_finish_time_trace_shrinks_the_slow_replicas_share_and_recovers():
    clock = Clock()
    tracker = InFlightTracker(SlowStartConfig(ramp_s=0), clock=clock, stale_tau_s=60)
    tracker.see(7, [(1, 0), (2, 0)])
    for _ in range(5):  # learned speeds: A 0.01 s/token, B 3x slower
        for instance, seconds in ((1, 1.0), (2, 3.0)):
            tracker.acquire(instance, 7)
            tracker.record(instance, seconds, 100)
            tracker.release(instance)
    # Equal counts: a request (long or short) goes to the fast one.
    assert tracker.choose(7, [1, 2], EXPECTED_FINISH_TIME) == 1
    # Under a burst of 16 the split follows the speeds (3:1), least-connections would be 8:8.
    chosen = []
    for _ in range(16):
        instance = tracker.choose(7, [1, 2], EXPECTED_FINISH_TIME)
        tracker.acquire(instance, 7)
        chosen.append(instance)
    assert chosen.count(1) == 12 and chosen.count(2) == 4
    for instance in chosen:
        tracker.release(instance)
    # B recovers (its estimate decays towards A's without samples, then fresh samples).
    clock.now += 600
    assert tracker.snapshot()[2]["seconds_per_token"] == pytest.approx(0.01, rel=0.01)
    assert tracker.total() == 0 and tracker.unmatched_releases == 0


def test_the_proxy_reads_output_tokens_cheaply():
    assert completion_tokens(b'{"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 42}}') == 42
    assert completion_tokens(b'{"usage": {"completion_tokens": "x"}}') is None
    assert completion_tokens(b"") is None and completion_tokens(None) is None
    watch = StreamWatch()
    for chunk in ('data: {"choices":[{"delta":{"content":"a"}}]}\n\n', 'data: {"choices":[]}\n\ndata: {"x":1}\n\n',
                  "data: [DONE]\n\n"):
        watch.see(chunk)
    assert watch.output_tokens() == 3 and not watch.truncated()
    watch = StreamWatch()
    watch.see('data: {"choices":[],"usage":{"completion_tokens":17}}\n\n')
    assert watch.output_tokens() == 17 and watch.truncated()


def test_about_the_same_speed_is_balanced_by_in_flight_alone():
    # 1.2x apart: inside the band, so a wave of 4 splits 2/2 as least-connections would.
    estimates, counts, chosen = {1: 0.010, 2: 0.012}, {}, []
    for turn in range(4):
        c = pick([1, 2], counts, turn, estimates)
        counts[c] = counts.get(c, 0) + 1
        chosen.append(c)
    assert sorted(chosen) == [1, 1, 2, 2]
    assert pick([1, 2], {1: 1}, 0, {1: 0.010, 2: 0.030}) == 1  # 3x apart: not the same speed


def test_the_proxy_gets_a_transient_copy_of_gpustacks_shared_worker_row():
    import asyncio

    from sqlalchemy import inspect as sa_inspect
    from gpustack.schemas.workers import Worker

    from gpustack_dspark.routing.gpustack_patches import WorkerSnapshots

    row = Worker(id=3, name="w1", ip="127.0.0.1", port=10150, hostname="h", labels={}, cluster_id=1)
    snapshots = WorkerSnapshots()

    async def twice():
        return await snapshots.get(row), await snapshots.get(row)

    first, second = asyncio.run(twice())
    assert first is not row and first is second and snapshots.copied == 1 and snapshots.failed == 0
    assert (first.id, first.ip, first.port, first.get_proxy_address()) == (3, "127.0.0.1", 10150, None)
    assert sa_inspect(first).transient  # bound to no session: reading it never loads
    assert asyncio.run(snapshots.get(None)) is None


def test_an_instance_that_received_nothing_gets_a_probes_share():
    clock = Clock()
    tracker = InFlightTracker(SlowStartConfig(ramp_s=30, min_weight=0.1), clock=clock)
    tracker.see(7, [(1, 0), (2, 0)])
    tracker.failed(2)  # refused a request: GPUStack still lists it RUNNING
    burst = _burst(tracker, 7, [1, 2], 20)
    assert burst.count(2) <= 2, burst
    clock.now += 30  # it answers again: back to a full share
    assert tracker.snapshot()[2]["weight"] == 1.0
