"""The CPU DSpark image, built locally: `backend_images/build-local.sh` run with this host's
Podman settings, its name known before it is built, its build startable in the background.

Why its own module, standard library only: `make demo` makes the image's Debian base while the
venvs install (`python -m gpustack_dspark.devstack image --base`, before any venv exists), and
the demo builds the image while PostgreSQL, GPUStack and the worker start. The image's name is
a hash of its inputs (build-local.sh --name), so GPUStack gets `--dspark-cpu-image` before the
image exists; nothing deploys it before the build is waited for.
"""

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Callable, List, Optional

from gpustack_dspark.devstack import podman as podman_host

BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "backend_images" / "build-local.sh"


def _is_progress(line: str) -> bool:
    """The build lines a person watching wants: the script's own and each Podman step."""
    return line.startswith("[build-local]") or bool(re.match(r"STEP \d+/\d+: ", line))


def _env(config: podman_host.PodmanConfig) -> dict:
    return {**os.environ, **config.env}


def cpu_image_name(config: podman_host.PodmanConfig, timeout_s: float = 60) -> str:
    """The name the image has once built (a hash of its inputs); builds nothing."""
    result = subprocess.run([str(BUILD_SCRIPT), "--name"], env=_env(config), capture_output=True, text=True,
                            timeout=timeout_s, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        raise RuntimeError(f"naming the CPU DSpark image failed (exit {result.returncode}): "
                           f"{result.stderr.strip()[-1000:]}")
    return result.stdout.strip().splitlines()[-1]


class ImageBuild:
    """One run of build-local.sh (the image, or with `base_only` its Debian and runtime bases).

    Its whole output goes to log_path; `on_line` gets each "[build-local] ..." and Podman
    "STEP n/m: ..." line as it comes. The script runs in a process group of its own: stop()
    ends it, and wait() ends it when the waiting caller is interrupted (a demo stopped
    during the build)."""

    def __init__(self, config: podman_host.PodmanConfig, log_path: Path,
                 on_line: Optional[Callable[[str], None]] = None, base_only: bool = False):
        self.config, self.log_path, self.on_line, self.base_only = config, log_path, on_line, base_only
        self.proc: Optional[subprocess.Popen] = None
        self._out: List[bytes] = []
        self._readers: List[threading.Thread] = []
        self._log = None

    def start(self) -> "ImageBuild":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        args = [str(BUILD_SCRIPT)] + (["--base"] if self.base_only else [])
        self.proc = subprocess.Popen(args, env=_env(self.config), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self._readers = [threading.Thread(target=self._pump, name="dspark-image-build-log", daemon=True),
                         threading.Thread(target=lambda: self._out.append(self.proc.stdout.read()), daemon=True)]
        for reader in self._readers:
            reader.start()
        return self

    def _pump(self) -> None:
        for raw in self.proc.stderr:
            self._log.write(raw)
            self._log.flush()
            line = raw.decode(errors="replace").rstrip()
            if self.on_line is not None and _is_progress(line):
                self.on_line(line[:160])

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait(self, timeout_s: float = 1800) -> str:
        """The image's name once built (base_only: the runtime base's)."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            raise RuntimeError(f"building the CPU DSpark image took over {timeout_s:.0f}s; log {self.log_path}")
        except BaseException:  # interrupted (a stop signal): end the build too
            self.stop()
            raise
        finally:
            self._close()
        if self.proc.returncode != 0:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"building the CPU DSpark image failed (exit {self.proc.returncode}); "
                               f"log {self.log_path}:\n{tail}")
        return b"".join(self._out).decode().strip().splitlines()[-1]

    def stop(self, grace_s: float = 20) -> None:
        if self.proc is None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=grace_s)
                break
            except subprocess.TimeoutExpired:
                continue
        self._close()

    def _close(self) -> None:
        for reader in self._readers:
            reader.join(timeout=10)
        if self._log is not None and not self._log.closed:
            self._log.close()


def build_cpu_image(config: podman_host.PodmanConfig, log_path: Path, timeout_s: float = 1800,
                    on_line: Optional[Callable[[str], None]] = None, base_only: bool = False) -> str:
    """build-local.sh to the end, in the foreground; returns the image."""
    return ImageBuild(config, log_path, on_line, base_only).start().wait(timeout_s)
