"""An async OpenAI-compatible load generator and the figures it reports (tok/s, P50/P99,
format errors). Pure statistics are separate from the HTTP loop so they can be tested."""

import asyncio
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

import httpx


@dataclass
class Result:
    latency_s: float
    status: int
    output_tokens: int = 0
    content: str = ""
    error: str = ""
    ttft_s: Optional[float] = None  # streamed requests: time to the first content
    finish_reason: str = ""  # "length": cut at max_tokens, so not a format error of its own
    index: int = -1  # which request of the run (the body's index), where the runner knows it


@dataclass
class RunStats:
    wall_s: float
    results: List[Result] = field(default_factory=list)
    format_errors: int = 0

    @property
    def ok(self) -> List[Result]:
        return [r for r in self.results if r.status == 200]

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.ok)

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    def latency_percentile(self, q: float) -> float:
        return percentile([r.latency_s for r in self.ok], q)

    @property
    def truncated(self) -> int:
        """Answered replies cut at max_tokens (finish_reason "length")."""
        return sum(1 for r in self.ok if r.finish_reason == "length")

    def count_format_errors(self, check: Callable[[str], bool]) -> None:
        """Replies that fail `check`, not counting those cut at max_tokens: a cut reply is
        incomplete by the client's choice, counted in `truncated` instead."""
        self.format_errors = sum(1 for r in self.ok if r.finish_reason != "length" and not check(r.content))

    @property
    def format_error_rate(self) -> float:
        return self.format_errors / len(self.ok) if self.ok else 0.0


def percentile(values: List[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


async def run_load(base_url: str, bodies: List[Dict[str, Any]], concurrency: int,
                   check: Optional[Callable[[str], bool]] = None, api_key: Optional[str] = None,
                   timeout_s: float = 300) -> RunStats:
    """Send every body to /v1/chat/completions with at most `concurrency` in flight."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    results: List[Result] = []
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s) as client:
        async def one(index: int, body: Dict[str, Any]) -> None:
            async with sem:
                started = time.perf_counter()
                try:
                    r = await client.post("/v1/chat/completions", json=body)
                    latency = time.perf_counter() - started
                    if r.status_code != 200:
                        results.append(Result(latency, r.status_code, error=r.text[:200], index=index))
                        return
                    data = r.json()
                    choice = data["choices"][0]
                    results.append(Result(latency, 200, int(data["usage"]["completion_tokens"]),
                                          choice["message"]["content"] or "",
                                          finish_reason=choice.get("finish_reason") or "", index=index))
                except httpx.HTTPError as e:
                    results.append(Result(time.perf_counter() - started, 0, error=f"{type(e).__name__}: {e}",
                                          index=index))

        started = time.perf_counter()
        await asyncio.gather(*(one(i, b) for i, b in enumerate(bodies)))
        stats = RunStats(time.perf_counter() - started, results)
    if check is not None:
        stats.count_format_errors(check)
    return stats


def json_check(validate: Optional[Callable[[Any], None]] = None) -> Callable[[str], bool]:
    """A format check: the content parses as JSON (and passes `validate`, if given)."""
    def check(content: str) -> bool:
        try:
            value = json.loads(content)
            if validate is not None:
                validate(value)
            return True
        except Exception:
            return False
    return check


def spec_counters(metrics_text: str, model: Optional[str] = None) -> Dict[str, float]:
    """vLLM's speculative-decoding counters summed over label sets; with `model`, only the
    series labelled model_name=<model> (a GPUStack worker's /metrics/raw holds every
    model on the worker)."""
    totals: Dict[str, float] = {}
    wanted = f'model_name="{model}"' if model else None
    for line in metrics_text.splitlines():
        if not line.startswith("vllm:spec_decode_num_") or "_total" not in line:
            continue
        if wanted and "model_name=" in line and wanted not in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0].removeprefix("vllm:spec_decode_")
        if name.endswith("_per_pos_total"):
            continue
        totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


def acceptance(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    drafted = after.get("num_draft_tokens_total", 0.0) - before.get("num_draft_tokens_total", 0.0)
    accepted = after.get("num_accepted_tokens_total", 0.0) - before.get("num_accepted_tokens_total", 0.0)
    drafts = after.get("num_drafts_total", 0.0) - before.get("num_drafts_total", 0.0)
    return {
        "acceptance_rate": accepted / drafted if drafted else math.nan,
        "tokens_per_verify": 1 + accepted / drafts if drafts else math.nan,
        "drafted": drafted,
        "accepted": accepted,
    }
