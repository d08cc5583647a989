"""devstack/progress.py: the demo's lines carry the time since the start, go to the log file
too, keep going when the output is dead (a closed pipe: the reported BrokenPipeError that
skipped the cleanup) and tell the owner, and a heartbeat names the phase while it works.
Real pipes and real threads."""

import os
import time

from gpustack_dspark.devstack.progress import Progress, elapsed


def test_elapsed_is_minutes_and_seconds():
    assert elapsed(100.0, now=100.4) == "0:00"
    assert elapsed(100.0, now=225.0) == "2:05"


def _pipe_stream():
    r, w = os.pipe()
    return r, os.fdopen(w, "w")


def test_lines_are_stamped_and_reach_the_stream_and_the_log_including_those_said_before_it_opened(tmp_path):
    r, stream = _pipe_stream()
    out = Progress(stream, t0=time.time() - 65)
    out.say("[demo] early")
    out.open_log(tmp_path / "demo.log")
    out.say("[demo] later")
    out.close()
    stream.close()
    assert os.read(r, 1000).decode().splitlines() == ["1:05 [demo] early", "1:05 [demo] later"]
    assert (tmp_path / "demo.log").read_text().splitlines() == ["1:05 [demo] early", "1:05 [demo] later"]


def test_a_write_to_a_dead_pipe_is_swallowed_logged_and_reported_once(tmp_path):
    r, stream = _pipe_stream()
    died = []
    out = Progress(stream, on_dead_output=lambda: died.append(1))
    out.open_log(tmp_path / "demo.log")
    os.close(r)  # the reader is gone (tee killed by the same Ctrl-C)
    out.say("[demo] stopping")  # raised BrokenPipeError before, and the cleanup never ran
    out.say("[demo] stopped")
    assert out.dead and died == [1]
    stream.write("the exit flush\n")  # the stream now points at /dev/null: nothing can fail
    stream.flush()
    assert "[demo] stopping" in (tmp_path / "demo.log").read_text()
    out.close()


def test_a_reader_gone_while_nothing_is_printed_is_noticed():
    r, stream = _pipe_stream()
    died = []
    out = Progress(stream, on_dead_output=lambda: died.append(time.monotonic()))
    out.watch_output(interval_s=0.05)
    os.close(r)
    closed = time.monotonic()
    deadline = closed + 5
    while not died and time.monotonic() < deadline:
        time.sleep(0.02)
    assert died and died[0] - closed < 2 and out.dead
    out.close()


def test_the_heartbeat_names_the_phase_and_its_detail_while_it_is_quiet(tmp_path):
    r, stream = _pipe_stream()
    out = Progress(stream, heartbeat_s=1.0)
    out.phase("image", lambda: "STEP 3/7 (4s)")
    out.start_heartbeat()
    time.sleep(2.6)
    out.phase(None)
    out.close()
    stream.close()
    lines = os.read(r, 10000).decode().splitlines()
    assert lines and all("[demo] image: still working" in line and "STEP 3/7 (4s)" in line for line in lines)
