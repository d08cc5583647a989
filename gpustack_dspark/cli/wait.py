"""Waiting for replicas to be RUNNING, with a text progress bar on stderr.

RUNNING is warm: GPUStack marks an instance RUNNING only once the backend's health path
answers 200, and the DSpark worker's `/dspark/ready` does that only after warmup.
The decision (`progress`) is pure; `wait_running` is the polling loop around it.
"""

import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, TextIO

from gpustack_dspark.cli.client import CLIError


@dataclass
class Progress:
    ready: int  # running replicas, summed over the models
    wanted: int
    detail: str  # e.g. "m1 1/2 (1 running, 1 starting)"
    failure: Optional[str] = None  # an instance in ERROR: the message to stop with


def progress(wanted: Dict[str, int], instances: Dict[str, List[Dict]]) -> Progress:
    """Where the models stand: `wanted` replicas per model, their instances per model."""
    ready = total = 0
    parts = []
    for name, replicas in wanted.items():
        states = Counter(str(i.get("state") or "pending") for i in instances.get(name, []))
        running = min(states.get("running", 0), replicas)
        ready, total = ready + running, total + replicas
        for instance in instances.get(name, []):
            if instance.get("state") == "error":
                message = (instance.get("state_message") or "no message").strip()
                return Progress(ready, total, "", f"{name}: instance {instance.get('name')} is in ERROR: {message}")
        shown = ", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "no instances yet"
        parts.append(f"{name} {running}/{replicas} ({shown})")
    return Progress(ready, total, "; ".join(parts))


def bar(p: Progress, width: int = 24) -> str:
    filled = width * p.ready // p.wanted if p.wanted else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {p.ready}/{p.wanted} warm  {p.detail}"


def wait_running(fetch: Callable[[], Dict[str, List[Dict]]], wanted: Dict[str, int], timeout_s: float,
                 out: Optional[TextIO] = None, interval_s: float = 2.0,
                 pending_hint: Callable[[Dict[str, List[Dict]]], Sequence[str]] = lambda _: ()) -> None:
    """Return once every model has its replicas RUNNING; CLIError on ERROR or timeout."""
    out = out or sys.stderr  # looked up per call: tests and callers may swap sys.stderr
    deadline = time.monotonic() + timeout_s
    tty = out.isatty()
    last = ""
    while True:
        instances = fetch()
        p = progress(wanted, instances)
        if p.failure:
            _end(out, tty, last)
            raise CLIError(p.failure)
        line = bar(p)
        if line != last:
            out.write(("\r\x1b[K" + line) if tty else line + "\n")
            out.flush()
            last = line
        if p.ready >= p.wanted:
            _end(out, tty, last)
            return
        if time.monotonic() >= deadline:
            _end(out, tty, last)
            messages = "; ".join(pending_hint(instances))
            raise CLIError(f"timed out after {timeout_s:g}s waiting for replicas to be RUNNING: {p.detail}"
                           + (f"; {messages}" if messages else ""))
        time.sleep(interval_s)


def _end(out: TextIO, tty: bool, last: str) -> None:
    if tty and last:
        out.write("\n")
        out.flush()


def instance_messages(instances: Dict[str, List[Dict]]) -> List[str]:
    """The instances' own messages (e.g. why the scheduler left them pending)."""
    return [f"{i.get('name')}: {i['state_message'].strip()}" for items in instances.values() for i in items
            if (i.get("state_message") or "").strip()]
