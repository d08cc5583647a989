"""devstack/ports.py: ports for devstack servers come from outside the kernel's ephemeral range
(where no client socket takes them between the choice and the server's bind), bindable when
handed out, and never handed out twice by one process."""

import socket

from gpustack_dspark.devstack import ports


def test_ports_are_free_outside_the_ephemeral_range_and_never_repeated():
    low, high = ports._window()
    eph_low, eph_high = ports.ephemeral_range()
    assert high <= eph_low or low > eph_high  # this machine's range leaves room (Linux's default does)
    seen = [ports.free_port() for _ in range(300)]
    assert len(set(seen)) == len(seen)
    assert all(low <= p < high for p in seen), (min(seen), max(seen), low, high)
    with socket.socket() as s:  # still free now
        s.bind(("127.0.0.1", seen[-1]))


def test_a_listening_port_is_not_handed_out(monkeypatch):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        # The listener's port first, then any others (some may be in use or handed out before).
        draws = iter([taken, *range(20000, 32000)])
        monkeypatch.setattr(ports, "_HANDED_OUT", set())
        monkeypatch.setattr(ports, "_window", lambda: (1024, 65536))
        monkeypatch.setattr(ports._RANDOM, "randrange", lambda low, high: next(draws))
        assert ports.free_port() != taken


def test_a_port_range_is_one_free_block_inside_the_window():
    low, high = ports._window()
    first, last = map(int, ports.free_port_range(64).split("-"))
    assert last - first == 63 and low <= first and last < high
    again_first, again_last = map(int, ports.free_port_range(64).split("-"))
    assert again_last < first or again_first > last  # two blocks never overlap


def test_a_low_ephemeral_range_moves_the_window_above_it(monkeypatch, tmp_path):
    path = tmp_path / "range"
    path.write_text("1024\t49999\n")
    assert ports.ephemeral_range(path) == (1024, 49999)
    assert ports.ephemeral_range(tmp_path / "missing") == ports.EPHEMERAL_DEFAULT
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 49999))
    assert ports._window() == (50000, 65536)
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))  # no room outside it
    assert ports._window() == (ports.LOW, 65536)
