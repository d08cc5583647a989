"""The HTTP side of the CLI: connection options and a small GPUStack API client (httpx)."""

import argparse
import os
from typing import Any, Dict, List, Optional

import httpx

SERVER_ENV = "GPUSTACK_SERVER_URL"
API_KEY_ENV = "GPUSTACK_API_KEY"


class CLIError(Exception):
    """A failure the user can act on; printed without a traceback."""


def connection_options() -> argparse.ArgumentParser:
    """Options shared by every subcommand that talks to a GPUStack server."""
    common = argparse.ArgumentParser(add_help=False)
    group = common.add_argument_group("GPUStack server")
    group.add_argument("--server", metavar="URL", default=os.environ.get(SERVER_ENV),
                       help=f"GPUStack server URL, like http://gpustack.example:80 (env {SERVER_ENV})")
    group.add_argument("--api-key", metavar="KEY", default=os.environ.get(API_KEY_ENV),
                       help=f"GPUStack API key (env {API_KEY_ENV})")
    return common


class GPUStack:
    def __init__(self, server: Optional[str], api_key: Optional[str], timeout_s: float = 30):
        if not server:
            raise CLIError(f"no GPUStack server given: pass --server URL or set {SERVER_ENV}")
        if not server.startswith(("http://", "https://")):
            raise CLIError(f"--server {server!r} is not an http:// or https:// URL")
        if not api_key:
            raise CLIError(f"no API key given: pass --api-key KEY or set {API_KEY_ENV}")
        self.server = server.rstrip("/")
        self._client = httpx.Client(base_url=self.server, timeout=timeout_s,
                                    headers={"Authorization": f"Bearer {api_key}"})

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "GPUStack":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def request(self, method: str, path: str, **kwargs) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.HTTPError as e:
            raise CLIError(f"cannot reach GPUStack at {self.server}: {e}") from None
        if response.status_code == 401:
            raise CLIError(f"GPUStack at {self.server} rejected the API key (401)")
        if response.status_code >= 400:
            raise CLIError(f"{method} {path} -> {response.status_code}: {response.text[:300]}")
        return response.json() if response.content else None

    def workers(self) -> List[Dict[str, Any]]:
        found, page = [], 1
        while True:
            body = self.request("GET", "/v2/workers", params={"page": page, "perPage": 100})
            found.extend(body["items"])
            pagination = body.get("pagination") or {}
            if page >= int(pagination.get("totalPage") or 1):
                return found
            page += 1
