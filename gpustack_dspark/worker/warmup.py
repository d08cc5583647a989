"""The warmup gate's driver: once vLLM answers /health, send N typical requests at
concurrency C through the replica's own HTTP front door (so the JSON default, the grammar
compile and the speculative path are all exercised), then mark the replica ready.

A failed request or the timeout leaves the replica not ready (503) with the reason; GPUStack
never routes to it. The timeout counts from vLLM's first healthy answer, not from process
start: loading a large checkpoint is not warmup.
"""

import asyncio
import json
import threading
import time
from typing import Any, Dict, List, Optional

from gpustack_dspark import bounded
from gpustack_dspark.knobs import KnobError
from gpustack_dspark.worker import state as worker_state

HEALTH_POLL_S = 0.5
DEFAULT_MAX_TOKENS = 96
BUILTIN_PROMPTS = (
    "Generate one order as JSON with user_id, action, amount and timestamp.",
    "Reply with a JSON object.",
    "Create an order record for user 42: buy 19.99.",
    "Return a JSON object with the fields name, status, count.",
)


def load_warmup_file(path: str) -> List[Dict[str, Any]]:
    """JSONL: one chat request per line ({"messages": [...], ...} or {"prompt": "..."})."""
    flag, allowed = "--dspark-warmup-file", "a JSONL file: one {\"messages\": [...]} or {\"prompt\": \"...\"} per line"
    try:
        lines = bounded.read_text(path, bounded.WARMUP_FILE).splitlines()
    except bounded.BoundedError as e:
        raise KnobError(flag, path, allowed, str(e)) from None
    requests: List[Dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = bounded.loads_json(line, bounded.WARMUP_FILE)
        except bounded.BoundedError as e:
            raise KnobError(flag, path, allowed, f"line {number}: {e.problem}") from None
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            item = {k: v for k, v in item.items() if k != "prompt"} | {
                "messages": [{"role": "user", "content": item["prompt"]}]}
        if not (isinstance(item, dict) and isinstance(item.get("messages"), list) and item["messages"]):
            raise KnobError(flag, path, allowed, f"line {number} has neither messages nor prompt")
        requests.append(item)
    if not requests:
        raise KnobError(flag, path, allowed, "the file has no requests")
    return requests


def warmup_bodies(templates: List[Dict[str, Any]], count: int) -> List[Dict[str, Any]]:
    """`count` request bodies cycling through the templates (pure)."""
    if not templates:
        templates = [{"messages": [{"role": "user", "content": p}]} for p in BUILTIN_PROMPTS]
    bodies = []
    for i in range(count):
        body = dict(templates[i % len(templates)])
        body.setdefault("max_tokens", DEFAULT_MAX_TOKENS)
        body.setdefault("temperature", 0)
        bodies.append(body)
    return bodies


class Warmup(threading.Thread):
    def __init__(self, state: worker_state.WorkerState, base_url: str, templates: List[Dict[str, Any]],
                 api_key: Optional[str] = None) -> None:
        super().__init__(name="dspark-warmup", daemon=True)
        self.state, self.base_url, self.templates, self.api_key = state, base_url.rstrip("/"), templates, api_key

    def run(self) -> None:
        try:
            asyncio.run(self._run())
        except Exception as e:  # the gate must say why, never hang in "warming"
            self.state.move(worker_state.FAILED, f"warmup crashed: {type(e).__name__}: {e}")

    async def _run(self) -> None:
        import httpx

        state, progress = self.state, self.state.warmup
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        async with httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=None) as client:
            await self._wait_healthy(client)
            model = await self._served_model(client)
            bodies = warmup_bodies(self.templates, progress.requests)
            state.move(worker_state.WARMING, f"warming up: 0/{len(bodies)} requests")
            progress.started_at = time.time()
            try:
                await asyncio.wait_for(self._send_all(client, model, bodies), progress.timeout_s)
            except asyncio.TimeoutError:
                progress.finished_at = time.time()
                state.move(worker_state.FAILED, f"warmup timed out after {progress.timeout_s:g} s "
                                                f"({progress.succeeded}/{len(bodies)} requests done)")
                return
            progress.finished_at = time.time()
        if progress.errors:
            state.move(worker_state.FAILED, f"warmup failed: {len(progress.errors)} of {len(bodies)} "
                                            f"requests failed; first: {progress.errors[0]}")
            return
        progress.schemas_compiled = 1 if state.json_default else 0
        state.move(worker_state.READY, f"warm: {progress.succeeded} requests in {progress.duration_s()} s")

    async def _wait_healthy(self, client) -> None:
        while True:
            try:
                if (await client.get("/health", timeout=2.0)).status_code == 200:
                    return
            except Exception:
                pass
            await asyncio.sleep(HEALTH_POLL_S)

    async def _served_model(self, client) -> str:
        if self.state.served_model_name:
            return self.state.served_model_name
        response = await client.get("/v1/models", timeout=10.0)
        return response.json()["data"][0]["id"]

    async def _send_all(self, client, model: str, bodies: List[Dict[str, Any]]) -> None:
        progress = self.state.warmup
        queue: asyncio.Queue = asyncio.Queue()
        for body in bodies:
            queue.put_nowait(body)

        async def worker() -> None:
            while not queue.empty():
                body = queue.get_nowait()
                progress.sent += 1
                try:
                    response = await client.post("/v1/chat/completions", json={**body, "model": model},
                                                 headers={"X-DSpark-Warmup": "1"})
                    if response.status_code != 200:
                        progress.errors.append(f"HTTP {response.status_code}: {response.text[:200]}")
                        continue
                    choice = response.json()["choices"][0]
                    if self.state.json_default and choice.get("finish_reason") == "stop":
                        json.loads(choice["message"]["content"])  # a JSON replica must answer JSON
                    progress.succeeded += 1
                except Exception as e:
                    progress.errors.append(f"{type(e).__name__}: {str(e)[:200]}")
                self.state.move(worker_state.WARMING,
                                f"warming up: {progress.succeeded}/{len(bodies)} requests")

        await asyncio.gather(*(worker() for _ in range(max(1, min(progress.concurrency, len(bodies))))))
