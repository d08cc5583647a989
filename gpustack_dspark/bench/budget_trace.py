"""Fixed speculative lengths against the per-step budget on one mixed-load trace, side by side.

    .venv/bin/python -m gpustack_dspark.bench.budget_trace --variants none,4,8,auto --runs 1

The trace is fixed before tuning (seeded): low -> high -> low load phases, Poisson arrivals,
70 % order-JSON requests (high acceptance) and 30 % free-text requests (no grammar: low
acceptance, vLLM's n-gram drafts), greedy. Each variant is a fresh real `dspark-serve` replica
(fixture model, CPU layout, `--max-num-seqs 8` so the high phase has a waiting queue). Printed
per variant: goodput (valid output tokens per second, by arrival phase and overall), P50/P99
latency and TTFT P50 per phase (a phase's goodput: its requests' valid tokens from its first
arrival to its last completion), and the budget's own counters where it is on. A script, not a
test: figures on a shared CPU move between runs; compare only variants of one run.
"""

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, Dict, List

import httpx

from gpustack_dspark.bench.load import json_check, percentile
from gpustack_dspark.bench.order_json import SAME_VLLM_ARGS
from gpustack_dspark.bench.workloads import order_body
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica

PHASES = (("low", 0.4, 25.0), ("high", 4.0, 25.0), ("low2", 0.4, 25.0))  # (name, requests/s, seconds)
TEXT_SHARE = 0.3
MAX_TOKENS = 96


def trace(seed: int) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    out, t0 = [], 0.0
    for name, rate, seconds in PHASES:
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= t0 + seconds:
                break
            kind = "text" if rng.random() < TEXT_SHARE else "json"
            out.append({"at": t, "phase": name, "kind": kind, "index": len(out)})
        t0 += seconds
    return out


def body(item: Dict[str, Any]) -> Dict[str, Any]:
    if item["kind"] == "json":
        return order_body(item["index"], MAX_TOKENS, 0.0, SERVED_NAME)
    return {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0,
            "response_format": {"type": "text"},
            "messages": [{"role": "user", "content": f"Tell a short story number {item['index']} about a harbour."}]}


async def replay(base_url: str, items: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    check = json_check(None)
    results: List[Dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()

        async def one(item):
            await asyncio.sleep(max(0.0, item["at"] - (time.perf_counter() - start)))
            sent = time.perf_counter()
            first = None
            text, tokens = [], 0
            payload = {**body(item), "stream": True, "stream_options": {"include_usage": True}}
            async with client.stream("POST", f"{base_url}/v1/chat/completions", json=payload) as r:
                async for line in r.aiter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    event = json.loads(line[6:])
                    if event.get("usage"):
                        tokens = int(event["usage"].get("completion_tokens") or 0)
                    for choice in event.get("choices") or []:
                        piece = (choice.get("delta") or {}).get("content")
                        if piece:
                            first = first or time.perf_counter()
                            text.append(piece)
            done = time.perf_counter()
            valid = item["kind"] == "text" or check("".join(text))
            results.append({**item, "latency": done - sent, "ttft": (first or done) - sent, "tokens": tokens,
                            "valid": valid, "done": done - start})

        await asyncio.gather(*(one(i) for i in items))
    return results


def figures(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, _, seconds in PHASES:
        at = [r for r in results if r["phase"] == name]
        good = sum(r["tokens"] for r in at if r["valid"])
        # Served rate of the phase's requests: from the first arrival to the last completion
        # (arrivals are fixed, so tokens / phase length would only restate the offered load).
        span = max(r["done"] for r in at) - min(r["at"] for r in at) if at else 0.0
        out[name] = {"goodput": round(good / span, 2) if span > 0 else None, "p50": round(percentile([r["latency"] for r in at], 50), 2),
                     "p99": round(percentile([r["latency"] for r in at], 99), 2),
                     "ttft50": round(percentile([r["ttft"] for r in at], 50), 3), "n": len(at)}
    wall = max(r["done"] for r in results)
    out["overall"] = round(sum(r["tokens"] for r in results if r["valid"]) / wall, 2)
    out["invalid"] = sum(1 for r in results if not r["valid"])
    return out


def variant_args(variant: str) -> List[str]:
    if variant == "none":
        return []
    return ["--enable-dspark", f"--dspark-speculative-length={variant}"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="none,1,2,3,4,5,6,7,8,auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--logs", default="/tmp/dspark-budget-trace")
    args = parser.parse_args()
    items = trace(args.seed)
    print(f"trace: {len(items)} requests, phases {PHASES}, text share {TEXT_SHARE}, seed {args.seed}", flush=True)
    table: Dict[str, List[Dict[str, Any]]] = {}
    for run in range(args.runs):
        for variant in args.variants.split(","):
            replica = start_replica(Path(args.logs) / f"{variant}-{run}.log",
                                    variant_args(variant) + SAME_VLLM_ARGS
                                    + ["--max-num-seqs", "8", "--dspark-warmup-requests", "4"])
            try:
                replica.wait_ready(900)
                result = figures(asyncio.run(replay(replica.base_url, items)))
                if variant == "auto":
                    time.sleep(1.5)
                    result["budget"] = (replica.info()["drafting"].get("budget") or {}).get("counters")
            finally:
                replica.stop()
            table.setdefault(variant, []).append(result)
            print(f"run {run} {variant}: {json.dumps(result)}", flush=True)
    print("\nvariant   overall  " + "  ".join(f"{n:>8} p50/p99" for n, _, _ in PHASES))
    for variant, results in table.items():
        overall = sum(r["overall"] for r in results) / len(results)
        cells = []
        for name, _, _ in PHASES:
            g = sum(r[name]["goodput"] or 0.0 for r in results) / len(results)
            cells.append(f"{g:8.1f} {results[-1][name]['p50']:.1f}/{results[-1][name]['p99']:.1f}")
        print(f"{variant:8} {overall:8.1f}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
