"""Podman for the devstack: a private store outside the checkout, and the fixes a sandboxed
host needs, applied only when the host needs them (docs/containers.md explains each one).

The decisions (`plan_fixes`, `containers_conf`, `storage_conf`) are pure; `prepare` writes
the files, `PodmanService` runs `podman system service` for GPUStack's Podman deployer.
"""

import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from gpustack_dspark.devstack.processes import ManagedProcess

# One place per machine, never inside a checkout: CI builds the image once per machine.
DEFAULT_ROOT = Path("/var/lib/gpustack-dspark/podman")
# The pause/health image GPUStack's Podman deployer needs (it would pull gpustack/runtime:pause).
PAUSE_IMAGE = "localhost/gpustack-dspark-pause:1"

CAP_SYS_RESOURCE = 24
CONMON_NPROC = 32768


def state_root() -> Path:
    return Path(os.environ.get("DSPARK_PODMAN_ROOT") or DEFAULT_ROOT)


@dataclass(frozen=True)
class HostFacts:
    is_root: bool
    has_sys_resource: bool  # may raise rlimits and lower oom_score_adj
    cgroup_hybrid: bool     # cgroup v1 with a cgroup2 "unified" mount: crun refuses it
    nofile_hard: int
    nproc_hard: int
    runc: Optional[str]


@dataclass(frozen=True)
class Fixes:
    ulimits: Tuple[str, ...] = ()     # default_ulimits for containers.conf
    runtime: Optional[str] = None     # "runc" or "runc-wrapper"
    reasons: Tuple[str, ...] = ()


def _cap_eff() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            return int(line.split()[1], 16)
    return 0


def probe_host() -> HostFacts:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    cgroup = Path("/sys/fs/cgroup")
    hybrid = not (cgroup / "cgroup.controllers").exists() and (cgroup / "unified").is_dir()
    return HostFacts(is_root=os.geteuid() == 0, has_sys_resource=bool(_cap_eff() >> CAP_SYS_RESOURCE & 1),
                     cgroup_hybrid=hybrid, nofile_hard=nofile, nproc_hard=nproc, runc=shutil.which("runc"))


def _limit(value: int, fallback: int) -> int:
    return fallback if value == resource.RLIM_INFINITY else value


def plan_fixes(facts: HostFacts) -> Fixes:
    """Which workarounds this host needs (pure)."""
    ulimits: Tuple[str, ...] = ()
    runtime = None
    reasons: List[str] = []
    if not facts.has_sys_resource:
        # Podman raises nofile/nproc to its own defaults: setrlimit EPERM without the capability.
        nofile = _limit(facts.nofile_hard, 1048576)
        # conmon (Podman 4.3) runs with nproc 32768, so a container's limit cannot exceed it.
        nproc = min(_limit(facts.nproc_hard, CONMON_NPROC), CONMON_NPROC)
        ulimits = (f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}")
        reasons.append("no CAP_SYS_RESOURCE: container ulimits pinned to this host's hard limits")
        # runc writes the container's oomScoreAdj (the pause container asks for -998): EACCES.
        runtime = "runc-wrapper"
        reasons.append("no CAP_SYS_RESOURCE: an OCI runtime wrapper drops process.oomScoreAdj")
    if facts.cgroup_hybrid and runtime is None:
        runtime = "runc"
        reasons.append("cgroup v1/v2 hybrid: crun refuses it, runc is used")
    elif facts.cgroup_hybrid:
        reasons.append("cgroup v1/v2 hybrid: crun refuses it, runc is used (through the wrapper)")
    return Fixes(ulimits, runtime, tuple(reasons))


def containers_conf(fixes: Fixes, runc: Optional[str], wrapper: Path) -> str:
    lines = ["# written by gpustack_dspark.devstack.podman; see docs/containers.md", "[containers]"]
    if fixes.ulimits:
        lines.append("default_ulimits = [" + ", ".join(f'"{u}"' for u in fixes.ulimits) + "]")
    lines.append("[engine]")
    if fixes.runtime == "runc-wrapper":
        lines += ['runtime = "dspark-runc"', "[engine.runtimes]", f'dspark-runc = ["{wrapper}"]']
    elif fixes.runtime == "runc":
        lines += ['runtime = "runc"', "[engine.runtimes]", f'runc = ["{runc}"]']
    return "\n".join(lines) + "\n"


def storage_conf(graphroot: Path, runroot: Path, image_store: Optional[Path] = None) -> str:
    text = ("# written by gpustack_dspark.devstack.podman; see docs/containers.md\n"
            f'[storage]\ndriver = "overlay"\ngraphroot = "{graphroot}"\nrunroot = "{runroot}"\n')
    if image_store is not None:
        text += f'[storage.options]\nadditionalimagestores = ["{image_store}"]\n'
    return text


