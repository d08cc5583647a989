"""The whole path on one machine, shared by `make demo` and the end-to-end test:
Podman (private store, sandbox fixes) -> the CPU DSpark image built locally -> PostgreSQL ->
GPUStack server with the plugin -> a CPU worker labelled for JSON inference that deploys
with Podman -> the demo model's replicas, RUNNING once warm. Loopback only: GPUStack's
processes bind 127.0.0.1 (devstack/loopback), replicas use host networking on {{worker_ip}}.
"""

import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple


from gpustack_dspark.backend_ids import replica_info, replica_url  # noqa: F401 (re-exported for tests and the demo)
from gpustack_dspark.devstack import podman as podman_host
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.demo_model import DEMO_MODEL_FILE, apply_model_file, model_name_and_replicas
from gpustack_dspark.devstack.postgres import Postgres, start_postgres
from gpustack_dspark.devstack.replica import REPO_ROOT
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.worker import GPUStackWorker, free_port_range, join_cpu_worker
from gpustack_dspark.settings import PluginSettings

BUILD_SCRIPT = REPO_ROOT / "backend_images" / "build-local.sh"
RUNNING = "running"


def build_cpu_image(config: podman_host.PodmanConfig, log_path: Path, timeout_s: float = 1800) -> str:
    """backend_images/build-local.sh with this host's Podman settings; returns the image."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        result = subprocess.run([str(BUILD_SCRIPT)], env={**os.environ, **config.env}, stdout=subprocess.PIPE,
                                stderr=log, timeout=timeout_s)
    if result.returncode != 0:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"building the CPU DSpark image failed (exit {result.returncode}); "
                           f"log {log_path}:\n{tail}")
    return result.stdout.decode().strip().splitlines()[-1]


@dataclass
class Sample:
    """One look at an instance: GPUStack's state and, when it answers, the replica's own phase."""
    t: float
    instance_id: int
    state: str
    restart_count: int
    replica_phase: Optional[str]


class InstanceWatch(threading.Thread):
    """Polls the named model's instances (and each replica's /dspark/info) and keeps every
    sample; started before the model exists, so it sees every state from the first."""

    def __init__(self, api: GPUStackAPI, model_name: str, interval_s: float = 0.5):
        super().__init__(name="dspark-instance-watch", daemon=True)
        self.api, self.model_name, self.interval_s = api, model_name, interval_s
        self.samples: List[Sample] = []
        self.latest: Dict[int, Dict[str, Any]] = {}
        self._halt = threading.Event()
        self._lock = threading.Lock()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            try:
                instances = [i for i in self.api.items("/v2/model-instances") if i.get("model_name") == self.model_name]
            except Exception:
                continue
            for inst in instances:
                phase = replica_phase(inst)
                with self._lock:
                    self.latest[inst["id"]] = inst
                    self.samples.append(Sample(time.time(), inst["id"], str(inst["state"]).lower(),
                                               inst.get("restart_count") or 0, phase))

    def snapshot(self) -> Tuple[List[Sample], Dict[int, Dict[str, Any]]]:
        with self._lock:
            return list(self.samples), dict(self.latest)

    def transitions(self, instance_id: int) -> List[Tuple[float, str]]:
        out: List[Tuple[float, str]] = []
        for s in self.snapshot()[0]:
            if s.instance_id == instance_id and (not out or out[-1][1] != s.state):
                out.append((s.t, s.state))
        return out

    def wait(self, predicate: Callable[[Dict[int, Dict[str, Any]]], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate(self.snapshot()[1]):
                return
            time.sleep(0.5)
        raise TimeoutError(f"{what}: not after {timeout_s:.0f}s; instances: "
                           + "; ".join(f"{i['name']} {i['state']} {i.get('state_message') or ''}"[:300]
                                       for i in self.snapshot()[1].values()))


def replica_phase(instance: Dict[str, Any]) -> Optional[str]:
    info = replica_info(instance)
    return info.get("phase") if info else None


@dataclass
class ContainerStack:
    base: Path
    api_port: Optional[int] = None
    admin_password: str = "dspark-admin-1"
    worker_name: str = "json-cpu-1"
    say: Callable[[str], None] = print
    phases: Dict[str, float] = field(default_factory=dict)
    image: Optional[str] = None
    podman: Optional[podman_host.PodmanConfig] = None       # the machine's store (images)
    run_podman: Optional[podman_host.PodmanConfig] = None   # this run's containers
    service: Optional[podman_host.PodmanService] = None
    postgres: Optional[Postgres] = None
    server: Optional[GPUStackServer] = None
    worker: Optional[GPUStackWorker] = None
    api: Optional[GPUStackAPI] = None
    model: Optional[Dict[str, Any]] = None
    watch: Optional[InstanceWatch] = None

    def _phase(self, name: str, started: float) -> None:
        self.phases[name] = round(time.monotonic() - started, 1)
        self.say(f"[stack] {name}: {self.phases[name]}s")

    def start_platform(self) -> "ContainerStack":
        """Everything up to a READY, labelled worker that deploys with Podman."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.podman = podman_host.prepare()
        if self.podman.fixes.reasons:
            self.say("[stack] Podman fixes for this host: " + "; ".join(self.podman.fixes.reasons))
        t = time.monotonic()
        self.image = build_cpu_image(self.podman, self.base / "image-build.log")
        self._phase("image", t)
        t = time.monotonic()
        self.postgres = start_postgres(self.base / "postgres")
        self._phase("postgres", t)
        t = time.monotonic()
        kwargs = {"api_port": self.api_port} if self.api_port else {}
        self.server = GPUStackServer(data_dir=self.base / "server", database_url=self.postgres.url,
                                     admin_password=self.admin_password,
                                     extra_args=["--dspark-cpu-image", self.image], **kwargs)
        self.server.start()
        self.api = GPUStackAPI(self.server.url, self.server.create_api_key("dspark-stack"))
        self._phase("server", t)
        t = time.monotonic()
        # Per run: its own service socket and container store (images shared, read-only).
        self.run_podman = self.podman.for_run(self.base / "containers")
        self.service = podman_host.PodmanService(self.run_podman, self.base / "podman.log",
                                                 self.base / "podman.sock").start()
        self.worker = join_cpu_worker(self.api, self.server.url, self.worker_name, self.base / "worker",
                                      labels=dict([PluginSettings().json_label]),
                                      extra_env=self.service.worker_env(),
                                      service_port_range=free_port_range())
        self._phase("worker", t)
        return self

    def deploy(self, model_file: Path = DEMO_MODEL_FILE, timeout_s: float = 600) -> Dict[str, Any]:
        """`gpustack-dspark apply -f model_file`; returns once every replica is RUNNING."""
        name, replicas = model_name_and_replicas(model_file)
        self.watch = InstanceWatch(self.api, name)
        self.watch.start()
        t = time.monotonic()
        apply_model_file(model_file, self.server.url, self.api.api_key, self.base / "apply.log")
        self.model = next(m for m in self.api.items("/v2/models") if m["name"] == name)
        self.wait_running(replicas, timeout_s)
        self._phase("replicas_running", t)
        return self.model

    def wait_running(self, replicas: int, timeout_s: float) -> None:
        def ok(latest):
            failed = [i for i in latest.values() if str(i["state"]).lower() == "error"
                      and (i.get("restart_count") or 0) >= 3]
            if failed:
                raise RuntimeError(f"replica {failed[0]['name']} keeps failing: {failed[0].get('state_message')}\n"
                                   f"{self.worker.process.log_tail(3000)}")
            return len(latest) == replicas and all(str(i["state"]).lower() == RUNNING for i in latest.values())
        self.watch.wait(ok, timeout_s, f"{replicas} RUNNING replicas")

    def instances(self) -> List[Dict[str, Any]]:
        return sorted(self.watch.snapshot()[1].values(), key=lambda i: i["id"])

    def containers(self) -> List[Dict[str, Any]]:
        """Containers of this run's workloads (named after its model's instances)."""
        out = self.run_podman.run("ps", "-a", "--format", "json", check=False)
        if out.returncode != 0 or not out.stdout.strip():
            return []
        names = self._instance_names()
        return [c for c in json.loads(out.stdout)
                if any(n.startswith(tuple(names)) for n in c.get("Names", []))] if names else []

    def _instance_names(self) -> Tuple[str, ...]:
        if self.watch is None:
            return ()
        return tuple(i["name"] for i in self.watch.snapshot()[1].values())

    def delete_model(self, timeout_s: float = 120) -> float:
        """Delete the model through the API; returns the seconds until its containers were gone."""
        names = self._instance_names()
        t = time.monotonic()
        self.api.client.delete(f"/v2/models/{self.model['id']}")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self._containers_named(names):
            time.sleep(0.5)
        if self.watch is not None:
            self.watch.stop()
        self.model = None
        left = self._containers_named(names)
        if left:
            raise RuntimeError(f"containers left {timeout_s}s after deleting the model: {left}")
        return round(time.monotonic() - t, 1)

    def _containers_named(self, names: Tuple[str, ...]) -> List[str]:
        out = self.run_podman.run("ps", "-a", "--format", "{{.Names}}", check=False)
        return [n for n in out.stdout.split() if names and n.startswith(names)]

    def _remove_all_containers(self) -> None:
        # Podman 4.3's `rm -a` can trip over a pause container whose run container goes in
        # the same call ("has dependent containers"): repeat until the store is empty.
        for _ in range(3):
            self.run_podman.run("rm", "-a", "-f", "-t", "0", check=False, timeout_s=120)
            if not self.run_podman.run("ps", "-a", "-q", check=False).stdout.strip():
                return
        raise RuntimeError("containers left: " + self.run_podman.run("ps", "-a", "--format", "{{.Names}}",
                                                                     check=False).stdout.replace("\n", " "))

    def stop(self) -> List[str]:
        """Stop and remove everything this stack started, containers included; never raises.
        Returns what could not be cleaned up (empty when everything is gone)."""
        problems: List[str] = []
        steps = []
        if self.model is not None and self.api is not None:
            steps.append(("delete the model", lambda: self.delete_model(60)))
        if self.watch is not None:
            steps.append(("stop the watcher", self.watch.stop))
        if self.worker is not None:
            steps.append(("stop the worker", self.worker.stop))
        if self.run_podman is not None:  # this run's store holds only this run's containers
            steps.append(("remove leftover containers", self._remove_all_containers))
        if self.service is not None:
            steps.append(("stop podman system service", self.service.stop))
        if self.run_podman is not None:
            steps.append(("unmount this run's store", lambda: self.run_podman.run(
                "unmount", "-a", "-f", check=False)))
        if self.api is not None:
            steps.append(("close the API client", self.api.close))
        if self.server is not None:
            steps.append(("stop the server", self.server.stop))
        if self.postgres is not None:
            steps.append(("stop PostgreSQL", self.postgres.stop))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # keep going: the rest must still be cleaned up
                self.say(f"[stack] could not {what}: {e}")
                if what != "delete the model":  # the container sweep below covers that one
                    problems.append(f"{what}: {e}")
        return problems
