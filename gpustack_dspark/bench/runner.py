"""The load run behind `gpustack-dspark bench`: one OpenAI-compatible target (GPUStack's
`/v1` or a replica), a fixed count or a fixed duration of requests at a fixed concurrency,
streamed or not, with vLLM's speculative counters read from a `/metrics` before and after.

Bounded: every request has a timeout, no request starts after the duration, and the
request count is capped. Failures a user can act on (unreachable, auth, not an OpenAI
endpoint, unknown model) raise BenchError before any load is sent.
"""

import asyncio
import ipaddress
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional
from urllib.parse import urlsplit

import httpx

from gpustack_dspark.bench.load import Result, RunStats, acceptance, spec_counters

MAX_REQUESTS = 100_000


class BenchError(Exception):
    """Stops the run with a one-line message (no traceback)."""


@dataclass
class Settings:
    concurrency: int
    requests: Optional[int]
    duration_s: Optional[float]
    stream: bool
    warmup: int
    timeout_s: float
    body: Callable[[int, str], Dict[str, Any]]  # (index, model) -> request body
    check: Callable[[str], bool]  # format check of a reply's content
    api_key: Optional[str] = None
    progress: bool = False


@dataclass
class TargetRun:
    target: str
    model: str
    stats: RunStats
    spec: Dict[str, float] = field(default_factory=dict)  # acceptance figures; empty when not available
    metrics_source: str = ""  # where the counters came from, or why there are none


def normalize_target(url: str) -> str:
    """`http://host:port[/v1]` -> `http://host:port` (the client adds /v1/...)."""
    if not url.startswith(("http://", "https://")):
        raise BenchError(f"target {url!r} is not an http:// or https:// URL")
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _headers(api_key: Optional[str]) -> Dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


async def preflight(client: httpx.AsyncClient, target: str, model: Optional[str], api_key: Optional[str]) -> str:
    """Checks the target answers like an OpenAI server; returns the model to use."""
    try:
        response = await client.get(f"{target}/v1/models", headers=_headers(api_key), timeout=15)
    except httpx.HTTPError as e:
        raise BenchError(f"cannot reach {target}: {type(e).__name__}: {e}") from None
    if response.status_code in (401, 403):
        hint = "check --api-key" if api_key else "pass --api-key KEY or set GPUSTACK_API_KEY"
        raise BenchError(f"{target} rejected the request ({response.status_code}, authentication): {hint}")
    try:
        listed = response.json()
        names = [m["id"] for m in listed["data"]]
    except (ValueError, KeyError, TypeError):
        kind = response.headers.get("content-type", "no content type")
        raise BenchError(f"{target} is not an OpenAI-compatible endpoint: GET /v1/models -> "
                         f"{response.status_code} ({kind})") from None
    if response.status_code != 200:
        raise BenchError(f"{target}: GET /v1/models -> {response.status_code}: {response.text[:200]}")
    if model:
        if names and model not in names:
            raise BenchError(f"{target} does not serve model {model!r}; it serves: {', '.join(names)}")
        return model
    if len(names) == 1:
        return names[0]
    raise BenchError(f"pass --model: {target} serves {', '.join(names) or 'no models'}")


async def read_counters(client: httpx.AsyncClient, urls: List[str], model: str,
                        api_key: Optional[str]) -> Optional[Dict[str, float]]:
    """vLLM's speculative counters for `model`, summed over `urls`; None if none expose them."""
    totals: Dict[str, float] = {}
    found = False
    for url in urls:
        try:
            response = await client.get(url, headers=_headers(api_key), timeout=15)
        except httpx.HTTPError:
            continue
        if response.status_code != 200:
            continue
        counters = spec_counters(response.text, model)
        found = found or bool(counters)
        for key, value in counters.items():
            totals[key] = totals.get(key, 0.0) + value
    return totals if found else None


class Progress:
    """A one-line progress bar on stderr (requests done, or time elapsed in duration mode)."""

    def __init__(self, label: str, total: Optional[int], duration_s: Optional[float], enabled: bool):
        self.label, self.total, self.duration_s, self.enabled = label, total, duration_s, enabled
        self.done = self.failed = 0
        self.started = time.perf_counter()
        self._last = 0.0

    def tick(self, ok: bool) -> None:
        self.done += 1
        self.failed += 0 if ok else 1
        now = time.perf_counter()
        if self.enabled and (now - self._last > 0.2 or self.done == self.total):
            self._last = now
            self._draw(now)

    def _draw(self, now: float) -> None:
        elapsed = now - self.started
        fraction = (self.done / self.total) if self.total else min(1.0, elapsed / (self.duration_s or 1))
        bar = "#" * int(fraction * 30)
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {self.done}{'/' + str(self.total) if self.total else ''} "
                         f"requests, {self.failed} failed, {elapsed:5.1f} s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            self._draw(time.perf_counter())
            sys.stderr.write("\n")
            sys.stderr.flush()


