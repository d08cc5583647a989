"""The missed-STARTING repair's schedule (lifecycle/missed_start.py), no server."""

from gpustack_dspark.lifecycle.missed_start import NUDGE_AFTER_S, MissedStart, starting_ids


def test_an_instance_that_stays_starting_is_re_announced_on_a_bounded_schedule():
    tracker = MissedStart()
    times = [t / 2 for t in range(0, 2 * 400)]
    announced = []
    for now in times:
        for instance_id in tracker.due([7], now):
            tracker.done(instance_id)
            announced.append(now)
    assert announced == list(NUDGE_AFTER_S)  # at 20, 60 and 180 s after first seen STARTING, then never
    assert tracker.snapshot() == {"re_announced": 3, "starting": [7], "schedule_s": list(NUDGE_AFTER_S)}


def test_an_instance_that_leaves_starting_is_forgotten_and_counted_afresh_if_it_returns():
    tracker = MissedStart()
    assert tracker.due([1, 2], 0.0) == []
    assert tracker.due([1, 2], 25.0) == [1, 2]
    tracker.done(1)
    assert tracker.due([2], 30.0) == [2]  # 1 went RUNNING: forgotten; 2 not yet re-announced
    assert tracker.due([1, 2], 31.0) == [2]  # 1 is STARTING again (a restart): its clock starts again
    assert tracker.due([1], 51.0) == [1]


def test_only_this_backends_starting_instances_are_watched():
    rows = [(1, "starting", "DSpark-custom"), (2, "STARTING", "vLLM"), (3, "running", "DSpark-custom"),
            (4, "Starting", "DSpark-custom")]
    assert starting_ids(rows, "DSpark-custom") == [1, 4]
