"""`cli/sweep_interrupts.py`: one Ctrl-C at every moment of `CtrlC.run` (each Python line it and
asyncio execute) comes out as KeyboardInterrupt, with the task's cleanup run, the event loop
closed and nothing left behind. Python 3.11's `asyncio.run` fails this: at a few of these
moments it raises CancelledError instead (the rolling sweep's e2e failure), and at others the
KeyboardInterrupt lands inside asyncio's internals."""

import asyncio
import gc
import signal
import sys
import warnings

import pytest

from gpustack_dspark.cli.sweep_interrupts import CtrlC


async def _cell(log):
    log.append("started")
    try:
        for _ in range(3):
            await asyncio.sleep(0)
        return "measured"
    finally:
        log.append("cleaned up")


def _run_with_sigint_at(run, line):
    """Run `run(coro)` under a tracer that raises SIGINT at its `line`-th traced line (0: none).
    Returns (outcome, lines traced, log, unraisable exceptions, warnings)."""
    seen = [0]
    log = []

    def tracer(frame, event, arg):
        if event == "line":
            seen[0] += 1
            if seen[0] == line:
                signal.raise_signal(signal.SIGINT)  # its handler runs here, as between two bytecodes
        return tracer

    unraisable = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.err_msg}")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            sys.settrace(tracer)
            try:
                outcome = run(_cell, log)
            except BaseException as e:  # noqa: B036 - the point is which one comes out
                outcome = type(e).__name__
            finally:
                sys.settrace(None)
            gc.collect(0)
    finally:
        sys.unraisablehook = previous_hook
    return outcome, seen[0], log, unraisable, [str(w.message) for w in caught]


def test_one_ctrl_c_at_any_moment_of_a_run_is_keyboard_interrupt_with_cleanup():
    ctrl_c = CtrlC()
    with ctrl_c.installed():
        outcome, lines, log, unraisable, warned = _run_with_sigint_at(CtrlC().run, 0)
        assert (outcome, log, unraisable, warned) == ("measured", ["started", "cleaned up"], [], [])
        assert lines > 100  # the loop's making, the task's steps, the loop's closing
        for line in range(1, lines + 1):
            ctrl_c = CtrlC()
            with ctrl_c.installed():
                outcome, _, log, unraisable, warned = _run_with_sigint_at(ctrl_c.run, line)
            where = f"SIGINT at traced line {line} of {lines}"
            assert outcome == "KeyboardInterrupt", (where, outcome, log)
            assert log in ([], ["started", "cleaned up"]), (where, log)  # started means cleaned up
            assert not unraisable and not warned, (where, unraisable, warned)
            assert ctrl_c.count == 1
    assert signal.getsignal(signal.SIGINT) is not ctrl_c._on_sigint  # put back


def test_deferred_sections_raise_at_their_end_and_quiet_ones_never():
    ctrl_c = CtrlC()
    done = []
    with ctrl_c.installed():
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c.deferred():
                signal.raise_signal(signal.SIGINT)
                done.append("the section went on")
        with pytest.raises(KeyboardInterrupt):
            with ctrl_c.deferred():
                with ctrl_c.deferred():
                    signal.raise_signal(signal.SIGINT)
                done.append("the outer section went on")
        with ctrl_c.quiet():
            signal.raise_signal(signal.SIGINT)
            signal.raise_signal(signal.SIGINT)
        done.append("quiet: nothing raised")
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)  # plain code: at once
    assert done == ["the section went on", "the outer section went on", "quiet: nothing raised"]
    assert ctrl_c.count == 5


def test_a_run_without_ctrl_c_returns_or_raises_what_the_task_did():
    async def fails():
        raise ValueError("the task's own error")

    ctrl_c = CtrlC()
    with ctrl_c.installed():
        assert ctrl_c.run(_cell, []) == "measured"
        with pytest.raises(ValueError, match="own error"):
            ctrl_c.run(fails)


class _Finalized:
    def __init__(self, where):
        self.where = where

    def __del__(self):
        signal.raise_signal(SIGINT_IN_FINALIZER)
        self.where.append("the finalizer went on")


class _Plain:
    pass


SIGINT_IN_FINALIZER = signal.SIGINT


def test_a_ctrl_c_inside_a_finalizer_is_noted_not_lost_and_check_raises_it():
    """The clean-clone CI's failure: a collection ran a `__del__` just as the Ctrl-C came; the
    KeyboardInterrupt raised there was printed as "Exception ignored" and the sweep went on to
    exit 0. Now the handler notes it there and the sweep's next `check()` raises it."""
    import weakref

    ctrl_c = CtrlC()
    where = []
    unraisable = []
    previous_hook = sys.unraisablehook
    sys.unraisablehook = lambda u: unraisable.append(f"{u.exc_type.__name__}: {u.err_msg}")
    try:
        with ctrl_c.installed():
            ctrl_c.check()  # no Ctrl-C yet: nothing
            _Finalized(where)  # collected at once: its __del__ gets the SIGINT
            weakref.finalize(_Plain(), signal.raise_signal, signal.SIGINT)  # a weakref.finalize callback
            gc.collect()
            assert where == ["the finalizer went on"] and unraisable == [], (where, unraisable)
            assert ctrl_c.count == 2
            with pytest.raises(KeyboardInterrupt):
                ctrl_c.check()
    finally:
        sys.unraisablehook = previous_hook
