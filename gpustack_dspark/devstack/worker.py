"""A real GPUStack CPU worker joined to a devstack server, on loopback."""

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.ports import free_port
from gpustack_dspark.devstack.processes import ManagedProcess, gpustack_command, loopback_env
from gpustack_dspark.devstack.worker_tools import seed_worker_tools


@dataclass
class GPUStackWorker:
    name: str
    data_dir: Path
    server_url: str
    token: str
    worker_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    extra_env: Dict[str, str] = field(default_factory=dict)
    # Replicas' ports ("41000-41063"); GPUStack's default range is shared by every worker on
    # the host, and with host networking two runs' replicas then collide.
    service_port_range: Optional[str] = None
    process: Optional[ManagedProcess] = None
    id: Optional[int] = None

    def argv(self) -> List[str]:
        return [
            *gpustack_command(), "start",
            "--server-url", self.server_url,
            "--token", self.token,
            "--worker-name", self.name,
            "--worker-ip", "127.0.0.1",
            "--advertise-address", "127.0.0.1",
            "--worker-port", str(self.worker_port),
            "--worker-metrics-port", str(self.metrics_port),
            "--data-dir", str(self.data_dir),
            "--disable-update-check",
            *(["--service-port-range", self.service_port_range] if self.service_port_range else []),
        ]

    def start(self, api: GPUStackAPI, timeout_s: float = 180,
              labels: Optional[Dict[str, str]] = None) -> "GPUStackWorker":
        seed_worker_tools()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**loopback_env(), **self.extra_env}
        self.process = ManagedProcess(self.argv(), env, self.data_dir / "worker.log")
        try:
            worker = api.wait_worker_ready(self.name, timeout_s, alive=self.process.alive)
        except Exception as e:
            raise RuntimeError(f"{e}\n{self.process.log_tail()}") from e
        self.id = worker["id"]
        if labels:
            api.set_labels([self.id], labels)
        return self

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


def join_cpu_worker(api: GPUStackAPI, server_url: str, name: str, data_dir: Path,
                    cluster: str = "dspark-local", labels: Optional[Dict[str, str]] = None,
                    timeout_s: float = 180, extra_env: Optional[Dict[str, str]] = None,
                    service_port_range: Optional[str] = None) -> GPUStackWorker:
    """`extra_env`: e.g. the Podman deployer's settings (devstack/podman.py)."""
    cluster_id = api.ensure_cluster(cluster)
    worker = GPUStackWorker(name=name, data_dir=data_dir, server_url=server_url,
                            token=api.registration_token(cluster_id), extra_env=dict(extra_env or {}),
                            service_port_range=service_port_range)
    return worker.start(api, timeout_s=timeout_s, labels=labels)
