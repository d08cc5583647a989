"""GPUStack's model REST API as the model subcommands use it (httpx; GPUStack 2.3 routes).

The CLI cannot use GPUStack's Python client (`gpustack.client.ClientSet`): that would make
the CLI depend on the whole GPUStack server package. These are the same REST calls.
"""

from typing import Any, Dict, List, Optional

import httpx

from gpustack_dspark.cli.client import CLIError, GPUStack


class ModelsAPI(GPUStack):
    def _all(self, path: str, **params) -> List[Dict[str, Any]]:
        found, page = [], 1
        while True:
            body = self.request("GET", path, params={**params, "page": page, "perPage": 100})
            found.extend(body["items"])
            if page >= int((body.get("pagination") or {}).get("totalPage") or 1):
                return found
            page += 1

    def models(self) -> List[Dict[str, Any]]:
        return self._all("/v2/models")

    def model(self, name: str) -> Optional[Dict[str, Any]]:
        return next((m for m in self.models() if m["name"] == name), None)

    def instances(self, model_id: Optional[int] = None) -> List[Dict[str, Any]]:
        params = {"model_id": model_id} if model_id is not None else {}
        items = self._all("/v2/model-instances", **params)
        # Filter here as well: the route's query filter is not part of the documented API.
        return [i for i in items if model_id is None or i.get("model_id") == model_id]

    def clusters(self) -> List[Dict[str, Any]]:
        return self._all("/v2/clusters")

    def import_documents(self, content: str, dry_run: bool, cluster_id: Optional[int] = None,
                         overwrite: Optional[List[str]] = None) -> Dict[str, Any]:
        body: Dict[str, Any] = {"content": content, "dry_run": dry_run, "overwrite": list(overwrite or [])}
        if cluster_id is not None:
            body["cluster_id"] = cluster_id
        return self.request("POST", "/v2/models/import", json=body)

    def export_document(self, model_ids: List[int]) -> str:
        try:
            response = self._client.post("/v2/models/export", json={"ids": model_ids})
        except httpx.HTTPError as e:
            raise CLIError(f"cannot reach GPUStack at {self.server}: {e}") from None
        if response.status_code >= 400:
            raise CLIError(f"POST /v2/models/export -> {response.status_code}: {response.text[:300]}")
        return response.text

    def dspark_status(self) -> Optional[Dict[str, Any]]:
        """The plugin's status, or None when the server has no DSpark plugin (404)."""
        try:
            response = self._client.get("/v2/dspark/status")
        except httpx.HTTPError as e:
            raise CLIError(f"cannot reach GPUStack at {self.server}: {e}") from None
        if response.status_code == 200:
            return response.json()
        return None
