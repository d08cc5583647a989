"""A real `gpustack start --gateway-mode disabled` with the plugin, on loopback."""

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import httpx

from gpustack_dspark.devstack.ports import free_port
from gpustack_dspark.devstack.processes import ManagedProcess, gpustack_command, loopback_env

ADMIN_USER = "admin"


@dataclass
class GPUStackServer:
    data_dir: Path
    database_url: str
    admin_password: str = "dspark-admin-1"
    api_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    proxy_port: int = field(default_factory=free_port)
    extra_args: List[str] = field(default_factory=list)
    sitecustomize_extra: List[str] = field(default_factory=list)
    extra_pythonpath: List[str] = field(default_factory=list)
    extra_env: Dict[str, str] = field(default_factory=dict)
    process: Optional[ManagedProcess] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

    def argv(self) -> List[str]:
        return [
            *gpustack_command(), "start",
            "--data-dir", str(self.data_dir),
            "--database-url", self.database_url,
            "--gateway-mode", "disabled",
            "--api-port", str(self.api_port),
            "--metrics-port", str(self.metrics_port),
            "--proxy-port", str(self.proxy_port),
            "--advertise-address", "127.0.0.1",
            "--disable-update-check",
            "--disable-builtin-observability",
            "--bootstrap-password", self.admin_password,
            *self.extra_args,
        ]

    def start(self, timeout_s: float = 180) -> "GPUStackServer":
        self.data_dir.mkdir(parents=True, exist_ok=True)
        env = {**loopback_env(self.sitecustomize_extra, extra_paths=self.extra_pythonpath), **self.extra_env}
        self.process = ManagedProcess(self.argv(), env, self.log_path)
        self.wait_healthy(timeout_s)
        return self

    def wait_healthy(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.process.alive():
                raise RuntimeError(f"GPUStack server exited early:\n{self.process.log_tail()}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"GPUStack server not healthy after {timeout_s}s:\n{self.process.log_tail()}")

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def create_api_key(self, name: str = "dspark-tests") -> str:
        """Log in as the bootstrap admin and mint a non-expiring API key."""
        with httpx.Client(base_url=self.url, timeout=30) as client:
            login = client.post("/auth/login", data={"username": ADMIN_USER, "password": self.admin_password})
            login.raise_for_status()
            created = client.post("/v2/api-keys", json={"name": f"{name}-{time.time_ns()}", "expires_in": 0})
            created.raise_for_status()
            return created.json()["value"]
