"""The whole path on one machine, shared by `make demo` and the end-to-end test:
Podman (private store, sandbox fixes) -> the CPU DSpark image built locally -> PostgreSQL ->
GPUStack server with the plugin -> a CPU worker labelled for JSON inference that deploys
with Podman -> the demo model's replicas, RUNNING once warm. Loopback only: GPUStack's
processes bind 127.0.0.1 (devstack/loopback), replicas use host networking on {{worker_ip}}.
"""

import json
import os
import re
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple


from gpustack_dspark.backend_ids import replica_info, replica_url  # noqa: F401 (re-exported for tests and the demo)
from gpustack_dspark.devstack import podman as podman_host
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.image import ImageBuild, cpu_image_name
from gpustack_dspark.devstack.demo_model import FIXTURE_MODEL_FILE, apply_model_file, model_name_and_replicas
from gpustack_dspark.devstack.ports import free_port, free_port_range
from gpustack_dspark.devstack.postgres import Postgres
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.worker import GPUStackWorker
from gpustack_dspark.settings import PluginSettings

RUNNING = "running"


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
    image_build: Optional[ImageBuild] = None
    podman: Optional[podman_host.PodmanConfig] = None       # the machine's store (images)
    run_podman: Optional[podman_host.PodmanConfig] = None   # this run's containers
    service: Optional[podman_host.PodmanService] = None
    postgres: Optional[Postgres] = None
    server: Optional[GPUStackServer] = None
    worker: Optional[GPUStackWorker] = None
    api: Optional[GPUStackAPI] = None
    model: Optional[Dict[str, Any]] = None
    watch: Optional[InstanceWatch] = None
    # The demo's heartbeat: (phase, a function that says how far it is) as each phase starts.
    on_phase: Optional[Callable[[str, Optional[Callable[[], str]]], None]] = None
    # stop()'s last sweep spares this session's processes (the demo sets the one it began in).
    spare_session: Optional[int] = None

    def _phase(self, name: str, started: float) -> None:
        self.phases[name] = round(time.monotonic() - started, 1)
        self.say(f"[stack] {name}: {self.phases[name]}s")

    def _begin(self, name: str, what: str, detail: Optional[Callable[[], str]] = None) -> float:
        """A phase starts: one line now; `on_phase` (the demo's heartbeat) gets its detail."""
        self.say(f"[stack] {name}: {what}")
        if self.on_phase is not None:
            self.on_phase(name, detail)
        return time.monotonic()

    def start_platform(self) -> "ContainerStack":
        """Everything up to a READY, labelled worker that deploys with Podman, and the image.

        The image builds in the background (its name, a hash of its inputs, is known at once)
        while PostgreSQL, GPUStack and the worker start: about 30 s of a cold ~110 s build
        hidden; GPUStack only needs the name until a replica is deployed, after this returns.
        Each part is recorded on the stack before it starts, so a stop at any moment (the
        demo's signals interrupt this) finds everything already started in stop()."""
        self.base.mkdir(parents=True, exist_ok=True)
        self.podman = podman_host.prepare()
        if self.podman.fixes.reasons:
            self.say("[stack] Podman fixes for this host: " + "; ".join(self.podman.fixes.reasons))
        build_log = self.base / "image-build.log"
        step = {"line": "checking the image's inputs", "t": time.monotonic()}

        def on_build_line(line: str) -> None:
            step.update(line=line, t=time.monotonic())
            self.say(f"[stack] image: {line}")

        image_t = time.monotonic()
        self.image = cpu_image_name(self.podman)
        self.say(f"[stack] image: finding or building {self.image} in the background (log {build_log})")
        self.image_build = ImageBuild(self.podman, build_log, on_line=on_build_line).start()
        t = self._begin("postgres", "starting PostgreSQL")
        self.postgres = Postgres(data_dir=self.base / "postgres", port=free_port())
        self.postgres.start()
        self._phase("postgres", t)
        kwargs = {"api_port": self.api_port} if self.api_port else {}
        self.server = GPUStackServer(data_dir=self.base / "server", database_url=self.postgres.url,
                                     admin_password=self.admin_password,
                                     extra_args=["--dspark-cpu-image", self.image], **kwargs)
        t = self._begin("server", f"starting GPUStack with the plugin on {self.server.url}",
                        lambda: f"waiting for {self.server.url}/healthz (log {self.server.log_path})")
        self.server.start()
        self.api = GPUStackAPI(self.server.url, self.server.create_api_key("dspark-stack"))
        self._phase("server", t)
        worker_dir = self.base / "worker"
        t = self._begin("worker", f"Podman service + CPU worker {self.worker_name}",
                        lambda: f"waiting for worker {self.worker_name} to be READY (log {worker_dir / 'worker.log'})")
        # Per run: its own service socket and container store (images shared, read-only).
        self.run_podman = self.podman.for_run(self.base / "containers")
        self.service = podman_host.PodmanService(self.run_podman, self.base / "podman.log", self.base / "podman.sock")
        self.service.start()
        cluster_id = self.api.ensure_cluster("dspark-local")
        self.worker = GPUStackWorker(name=self.worker_name, data_dir=worker_dir, server_url=self.server.url,
                                     token=self.api.registration_token(cluster_id),
                                     extra_env=self.service.worker_env(), service_port_range=free_port_range())
        self.worker.start(self.api, labels=dict([PluginSettings().json_label]))
        self._phase("worker", t)
        self._begin("image", f"waiting for the image build (log {build_log})",
                    lambda: f"{step['line'][:70]} ({time.monotonic() - step['t']:.0f}s; log {build_log})")
        built = self.image_build.wait()
        if built != self.image:
            raise RuntimeError(f"the image was built as {built}, not {self.image} (its inputs changed during "
                               "the build?); run again")
        self._phase("image", image_t)
        return self

    def _replica_detail(self) -> str:
        latest = self.watch.snapshot()[1] if self.watch is not None else {}
        if not latest:
            return "waiting for GPUStack to create the instances"
        return "; ".join(f"{i['name']} {str(i['state']).lower()}"
                         + (f" ({replica_phase(i)})" if str(i["state"]).lower() == "starting" and replica_phase(i) else "")
                         for i in sorted(latest.values(), key=lambda i: i["id"]))

    def deploy(self, model_file: Path = FIXTURE_MODEL_FILE, timeout_s: float = 600) -> Dict[str, Any]:
        """`gpustack-dspark apply -f model_file`; returns once every replica is RUNNING."""
        name, replicas = model_name_and_replicas(model_file)
        self.watch = InstanceWatch(self.api, name)
        self.watch.start()
        t = self._begin("replicas_running", f"gpustack-dspark apply -f {model_file}: {replicas} replicas, "
                        "RUNNING once warm", self._replica_detail)
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
        if self.image_build is not None and self.image_build.running:
            steps.append(("stop the image build", self.image_build.stop))
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
        steps.append(("end leftover processes", self._end_leftover_processes))
        for what, step in steps:
            try:
                step()
            except Exception as e:  # keep going: the rest must still be cleaned up
                self.say(f"[stack] could not {what}: {e}")
                if what != "delete the model":  # the container sweep below covers that one
                    problems.append(f"{what}: {e}")
        return problems

    def _end_leftover_processes(self) -> None:
        """Last step of stop(): any process still naming this run's folder (a server, worker,
        PostgreSQL or conmon whose orderly stop was cut short) gets SIGTERM, then SIGKILL.
        This process, its ancestors (a `make demo DEMO_ARGS=--state-dir ...` names the folder)
        and the session it was started from (a `tee` into it) are left alone."""
        left = processes_naming(self.base, spare_session=self.spare_session)
        if not left:
            return
        self.say(f"[stack] ending {len(left)} leftover process(es): " + ", ".join(f"{pid} {cmd[:60]}"
                                                                                for pid, cmd in left))
        for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            for pid, _ in left:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and any(_alive(pid) for pid, _ in left):
                time.sleep(0.2)
            left = [(pid, cmd) for pid, cmd in left if _alive(pid)]
            if not left:
                return
        raise RuntimeError("processes left: " + ", ".join(str(pid) for pid, _ in left))


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _ancestors(pid: int) -> List[int]:
    out = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            break
        out.append(pid)
    return out


def processes_naming(folder: Path, spare_session: Optional[int] = None) -> List[Tuple[int, str]]:
    """Live processes whose command line names `folder` (pid, command line), but for this
    process, its ancestors and, when given, the processes of session `spare_session`."""
    names = re.compile(re.escape(str(folder)) + r"(/|\s|$)")
    me = os.getpid()
    spared = {me, *_ancestors(me)}
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in spared:
            continue
        try:
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
            if not names.search(cmd) or not _alive(int(entry.name)):
                continue
            if spare_session is not None and os.getsid(int(entry.name)) == spare_session:
                continue
        except (OSError, ProcessLookupError):
            continue
        found.append((int(entry.name), cmd))
    return found
