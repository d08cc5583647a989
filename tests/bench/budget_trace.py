"""Fixed speculative lengths against the per-step budget on one mixed-load trace, side by side.

    .venv/bin/python -m tests.bench.budget_trace --variants none,1,2,3,4,5,6,7,8,auto --runs 3 [--model expanded]

The trace is fixed before tuning (seeded): low -> high -> low load phases, Poisson arrivals,
70 % order-JSON requests (high acceptance) and 30 % free-text requests (no grammar: low
acceptance, vLLM's n-gram drafts), greedy. Each variant is one real `dspark-serve` replica
(fixture model, CPU layout, `--max-num-seqs 8` so the high phase has a waiting queue) that
replays the trace `--runs` times after its warmup, each run with new contents (the same
arrivals; run r's requests numbered from r x 100,000, or extraction tasks of a seed of their own
with `--model real`), so no replica is measured on a request it has seen; a failed request
counts as not valid. Printed per variant: goodput (valid output
tokens per second, by arrival phase, and overall per second in which some request was waiting
or being served; the trace's arrivals are fixed, so tokens per wall second would restate the
offered load wherever the replica keeps up), P50/P99 latency and TTFT P50 per phase (a
phase's goodput: its requests' valid tokens from its first arrival to its last completion),
tokens per target forward pass, where an engine step's time goes (the layer's own code, vLLM's
grammar check of drafts and grammar bitmasks, vLLM's scheduler, the forward and the rest; from
the layer's step profile, stats.DraftingCounters.step_profile) and the budget's own counters
where it is on. A script, not a test: figures on a shared CPU move between runs; compare only
variants of one invocation. `--model expanded` replays it on the benchmark model (the
fixture's tokens at a ~100 M-parameter model's step cost: docs/drafting.md, "The benchmark
model"; its slower steps may want a lower `--high-rate`).
"""

import argparse
import asyncio
import json
import random
import time
from pathlib import Path
from typing import Any, Dict, List

import httpx

from gpustack_dspark.bench import extraction
from gpustack_dspark.bench.load import json_check, percentile
from gpustack_dspark.bench.workloads import order_body
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica
from tests.bench.models import add_model_argument, resolve
from tests.bench.order_json import SAME_VLLM_ARGS

PHASES = (("low", 1.0, 12.0), ("high", 12.0, 10.0), ("low2", 1.0, 12.0))  # (name, requests/s, seconds)
TEXT_SHARE = 0.3
MAX_TOKENS = 96


def trace(seed: int, phases=PHASES) -> List[Dict[str, Any]]:
    rng = random.Random(seed)
    out, t0 = [], 0.0
    for name, rate, seconds in phases:
        t = t0
        while True:
            t += rng.expovariate(rate)
            if t >= t0 + seconds:
                break
            kind = "text" if rng.random() < TEXT_SHARE else "json"
            out.append({"at": t, "phase": name, "kind": kind, "index": len(out)})
        t0 += seconds
    return out


# Each run's requests are new (same arrivals, other contents), so no replica is measured on a
# request it has seen: run r's requests are numbered from r * FRESH.
FRESH = 100_000


class Contents:
    """What each arrival of run `run` asks: order JSON (or, with `extraction`, a fresh extraction
    task of seed (seed, run)) or a free-text request; every run's differ from every other's."""

    def __init__(self, seed: int, run: int, extraction_tasks: bool):
        self.run = run
        self.tasks = extraction.TaskStream(seed * 1000 + run) if extraction_tasks else None

    def body(self, item: Dict[str, Any]) -> Dict[str, Any]:
        number = self.run * FRESH + item["index"]
        if item["kind"] == "json" and self.tasks is not None:
            return extraction.body(self.tasks[item["index"]], SERVED_NAME)
        if item["kind"] == "json":
            return order_body(number, MAX_TOKENS, 0.0, SERVED_NAME)
        return {"model": SERVED_NAME, "max_tokens": MAX_TOKENS, "temperature": 0.0,
                "response_format": {"type": "text"},
                "messages": [{"role": "user", "content": f"Tell a short story number {number} about a harbour."}]}

    def valid(self, item: Dict[str, Any], text: str, finish: str) -> bool:
        """A JSON reply valid (under its own schema for extraction; cut by max_tokens counts as
        not valid: no client can use it), a free-text reply non-empty."""
        if item["kind"] == "text":
            return bool(text)
        if self.tasks is not None:
            return extraction.score(self.tasks[item["index"]], text, finish).valid
        return json_check(None)(text)


