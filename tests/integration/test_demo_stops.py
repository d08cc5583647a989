"""`make demo` stopped the other ways a person stops it — SIGTERM, SIGHUP (the terminal or
tmux pane closed) and the pipe's reader gone — with its output piped through a reader that
dies with it, and nothing of it left: no process, no port, no container (conmon and the
replicas name the run's folder), only the state folder's demo.log saying why it stopped.

Ctrl-C (SIGINT) of the whole piped job, once the replicas serve, is the end of
test_demo.py's full demo (the reported tmux/tee leak), so it is not repeated here. These stop
the demo as soon as its platform processes are up, which is where the cleanup used to be cut
short too and costs seconds instead of a full demo: the cleanup path is the same whatever
phase it interrupts (the phases are interrupted, not waited for).
"""

import signal

import pytest

from gpustack_dspark.devstack import podman as podman_host
from gpustack_dspark.devstack.ports import free_port

from tests.conftest import wait_for
from tests.integration.demo_support import PipedDemo, assert_nothing_left

pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]  # may include the cold image build

# A first run may build the image (about a minute here, minutes under load).
FIRST_LINE_S = 1500


@pytest.fixture(scope="module")
def podman_ready():
    podman_host.prepare()  # fails here, with the reason, where Podman cannot work


def _stopped(tmp_path, after: str, stop, reason: str, running=("postgres -D",), timeout_s: float = 600) -> None:
    """Starts the piped demo, waits for the line `after` and for processes naming each of
    `running`, stops it with `stop`, and checks that nothing is left."""
    demo = PipedDemo(tmp_path, free_port())
    try:
        demo.wait_for(after, FIRST_LINE_S)
        wait_for(lambda: all(any(r in p for p in demo.processes()) for r in running), 120,
                 f"processes {running} of the demo")
        ports = demo.ports()
        assert ports, demo.processes()  # there is something to clean up
        stop(demo)
        took = demo.wait_demo_gone(timeout_s)
        print(f"[stop] {reason}: the demo was gone {took:.1f}s after the stop; ports were {sorted(ports)}")
        assert_nothing_left(demo, ports, reason)
    finally:
        demo.cleanup()


def test_sigterm_while_the_server_starts_removes_postgres_and_the_server(tmp_path, podman_ready):
    _stopped(tmp_path, r"\[stack\] server: starting", lambda d: d.signal_job(signal.SIGTERM), "SIGTERM",
             running=("postgres -D", "start --data-dir"))


def test_sighup_of_a_closed_pane_while_the_worker_joins_removes_everything(tmp_path, podman_ready):
    # The worker phase: PostgreSQL, the server, Podman's service and the worker all started.
    _stopped(tmp_path, r"\[stack\] worker: Podman", lambda d: d.signal_job(signal.SIGHUP), "SIGHUP",
             running=("postgres -D", "start --data-dir", "podman system service", "--worker-name"))


def test_a_dead_output_pipe_stops_the_demo_and_removes_everything(tmp_path, podman_ready):
    # The reader dies alone: no signal reaches the demo, it notices its output is gone.
    _stopped(tmp_path, r"\[stack\] server: starting", lambda d: d.kill_reader(), "its output is gone",
             running=("postgres -D", "start --data-dir"))
