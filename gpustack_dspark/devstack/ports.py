"""Ports for devstack servers: free on 127.0.0.1 when handed out, and outside the kernel's
ephemeral range.

Why outside it: a port asked of the kernel with bind(0) comes from the ephemeral range, the same
range every outgoing connection takes its local port from, so between the choice and the
server's own bind (GPUStack: seconds of imports) a client socket may take it and the server
dies with "address already in use". Ports outside the range are never handed to clients.

Contract: `free_port()` and `free_port_range(size)` return ports that were bindable on
127.0.0.1 when returned, never the same port twice in one process, drawn at random
(SystemRandom: processes with the same seeded `random` state do not draw alike) from LOW up to
the ephemeral range's start; above the range where it starts too low; where neither leaves room,
from LOW up, ephemeral ports included (the race returns there).
"""

import random
import socket
from pathlib import Path
from typing import Set, Tuple

LOW = 20000  # above the usual fixed service ports (PostgreSQL 5432, 8080, 9090, ...)
EPHEMERAL_DEFAULT = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
ROOM = 4096  # the fewest ports a window must hold
_RANDOM = random.SystemRandom()
_HANDED_OUT: Set[int] = set()


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> Tuple[int, int]:
    try:
        low, high = (int(x) for x in path.read_text().split())
        return low, high
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT


def _window() -> Tuple[int, int]:
    """[low, high) to draw from (see the contract)."""
    eph_low, eph_high = ephemeral_range()
    if eph_low - LOW >= ROOM:
        return LOW, eph_low
    if 65536 - (eph_high + 1) >= ROOM:
        return eph_high + 1, 65536
    return LOW, 65536


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    low, high = _window()
    for _ in range(500):
        port = _RANDOM.randrange(low, high)
        if port not in _HANDED_OUT and _bindable(port):
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port on 127.0.0.1 in {low}-{high - 1} after 500 tries")


def free_port_range(size: int = 64) -> str:
    """A block of `size` ports free on 127.0.0.1 now, e.g. "24640-24703" (a worker's service ports)."""
    low, high = _window()
    starts = list(range(low, high - size, size))
    _RANDOM.shuffle(starts)
    for start in starts:
        block = range(start, start + size)
        if not _HANDED_OUT.intersection(block) and all(_bindable(port) for port in block):
            _HANDED_OUT.update(block)
            return f"{start}-{start + size - 1}"
    raise RuntimeError(f"no {size} free ports in a row on 127.0.0.1 in {low}-{high - 1}")