async def replay(base_url: str, items: List[Dict[str, Any]], contents: Contents) -> List[Dict[str, Any]]:
    results: List[Dict[str, Any]] = []
    async with httpx.AsyncClient(timeout=600) as client:
        start = time.perf_counter()

        async def one(item):
            await asyncio.sleep(max(0.0, item["at"] - (time.perf_counter() - start)))
            sent = time.perf_counter()
            first = None
            text, tokens, finish, failed = [], 0, "", False
            payload = {**contents.body(item), "stream": True, "stream_options": {"include_usage": True}}
            try:
                async with client.stream("POST", f"{base_url}/v1/chat/completions", json=payload) as r:
                    failed = r.status_code != 200
                    async for line in r.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        event = json.loads(line[6:])
                        if event.get("error"):
                            failed = True
                        if event.get("usage"):
                            tokens = int(event["usage"].get("completion_tokens") or 0)
                        for choice in event.get("choices") or []:
                            piece = (choice.get("delta") or {}).get("content")
                            finish = choice.get("finish_reason") or finish
                            if piece:
                                first = first or time.perf_counter()
                                text.append(piece)
            except httpx.HTTPError:
                failed = True
            done = time.perf_counter()
            # A failed request (an error status, an error event, a broken connection) is
            # counted as not valid, whatever its kind.
            valid = not failed and contents.valid(item, "".join(text), finish)
            results.append({**item, "latency": done - sent, "ttft": (first or done) - sent, "tokens": tokens,
                            "valid": valid, "done": done - start})

        await asyncio.gather(*(one(i) for i in items))
    return results


def busy_seconds(results: List[Dict[str, Any]]) -> float:
    """Seconds in which at least one request was waiting or being served (the union of the
    [arrival, completion] intervals): the time the replica's speed decides."""
    total, begin, end = 0.0, 0.0, None
    for start, done in sorted((r["at"], r["done"]) for r in results):
        if end is not None and start <= end:
            end = max(end, done)
            continue
        if end is not None:
            total += end - begin
        begin, end = start, done
    return total + ((end - begin) if end is not None else 0.0)


