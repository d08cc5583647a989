"""The few GPUStack API calls the devstack needs (httpx, admin API key)."""

import time
from typing import Any, Dict, List, Optional

import httpx


class GPUStackAPI:
    def __init__(self, base_url: str, api_key: str, timeout_s: float = 30):
        self.api_key = api_key
        self.client = httpx.Client(base_url=base_url, timeout=timeout_s,
                                   headers={"Authorization": f"Bearer {api_key}"})

    def close(self) -> None:
        self.client.close()

    def _ok(self, response: httpx.Response) -> Any:
        if response.status_code >= 400:
            raise RuntimeError(f"{response.request.method} {response.request.url.path} -> "
                               f"{response.status_code}: {response.text[:500]}")
        return response.json() if response.content else None

    def get(self, path: str, **params) -> Any:
        return self._ok(self.client.get(path, params=params or None))

    def post(self, path: str, body: Any) -> Any:
        return self._ok(self.client.post(path, json=body))

    def items(self, path: str) -> List[Dict[str, Any]]:
        return self.get(path, page=1, perPage=100)["items"]

    def ensure_cluster(self, name: str) -> int:
        for cluster in self.items("/v2/clusters"):
            if cluster["name"] == name:
                return cluster["id"]
        return self.post("/v2/clusters", {"name": name, "provider": "Docker"})["id"]

    def registration_token(self, cluster_id: int) -> str:
        return self.get(f"/v2/clusters/{cluster_id}/registration-token")["token"]

    def worker_by_name(self, name: str) -> Optional[Dict[str, Any]]:
        return next((w for w in self.items("/v2/workers") if w["name"] == name), None)

    def wait_worker_ready(self, name: str, timeout_s: float, alive=lambda: True) -> Dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        worker = None
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError(f"worker {name} exited before it was ready")
            worker = self.worker_by_name(name)
            if worker and str(worker.get("state", "")).lower() == "ready":
                return worker
            time.sleep(1)
        raise TimeoutError(f"worker {name} not ready after {timeout_s}s (last: {worker and worker.get('state')}, "
                           f"{worker and worker.get('state_message')})")

    def set_labels(self, worker_ids: List[int], labels: Dict[str, str]) -> Any:
        return self.post("/v2/workers/labels", {"worker_ids": worker_ids, "labels": labels})