# Deletes process.oomScoreAdj from the bundle's config.json on create/run, then execs the
# real runc; every other call (state, kill, delete: frequent) goes straight to runc.
_DROP_OOM_ADJ = """
import json, os, sys
args = sys.argv[1:]
for flag in ("--bundle", "-b"):
    if flag in args and args.index(flag) + 1 < len(args):
        path = os.path.join(args[args.index(flag) + 1], "config.json")
        spec = json.load(open(path))
        if spec.get("process", {}).pop("oomScoreAdj", None) is not None:
            json.dump(spec, open(path, "w"))
"""
_WRAPPER = """#!/bin/sh
# written by gpustack_dspark.devstack.podman; see docs/containers.md
for arg in "$@"; do
  case "$arg" in create|run) {python} -c '{drop}' "$@" || exit 1; break;; esac
done
exec {runc} "$@"
"""


def _write(path: Path, text: str, mode: int = 0o644) -> None:
    if not path.exists() or path.read_text() != text:
        path.write_text(text)
    path.chmod(mode)


@dataclass
class PodmanConfig:
    root: Path
    fixes: Fixes
    env: Dict[str, str] = field(default_factory=dict)

    def for_run(self, run_dir: Path) -> "PodmanConfig":
        """A store of this run's own for containers, reading images from the machine's store.

        GPUStack's worker removes every GPUStack workload in its store that is not one of its
        own instances (worker/workload_cleaner.py): two runs sharing a store (a demo and the
        tests) would delete each other's replicas. Images stay shared and built once.
        """
        run_dir.mkdir(parents=True, exist_ok=True)
        conf = run_dir / "storage.conf"
        _write(conf, storage_conf(run_dir / "storage", run_dir / "run", image_store=self.root / "storage"))
        return PodmanConfig(self.root, self.fixes, {**self.env, "CONTAINERS_STORAGE_CONF": str(conf)})

    def run(self, *args: str, check: bool = True, timeout_s: float = 120,
            input_text: Optional[str] = None) -> subprocess.CompletedProcess:
        result = subprocess.run(["podman", *args], env={**os.environ, **self.env}, capture_output=True,
                                text=True, timeout=timeout_s, input=input_text)
        if check and result.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")
        return result


def prepare(root: Optional[Path] = None) -> PodmanConfig:
    """Write the private Podman configuration for this host; clear errors when Podman can't work."""
    root = root or state_root()
    facts = probe_host()
    if shutil.which("podman") is None:
        raise RuntimeError("podman is not installed: run scripts/install-system-packages.sh as root "
                           "(apt-get install -y podman runc debootstrap)")
    if not facts.is_root:
        raise RuntimeError("the devstack runs rootful Podman and needs root (GPUStack's worker starts "
                           "privileged containers); run as root")
    fixes = plan_fixes(facts)
    if fixes.runtime and not facts.runc:
        raise RuntimeError("this host needs runc for Podman (" + "; ".join(fixes.reasons) + "): apt-get install -y runc")
    conf = root / "conf"
    for sub in (conf, root / "storage", root / "run"):
        sub.mkdir(parents=True, exist_ok=True)
    wrapper = conf / "runc-wrapper"
    python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
    if fixes.runtime == "runc-wrapper":
        _write(wrapper, _WRAPPER.format(python=python, runc=facts.runc, drop=_DROP_OOM_ADJ), 0o755)
    _write(conf / "containers.conf", containers_conf(fixes, facts.runc, wrapper))
    _write(conf / "storage.conf", storage_conf(root / "storage", root / "run" / "storage"))
    env = {"CONTAINERS_CONF": str(conf / "containers.conf"),
           "CONTAINERS_STORAGE_CONF": str(conf / "storage.conf")}
    if fixes.ulimits:  # `podman build` ignores default_ulimits: build-local.sh passes --ulimit
        env["DSPARK_PODMAN_ULIMITS"] = " ".join(fixes.ulimits)
    return PodmanConfig(root, fixes, env)


class PodmanService:
    """`podman system service` on a private unix socket, for GPUStack's Podman deployer."""

    def __init__(self, config: PodmanConfig, log_path: Path, socket: Path):
        self.config = config
        self.log_path = log_path
        self.socket = socket
        self.process: Optional[ManagedProcess] = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout_s: float = 30) -> "PodmanService":
        self.socket.unlink(missing_ok=True)
        self.process = ManagedProcess(["podman", "system", "service", "--time=0", self.url],
                                      {**os.environ, **self.config.env}, self.log_path)
        deadline = time.monotonic() + timeout_s
        while not self.socket.exists():
            if not self.process.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"podman system service did not start:\n{self.process.log_tail()}")
            time.sleep(0.2)
        return self

    def worker_env(self) -> Dict[str, str]:
        """What a GPUStack worker needs to deploy with Podman here (no registry)."""
        return {**self.config.env, "GPUSTACK_RUNTIME_DEPLOY": "podman",
                "GPUSTACK_RUNTIME_PODMAN_HOST": self.url,
                "GPUSTACK_RUNTIME_PODMAN_PAUSE_IMAGE": PAUSE_IMAGE,
                "GPUSTACK_RUNTIME_PODMAN_UNHEALTHY_RESTART_IMAGE": PAUSE_IMAGE}

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None
