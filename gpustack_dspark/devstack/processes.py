"""Starting and stopping devstack processes: loopback-only environment, logs, process groups."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Mapping, Optional

LOOPBACK_DIR = Path(__file__).parent / "loopback"


def venv_bin(name: str) -> str:
    """A console script installed next to the running interpreter."""
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


# `gpustack start` through the interpreter, not its console script. GPUStack starts its children
# with multiprocessing's "spawn" (the worker's model-file Manager and download pool, one process
# per model instance it serves), and a spawned child re-imports the parent's main script: the
# console script's `from gpustack.main import main`, all of GPUStack's server with it. Run from
# `-c`, the main module has no file and the children import only what they run (the cost:
# docs/architecture.md, the devstack row).
GPUSTACK_MAIN = "import sys; from gpustack.main import main; sys.argv[0] = 'gpustack'; sys.exit(main())"


def gpustack_command() -> List[str]:
    """argv[:k] that runs GPUStack's CLI in this interpreter's environment (see GPUSTACK_MAIN)."""
    if (Path(sys.executable).parent / "gpustack").exists():
        return [sys.executable, "-c", GPUSTACK_MAIN]
    return ["gpustack"]


def loopback_env(extra_modules: List[str] = (), base: Optional[Mapping[str, str]] = None,
                 extra_paths: List[str] = ()) -> Dict[str, str]:
    env = dict(os.environ if base is None else base)
    paths = [str(LOOPBACK_DIR), *extra_paths]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["DSPARK_LOOPBACK_ONLY"] = "1"
    if extra_modules:
        env["DSPARK_SITECUSTOMIZE_EXTRA"] = ",".join(extra_modules)
    return env


class ManagedProcess:
    """A child in its own process group, its output in a log file."""

    def __init__(self, argv: List[str], env: Dict[str, str], log_path: Path):
        self.argv = argv
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")
        self.proc = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, timeout_s: float = 30) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + timeout_s
            while self.alive() and time.monotonic() < deadline:
                time.sleep(0.2)
        # Children (GPUStack's embedded processes) share the group: make sure none is left.
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(timeout=10)
        self._log.close()