async def _one(client: httpx.AsyncClient, target: str, body: Dict[str, Any], settings: Settings) -> Result:
    return await request_once(client, target, body, settings.stream, settings.api_key, settings.timeout_s)


async def request_once(client: httpx.AsyncClient, target: str, body: Dict[str, Any], stream: bool = True,
                       api_key: Optional[str] = None, timeout_s: float = 300.0) -> Result:
    """One chat completion to `target` (`http://host:port`): streamed (with usage, the time to
    the first content) or not; never raises for what the server or the network did."""
    started = time.perf_counter()
    headers = _headers(api_key)
    try:
        if not stream:
            response = await client.post(f"{target}/v1/chat/completions", json=body, headers=headers,
                                         timeout=timeout_s)
            latency = time.perf_counter() - started
            if response.status_code != 200:
                return Result(latency, response.status_code, error=f"HTTP {response.status_code}: {response.text[:200]}")
            data = response.json()
            choice = data["choices"][0]
            return Result(latency, 200, int((data.get("usage") or {}).get("completion_tokens") or 0),
                          choice["message"]["content"] or "", finish_reason=choice.get("finish_reason") or "")
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with client.stream("POST", f"{target}/v1/chat/completions", json=body, headers=headers,
                                 timeout=timeout_s) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", "replace")
                return Result(time.perf_counter() - started, response.status_code,
                              error=f"HTTP {response.status_code}: {text[:200]}")
            return await _read_stream(response, started)
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError) as e:
        return Result(time.perf_counter() - started, 0, error=f"{type(e).__name__}: {str(e)[:200]}")


async def _read_stream(response: httpx.Response, started: float) -> Result:
    parts: List[str] = []
    ttft: Optional[float] = None
    usage_tokens: Optional[int] = None
    chunks = 0
    error = ""
    finish_reason = ""
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            break
        event = json.loads(data)
        if "error" in event:
            error = str(event["error"])[:200]
            continue
        if event.get("usage"):
            usage_tokens = int(event["usage"].get("completion_tokens") or 0)
        for choice in event.get("choices") or []:
            finish_reason = choice.get("finish_reason") or finish_reason
            piece = (choice.get("delta") or {}).get("content")
            if piece:
                chunks += 1
                parts.append(piece)
                if ttft is None:
                    ttft = time.perf_counter() - started
    latency = time.perf_counter() - started
    if error:
        return Result(latency, 0, error=f"stream error: {error}")
    return Result(latency, 200, usage_tokens if usage_tokens is not None else chunks, "".join(parts), ttft_s=ttft,
                  finish_reason=finish_reason)


async def run_target(target: str, model: Optional[str], settings: Settings, metrics_urls: Optional[List[str]],
                     label: str = "") -> TargetRun:
    target = normalize_target(target)
    limits = httpx.Limits(max_connections=settings.concurrency + 4, max_keepalive_connections=settings.concurrency + 4)
    async with httpx.AsyncClient(limits=limits) as client:
        model = await preflight(client, target, model, settings.api_key)
        urls = metrics_urls if metrics_urls else [f"{target}/metrics"]
        for i in range(settings.warmup):  # not counted: fills caches, compiles grammars
            await _one(client, target, settings.body(-1 - i, model), settings)
        before = await read_counters(client, urls, model, settings.api_key)
        results: List[Result] = []
        progress = Progress(label or target, settings.requests, settings.duration_s, settings.progress)
        total = settings.requests if settings.requests is not None else MAX_REQUESTS
        deadline = (time.perf_counter() + settings.duration_s) if settings.duration_s else None
        counter = iter(range(total))

        async def worker() -> None:
            for index in counter:
                if deadline is not None and time.perf_counter() >= deadline:
                    return
                result = await _one(client, target, settings.body(index, model), settings)
                result.index = index
                results.append(result)
                progress.tick(result.status == 200)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(settings.concurrency)))
        stats = RunStats(time.perf_counter() - started, results)
        progress.close()
        after = await read_counters(client, urls, model, settings.api_key)
    stats.count_format_errors(settings.check)
    run = TargetRun(target, model, stats, metrics_source=", ".join(urls))
    if before is not None and after is not None:
        run.spec = acceptance(before, after)
    else:
        run.metrics_source = (f"no vLLM speculative-decoding counters for {model} at {', '.join(urls)} "
                              "(pass --metrics-url: a replica's /metrics or a GPUStack worker's /metrics/raw)")
    return run
