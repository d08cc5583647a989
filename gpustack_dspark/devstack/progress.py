"""What a person watching `make demo` (or an image build) sees: every line stamped with the
time since the command began, a heartbeat at least every 10 s while a phase works, and the
same lines in a log file.

Why a class of its own: the demo's output may go to a terminal that hangs up or to a pipe
whose reader died (`make demo | tee demo.log`, Ctrl-C kills `tee` too). A failed write must
never stop the cleanup that follows (it did: the first print in the demo's `finally` raised
BrokenPipeError and nothing was stopped), so writes to a dead stream are swallowed, the
stream is marked dead (and pointed at /dev/null, so the interpreter's exit flush cannot fail
either) and `on_dead_output` tells the owner — the demo stops, as with Ctrl-C. The log file
keeps every line either way.
"""

import os
import select
import stat
import sys
import threading
import time
from pathlib import Path
from typing import Callable, IO, List, Optional

HEARTBEAT_S = 10.0


def start_time() -> float:
    """Wall-clock start of the command: DSPARK_T0 (epoch seconds, set by the Makefile, so the
    demo's times continue from `make demo`'s setup) or now."""
    try:
        return float(os.environ.get("DSPARK_T0") or time.time())
    except ValueError:
        return time.time()


def elapsed(since: float, now: Optional[float] = None) -> str:
    s = max(0, int((time.time() if now is None else now) - since))
    return f"{s // 60}:{s % 60:02d}"


class Progress:
    def __init__(self, stream: Optional[IO[str]] = None, t0: Optional[float] = None,
                 heartbeat_s: float = HEARTBEAT_S, on_dead_output: Optional[Callable[[], None]] = None):
        self.stream = stream if stream is not None else sys.stdout
        self.t0 = start_time() if t0 is None else t0
        self.heartbeat_s = heartbeat_s
        self.on_dead_output = on_dead_output
        self.dead = False
        self._log: Optional[IO[str]] = None
        self._early: List[str] = []  # lines said before the log file exists
        self._lock = threading.RLock()  # re-entrant: a signal handler may say() inside say()
        self._last = time.monotonic()
        self._phase: Optional[str] = None
        self._phase_started = 0.0
        self._detail: Optional[Callable[[], str]] = None
        self._halt = threading.Event()
        self._threads: List[threading.Thread] = []

    # -- output -------------------------------------------------------------------------
    def open_log(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._lock:
            self._log = open(path, "a", buffering=1, errors="replace")
            for line in self._early:
                self._log.write(line)
            self._early = []

    @property
    def log_path(self) -> Optional[str]:
        return self._log.name if self._log is not None else None

    def say(self, message: str) -> None:
        line = f"{elapsed(self.t0)} {message}\n"
        with self._lock:
            self._last = time.monotonic()
            if self._log is not None:
                try:
                    self._log.write(line)
                except (OSError, ValueError):
                    pass
            else:
                self._early.append(line)
            if not self.dead:
                try:
                    self.stream.write(line)
                    self.stream.flush()
                except (OSError, ValueError):  # EPIPE (reader gone), EIO (terminal hung up), closed
                    self._mark_dead()

    def _mark_dead(self) -> None:
        with self._lock:
            if self.dead:
                return
            self.dead = True
            try:  # nothing may write to the dead stream again: not us, not the exit flush
                fd = self.stream.fileno()
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, fd)
                os.close(devnull)
            except (OSError, ValueError, AttributeError):
                pass
        if self.on_dead_output is not None:
            self.on_dead_output()

    # -- a dead pipe with nothing written ------------------------------------------------
    def watch_output(self, interval_s: float = 0.5) -> None:
        """Notices a reader that went away while nothing is printed (the demo serving): the
        write end of a pipe polls POLLERR once no reader is left."""
        try:
            fd = self.stream.fileno()
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                return
        except (OSError, ValueError, AttributeError):
            return
        poller = select.poll()
        poller.register(fd, select.POLLERR | select.POLLHUP)

        def run() -> None:
            while not self._halt.wait(interval_s) and not self.dead:
                try:
                    events = poller.poll(0)
                except OSError:
                    return
                if any(ev & (select.POLLERR | select.POLLHUP) for _, ev in events):
                    self._mark_dead()
                    return

        self._start(run, "dspark-output-watch")

    # -- phases and the heartbeat --------------------------------------------------------
    def phase(self, name: str, detail: Optional[Callable[[], str]] = None) -> None:
        """The phase now running (None: none); the heartbeat names it and its detail."""
        with self._lock:
            self._phase, self._detail, self._phase_started = name, detail, time.monotonic()

    def start_heartbeat(self, prefix: str = "[demo]") -> None:
        def run() -> None:
            while not self._halt.wait(1.0):
                with self._lock:
                    quiet = time.monotonic() - self._last >= self.heartbeat_s
                    phase, detail, started = self._phase, self._detail, self._phase_started
                if not quiet or phase is None:
                    continue
                extra = ""
                if detail is not None:
                    try:
                        extra = detail()
                    except Exception as e:  # a heartbeat never fails the demo
                        extra = f"({type(e).__name__})"
                self.say(f"{prefix} {phase}: still working, {time.monotonic() - started:.0f}s"
                         + (f"; {extra}" if extra else ""))

        self._start(run, "dspark-heartbeat")

    def _start(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def close(self) -> None:
        self._halt.set()
        for thread in self._threads:
            thread.join(timeout=5)
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
