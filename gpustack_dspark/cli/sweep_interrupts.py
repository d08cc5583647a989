"""Ctrl-C for `gpustack-dspark sweep`: at any moment one comes out as KeyboardInterrupt in plain
code, where the sweep says "interrupted", puts back what it changed and exits 130. It never
comes out as a traceback.

Why the sweep does not leave SIGINT to `asyncio.run`: Python 3.11's `asyncio.Runner.run`
installs its SIGINT handler and only then sets `_interrupt_count = 0`. A Ctrl-C between the
two cancels the main task, but the count that says it was a Ctrl-C is reset, so `asyncio.run`
raises CancelledError instead of KeyboardInterrupt. That is the e2e's failure: the sweep
Ctrl-C'd just as its next concurrency level started. Another case: a Ctrl-C while an event loop
is being made or closed raises KeyboardInterrupt inside asyncio's internals. That prints
"Exception ignored in ..." tracebacks, or loses the Ctrl-C altogether. Measured with
back-to-back `asyncio.run` calls and one SIGINT at a random moment: 3 CancelledError and
3 lost of 200.

`CtrlC` owns SIGINT for the sweep:
- in plain code, a Ctrl-C is KeyboardInterrupt at once, as with Python's default handler;
- inside `deferred()` (making or closing an event loop, starting or stopping a replica,
  writing the results) it is noted and raised when the section ends;
- while `run(function, ...)`'s task runs, the first Ctrl-C cancels that task (its `async with` blocks
  close their connections), and later ones change nothing. `run` then raises
  KeyboardInterrupt, whatever the task did with the cancellation.
- in a finalizer (`__del__`, a weakref callback: Python runs them wherever a collection
  happens), it is noted and never raised: a KeyboardInterrupt there is printed as "Exception
  ignored" and lost, and the sweep would go on. `check()` raises a noted one; the sweep calls it
  between its steps, so any Ctrl-C ends the sweep.
No asyncio internals are touched: `asyncio.Runner` installs its own handler only when SIGINT
has Python's default one, and here it has ours.
"""

import _weakrefset
import asyncio
import signal
import threading
import weakref
from contextlib import contextmanager
from typing import Any, Callable, Coroutine, Iterator, Optional, Tuple


class CtrlC:
    def __init__(self) -> None:
        self.count = 0  # Ctrl-Cs so far
        self._depth = 0  # nesting of held sections
        self._main: Optional[Tuple[asyncio.AbstractEventLoop, asyncio.Task]] = None
        self._cancelled = False

    # ---- the handler (runs in the main thread, between two bytecodes of whatever runs) ----
    def _on_sigint(self, signum, frame) -> None:
        self.count += 1
        if self._depth:
            return  # a held section: acted on when it ends
        main = self._main
        if main is not None:
            if not self._cancelled:
                self._cancelled = True
                loop, task = main
                task.cancel()
                loop.call_soon_threadsafe(_wake)  # the loop may sleep in select()
            return
        if _in_finalizer(frame):
            return  # a raise here would be swallowed: `check()` raises it
        raise KeyboardInterrupt

    def check(self) -> None:
        """Raises KeyboardInterrupt if there was a Ctrl-C: any Ctrl-C ends the sweep, including
        one noted where it could not be raised."""
        if self.count:
            raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator["CtrlC"]:
        """SIGINT goes to this object while the block runs. Signals reach only the main
        thread, so elsewhere nothing is installed and `run` is plain `asyncio.run`."""
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def _held(self) -> Iterator[None]:
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A section a Ctrl-C must not cut in two: one that lands inside is raised at its end
        (replacing any exception the section raised: the interruption wins)."""
        seen = self.count
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0 and self.count != seen:
                raise KeyboardInterrupt

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """A section that ends the run anyway (saying "interrupted"): Ctrl-Cs there are counted,
        never raised."""
        with self._held():
            yield

    def run(self, function: Callable[..., Coroutine[Any, Any, Any]], *args: Any, **kwargs: Any) -> Any:
        """`asyncio.run(function(*args, **kwargs))`, where a Ctrl-C at any moment comes out as
        KeyboardInterrupt. The coroutine is made here, inside the held section, so a Ctrl-C
        never leaves one that was never awaited."""
        seen = self.count
        runner: Optional[asyncio.Runner] = None
        result = None
        try:
            with self._held():  # making the loop: a Ctrl-C here cancels the task before it starts
                runner = asyncio.Runner()
                loop = runner.get_loop()
                task = loop.create_task(function(*args, **kwargs))
                self._main, self._cancelled = (loop, task), False
                if self.count != seen:
                    self._cancelled = True
                    task.cancel()
            try:
                result = loop.run_until_complete(task)
            except BaseException:
                if self.count == seen:
                    raise  # not a Ctrl-C: the task's own error
        finally:
            with self._held():  # closing the loop: cancels and awaits whatever is left
                self._main = None
                if runner is not None:
                    runner.close()
        if self.count != seen:
            raise KeyboardInterrupt
        return result


def _in_finalizer(frame) -> bool:
    """Whether `frame` runs inside a finalizer, where an exception is printed and dropped."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "__del__" or code.co_filename in _WEAKREF_FILES:
            return True
        frame = frame.f_back
    return False


_WEAKREF_FILES = (weakref.__file__, _weakrefset.__file__)  # weakref.finalize, WeakSet callbacks


def _wake() -> None:
    """Nothing: scheduling it wakes the loop."""