def figures(results: List[Dict[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for name, _, seconds in PHASES:
        at = [r for r in results if r["phase"] == name]
        good = sum(r["tokens"] for r in at if r["valid"])
        # Served rate of the phase's requests: from the first arrival to the last completion
        # (arrivals are fixed, so tokens / phase length would only restate the offered load).
        span = max(r["done"] for r in at) - min(r["at"] for r in at) if at else 0.0
        out[name] = {"goodput": round(good / span, 2) if span > 0 else None,
                     "busy_goodput": round(good / busy_seconds(at), 2) if at else None, "p50": round(percentile([r["latency"] for r in at], 50), 2),
                     "p99": round(percentile([r["latency"] for r in at], 99), 2),
                     "ttft50": round(percentile([r["ttft"] for r in at], 50), 3), "n": len(at)}
    good = sum(r["tokens"] for r in results if r["valid"])
    out["overall"] = round(good / busy_seconds(results), 2)
    # Over the trace's wall time (to the last completion) instead: close to the offered load
    # wherever the replica keeps up, so it separates variants only where one falls behind.
    out["overall_wall"] = round(good / max(r["done"] for r in results), 2)
    out["invalid"] = sum(1 for r in results if not r["valid"])
    return out


def variant_args(variant: str) -> List[str]:
    if variant == "none":
        return []
    return ["--enable-dspark", f"--dspark-speculative-length={variant}"]


PROFILE_FIELDS = ("profile_steps", "step_us", "layer_us", "draft_check_us", "mask_us", "vllm_scheduler_us",
                  "target_forward_passes", "output_tokens")


def counters(replica) -> Dict[str, int]:
    found = (replica.info().get("drafting") or {}).get("counters") or {}
    return {k: int(found.get(k) or 0) for k in PROFILE_FIELDS}


def profile(before: Dict[str, int], after: Dict[str, int]) -> Dict[str, Any]:
    """The step profile and tokens per forward of the runs only (warmup left out)."""
    from gpustack_dspark.worker.drafting.stats import DraftingCounters

    delta = DraftingCounters(**{k: after[k] - before[k] for k in PROFILE_FIELDS})
    return {"tokens_per_forward": delta.tokens_per_forward(), "step_profile": delta.step_profile()}


def run_variant(variant: str, runs: int, items, logs: Path, model: Path, model_args: List[str], seed: int,
                extraction_tasks: bool) -> Dict[str, Any]:
    replica = start_replica(logs / f"{variant}.log", variant_args(variant) + SAME_VLLM_ARGS + model_args
                            + ["--max-num-seqs", "8", "--dspark-warmup-requests", "4"], model=model)
    results: List[Dict[str, Any]] = []
    try:
        replica.wait_ready(900)
        time.sleep(1.0)
        before = counters(replica)
        for run in range(runs):
            result = figures(asyncio.run(replay(replica.base_url, items, Contents(seed, run, extraction_tasks))))
            results.append(result)
            print(f"run {run} {variant}: {json.dumps(result)}", flush=True)
        time.sleep(1.5)  # the engine writes its counters at most every 0.5 s
        out: Dict[str, Any] = {"runs": results, **profile(before, counters(replica))}
        if variant == "auto":
            out["budget"] = (replica.info()["drafting"].get("budget") or {}).get("counters")
        print(f"{variant} profile: {json.dumps({k: v for k, v in out.items() if k != 'runs'})}", flush=True)
        return out
    finally:
        replica.stop()


def mean(values) -> float:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default="none,1,2,3,4,5,6,7,8,auto")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=15)
    parser.add_argument("--logs", default="/tmp/dspark-budget-trace")
    parser.add_argument("--json", default=None, help="write every figure to this file")
    parser.add_argument("--high-rate", type=float, default=PHASES[1][1],
                        help=f"requests/s of the high phase (default {PHASES[1][1]:g}; raise it to saturate "
                             "a faster machine)")
    parser.add_argument("--workload", choices=("extraction", "order"), default=None,
                        help="the JSON requests: extraction tasks of six families (default with --model real) or "
                             "order JSON (default otherwise); each run's contents are new either way")
    add_model_argument(parser)
    args = parser.parse_args()
    model, model_args = resolve(args.model)
    extraction_tasks = (args.workload or ("extraction" if args.model == "real" else "order")) == "extraction"
    phases = (PHASES[0], (PHASES[1][0], args.high_rate, PHASES[1][2]), PHASES[2])
    items = trace(args.seed, phases)
    print(f"trace: {len(items)} requests, phases {phases}, text share {TEXT_SHARE}, seed {args.seed}, "
          f"model {model.name}, JSON requests {'extraction' if extraction_tasks else 'order JSON'}; every run "
          "of a variant's replica sends requests it has not seen (same arrivals, new contents; each variant "
          "its own replica, the runs' contents alike across variants)", flush=True)
    table = {v: run_variant(v, args.runs, items, Path(args.logs), model, model_args, args.seed, extraction_tasks)
             for v in args.variants.split(",")}
    if args.json:
        Path(args.json).write_text(json.dumps(table, indent=1))
    fixed = {v: mean(r["overall"] for r in t["runs"]) for v, t in table.items() if v not in ("none", "auto")}
    best = max(fixed, key=fixed.get) if fixed else None
    none = table.get("none")
    print(f"\nmeans over {args.runs} runs; best fixed length: {best}")
    print("variant  overall  vs-best  vs-none  " + "  ".join(f"{n:>6} p50/p99" for n, _, _ in PHASES)
          + "  high-busy  high-vs-none  tok/fwd  step-ms  layer%  masks%  check%")
    high_none = mean(r["high"].get("busy_goodput") for r in none["runs"]) if none else float("nan")
    overall_none = mean(r["overall"] for r in none["runs"]) if none else float("nan")
    for variant, t in table.items():
        runs = t["runs"]
        overall = mean(r["overall"] for r in runs)
        cells = [f"{mean(r[n]['goodput'] for r in runs):6.1f} {mean(r[n]['p50'] for r in runs):.1f}/"
                 f"{mean(r[n]['p99'] for r in runs):.1f}" for n, _, _ in PHASES]
        high = mean(r["high"].get("busy_goodput") for r in runs)
        prof = t.get("step_profile") or {}
        share = prof.get("share") or {}
        pct = lambda k: f"{100 * share[k]:6.1f}" if k in share else "     -"  # noqa: E731
        print(f"{variant:7} {overall:8.1f}  {overall / fixed[best] if best else float('nan'):7.2f}  "
              f"{overall / overall_none:7.2f}  " + "  ".join(cells)
              + f"  {high:9.1f}  {high / high_none:12.2f}  {t.get('tokens_per_forward') or float('nan'):7.2f}  "
              f"{prof.get('step_ms', float('nan')):7.1f}  {pct('layer')}  {pct('grammar_masks')}  {pct('draft_check')}")


if __name__ == "__main__":
    main()
