"""`make demo` the way people run it: a terminal's foreground job with its output piped
through a line-stamping reader (`make demo 2>&1 | while read l; do ...; done | tee log`).

The job is a process group of its own — make, the demo, the reader — as a shell with job
control makes it, so a signal sent to the group is what Ctrl-C (SIGINT) or a closed terminal
(SIGHUP) delivers: the reader dies with the demo's group, exactly as `tee` does. The reader
writes to a file the tests read. What is left afterwards is found from the outside: processes
naming the state folder (PostgreSQL, GPUStack's server and worker, Podman's service, conmon),
the ports those processes listened on, and the run's container store.
"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Set

import httpx

from gpustack_dspark.devstack.container_stack import processes_naming

REPO_ROOT = Path(__file__).resolve().parents[2]

# The reader: stamps each line, like the loop in the report; dies of SIGINT/SIGTERM/SIGHUP.
STAMPER = ("import sys, time\n"
           "out = open(sys.argv[1], 'a', buffering=1)\n"
           "for line in sys.stdin:\n"
           "    out.write(time.strftime('%H:%M:%S ') + line)\n")


class PipedDemo:
    def __init__(self, tmp_path: Path, port: int, extra_args: str = ""):
        self.port = port
        self.out_path = tmp_path / "piped-output.log"
        env = {k: v for k, v in os.environ.items() if k not in ("DSPARK_T0", "MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
        # -o demo-setup: the test session's setup already ran (make test); the demo itself is
        # started by make exactly as `make demo` starts it.
        self.make = subprocess.Popen(["make", "--no-print-directory", "-o", "demo-setup", "demo",
                                      f"DEMO_ARGS=--port {port} {extra_args}".strip()],
                                     cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, process_group=0)
        self.pgid = self.make.pid
        self.reader = subprocess.Popen([sys.executable, "-u", "-c", STAMPER, str(self.out_path)],
                                       stdin=self.make.stdout, stderr=subprocess.DEVNULL,
                                       process_group=self.pgid)
        self.make.stdout.close()  # only the reader holds the pipe's read end
        self.state_dir: Optional[Path] = None
        self.demo_pid: Optional[int] = None

    def output(self) -> str:
        return self.out_path.read_text(errors="replace") if self.out_path.exists() else ""

    def wait_for(self, pattern: str, timeout_s: float) -> re.Match:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            match = re.search(pattern, self.output())
            if match:
                if self.state_dir is None:
                    self._learn_state_dir()
                return match
            if self.make.poll() is not None:
                break
            time.sleep(0.3)
        raise AssertionError(f"the demo never printed {pattern!r}; output:\n{self.output()[-6000:]}")

    def _learn_state_dir(self) -> None:
        found = re.search(r"\[demo\] state in (\S+)", self.output())
        if found:
            self.state_dir = Path(found.group(1))
        for entry in Path("/proc").iterdir():
            try:
                if entry.name.isdigit() and _ppid(int(entry.name)) == self.make.pid and \
                        b"gpustack_dspark.devstack" in (entry / "cmdline").read_bytes():
                    self.demo_pid = int(entry.name)
            except OSError:
                continue

    # -- stopping -----------------------------------------------------------------------
    def signal_job(self, sig: int) -> None:
        """What the terminal does: the signal to the whole foreground job, reader included."""
        os.killpg(self.pgid, sig)

    def kill_reader(self) -> None:
        """The pipe's reader dies alone (a `tee` killed from elsewhere); the demo gets no signal."""
        self.reader.kill()
        self.reader.wait(timeout=10)

    def wait_demo_gone(self, timeout_s: float) -> float:
        """Seconds until the demo's process is gone (it is make's child, not ours)."""
        assert self.demo_pid is not None, f"no demo process found under make; output:\n{self.output()}"
        t = time.monotonic()
        while time.monotonic() - t < timeout_s:
            if not _alive(self.demo_pid):
                for proc in (self.make, self.reader):
                    try:
                        proc.wait(timeout=30)
                    except subprocess.TimeoutExpired:
                        pass
                return time.monotonic() - t
            time.sleep(0.2)
        raise AssertionError(f"the demo was still running {timeout_s}s after the stop; "
                             f"its log:\n{self.demo_log()[-4000:]}")

    def demo_log(self) -> str:
        log = self.state_dir / "demo.log" if self.state_dir else None
        return log.read_text(errors="replace") if log and log.exists() else ""

    # -- what is left ---------------------------------------------------------------------
    def processes(self) -> List[str]:
        return [f"{pid} {cmd}" for pid, cmd in processes_naming(self.state_dir)]

    def ports(self) -> Set[int]:
        """Listening TCP ports of the demo's processes (and their children) right now."""
        pids = {pid for pid, _ in processes_naming(self.state_dir)}
        parents = {p: _ppid(p) for p in _all_pids()}
        grown = True
        while grown:  # and their descendants (a replica under conmon, GPUStack's children)
            more = {p for p, parent in parents.items() if parent in pids} - pids
            pids |= more
            grown = bool(more)
        return listening_ports(pids)

    def cleanup(self) -> None:
        """After a failed assertion: never leave a demo behind for the next tests."""
        if self.demo_pid and _alive(self.demo_pid):
            os.kill(self.demo_pid, signal.SIGTERM)
            deadline = time.monotonic() + 180
            while _alive(self.demo_pid) and time.monotonic() < deadline:
                time.sleep(0.5)
        for proc in (self.make, self.reader):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self.state_dir is not None:
            for pid, _ in processes_naming(self.state_dir):
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass


def assert_nothing_left(demo: PipedDemo, ports: Set[int], reason: str) -> None:
    """No process naming the state folder, none of the ports listening, only demo.log left, and
    the log saying why it stopped and that everything is gone."""
    assert demo.state_dir is not None
    log = demo.demo_log()
    assert f"[demo] stopping ({reason}" in log, log[-3000:]
    assert "everything it started is gone" in log, log[-3000:]
    left = demo.processes()
    assert not left, "\n".join(p[:200] for p in left)
    assert sorted(p.name for p in demo.state_dir.iterdir()) == ["demo.log"]
    still = set()
    for port in ports:
        try:
            httpx.get(f"http://127.0.0.1:{port}/", timeout=2)
            still.add(port)
        except httpx.TransportError:
            pass
    assert not still, f"ports still answering: {sorted(still)}"


def _all_pids() -> List[int]:
    return [int(e.name) for e in Path("/proc").iterdir() if e.name.isdigit()]


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def listening_ports(pids: Set[int]) -> Set[int]:
    inodes: Dict[str, int] = {}
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes[target[8:-1]] = pid
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports
