"""GPUStack model instances served by stand-in replicas (no container runtime here).

GPUStack's proxy sends a `/v1` request to the instance's worker (`worker.port`) with the
header `X-GPUStack-Model-Instance: model-<model>-<instance>.static`; the worker forwards
it to `worker_ip:ports[0]` if the instance is RUNNING on it. So a model is created
through the API with a worker selector nothing matches (the scheduler leaves its
instances pending and no worker tries to start them), and each instance is then set —
through `PUT /v2/model-instances/{id}` — to RUNNING on the real worker at a stand-in
replica's port. Everything else on the path is GPUStack's own.
"""

import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from gpustack_dspark.devstack.api import GPUStackAPI

STAND_IN_BACKEND = "StandIn-custom"
STAND_IN_VERSION = "v1-custom"
UNMATCHED_SELECTOR = {"dspark-stand-in": "never-scheduled"}


def ensure_stand_in_backend(api: GPUStackAPI) -> None:
    if any(b["backend_name"] == STAND_IN_BACKEND for b in api.items("/v2/inference-backends")):
        return
    api.post("/v2/inference-backends", {
        "backend_name": STAND_IN_BACKEND, "health_check_path": "/health",
        "version_configs": {STAND_IN_VERSION: {"image_name": "localhost/stand-in:1", "custom_framework": "cpu"}},
    })


def create_stand_in_model(api: GPUStackAPI, name: str, backend: str, backend_version: str, cluster_id: int,
                          worker: Dict[str, Any], ports: List[int], model_dir: Path,
                          timeout_s: float = 60, running: Optional[int] = None) -> Dict[str, Any]:
    """A model whose instances run on `worker` at `ports` (one instance per port); only the
    first `running` of them are set RUNNING (default all; the rest stay pending until
    `set_running`)."""
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    model = api.post("/v2/models", {
        "name": name, "source": "local_path", "local_path": str(model_dir),
        "backend": backend, "backend_version": backend_version, "cpu_offloading": True,
        "replicas": len(ports), "cluster_id": cluster_id, "worker_selector": UNMATCHED_SELECTOR,
        "enable_model_route": True,
    })
    deadline = time.monotonic() + timeout_s
    instances: List[Dict[str, Any]] = []
    while time.monotonic() < deadline:
        instances = [i for i in api.items("/v2/model-instances") if i["model_id"] == model["id"]]
        if len(instances) == len(ports):
            break
        time.sleep(0.5)
    else:
        raise TimeoutError(f"model {name}: {len(instances)} of {len(ports)} instances after {timeout_s}s")
    for instance, port in list(zip(sorted(instances, key=lambda i: i["id"]), ports))[:running]:
        set_running(api, instance, worker, port)
    return model


def set_running(api: GPUStackAPI, instance: Dict[str, Any], worker: Dict[str, Any], port: int) -> None:
    body = dict(instance)
    body.update(worker_id=worker["id"], worker_name=worker["name"], worker_ip="127.0.0.1",
                port=port, ports=[port], state="running", state_message="")
    response = api.client.put(f"/v2/model-instances/{instance['id']}", json=body)
    if response.status_code >= 400:
        raise RuntimeError(f"PUT model instance {instance['id']}: {response.status_code} {response.text[:300]}")


def instances_of(api: GPUStackAPI, model_id: int) -> List[Dict[str, Any]]:
    return sorted((i for i in api.items("/v2/model-instances") if i["model_id"] == model_id), key=lambda i: i["id"])


def wait_routable(base_url: str, api_key: str, model: str, timeout_s: float = 60,
                  body: Optional[Dict[str, Any]] = None) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.post(f"{base_url}/v1/chat/completions", headers={"Authorization": f"Bearer {api_key}"},
                              json=body or {"model": model, "messages": [{"role": "user", "content": "hi"}],
                                            "response_format": {"type": "json_object"}, "max_tokens": 4},
                              timeout=10)
            if last.status_code == 200:
                return
        except httpx.HTTPError as e:
            last = e
        time.sleep(0.5)
    raise TimeoutError(f"model {model} not routable after {timeout_s}s: "
                       f"{getattr(last, 'status_code', last)} {getattr(last, 'text', '')[:300]}")


class RunningStateKeeper:
    """Stands in for the worker's instance-state sync, which cannot run without a container
    runtime (it raises "No available deployer" every pass). When the server briefly marks
    the worker unreachable — a slow health answer on a busy 2-core machine is enough — it
    sets the instances UNREACHABLE, and only that sync would set them back to RUNNING.
    This thread does it instead, every `interval_s`, for the instances it was given."""

    def __init__(self, api: GPUStackAPI, worker: Dict[str, Any], interval_s: float = 2.0):
        import threading

        self.api, self.worker, self.interval_s = api, worker, interval_s
        self.ports: Dict[int, int] = {}  # instance id -> port
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stand-in-state-keeper", daemon=True)

    def watch(self, model_id: int) -> None:
        for instance in instances_of(self.api, model_id):
            if instance["ports"]:
                self.ports[instance["id"]] = instance["ports"][0]

    def start(self) -> "RunningStateKeeper":
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                for instance in self.api.items("/v2/model-instances"):
                    port = self.ports.get(instance["id"])
                    if port and instance["state"] != "running":
                        set_running(self.api, instance, self.worker, port)
            except Exception:  # the server may be restarting; try again next pass
                pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
