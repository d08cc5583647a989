"""Benchmark: the order-JSON workload on one replica setting, DSpark on vs off, side by side.

    .venv/bin/python -m tests.bench.order_json [--requests 64] [--concurrency 8] [--on-args="--enable-dspark"]

Starts real `dspark-serve` replicas (real vLLM on CPU, the tiny fixture model) one after the
other with identical vLLM settings — "off" is plain vLLM with the same structured-output
backend and an explicit json_schema response_format — and alternates them for --rounds, so
slow drift on a shared machine hits both. Prints tok/s, P50/P99 latency, acceptance, format
errors and the on/off ratios. Figures, not assertions.
"""

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import httpx

from gpustack_dspark.bench.load import acceptance, json_check, run_load, spec_counters
from gpustack_dspark.bench.workloads import ORDER_SCHEMA, order_bodies
from gpustack_dspark.devstack.replica import DRAFT_MODEL, SERVED_NAME, start_replica

SAME_VLLM_ARGS = ["--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}']


def validator():
    import jsonschema

    return lambda value: jsonschema.validate(value, ORDER_SCHEMA)


def measure(replica, bodies, concurrency) -> Dict[str, float]:
    before = spec_counters(httpx.get(f"{replica.base_url}/metrics", timeout=10).text)
    stats = asyncio.run(run_load(replica.base_url, bodies, concurrency, check=json_check(validator())))
    after = spec_counters(httpx.get(f"{replica.base_url}/metrics", timeout=10).text)
    failed = len(stats.results) - len(stats.ok)
    return {"tok_s": stats.tokens_per_s, "p50_ms": stats.latency_percentile(50) * 1000,
            "p99_ms": stats.latency_percentile(99) * 1000, "format_error_rate": stats.format_error_rate,
            "failed": failed, **acceptance(before, after)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--rounds", type=int, default=2, help="alternating on/off measurement rounds")
    parser.add_argument("--on-args", default=f"--enable-dspark --dspark-draft-model {DRAFT_MODEL}",
                        help="DSpark knobs of the 'on' replica (default: draft model; on CPU dspark/mtp do not run)")
    args = parser.parse_args()

    bodies = order_bodies(args.requests, args.max_tokens, args.temperature, SERVED_NAME)
    logs = Path(tempfile.mkdtemp(prefix="dspark-bench-"))
    settings = {"on": args.on_args.split() + SAME_VLLM_ARGS + ["--dspark-warmup-requests", "4"],
                "off": SAME_VLLM_ARGS + ["--dspark-warmup-requests", "4"]}
    figures: Dict[str, List[Dict[str, float]]] = {"on": [], "off": []}
    for round_number in range(args.rounds):
        for name in ("on", "off") if round_number % 2 == 0 else ("off", "on"):
            replica = start_replica(logs / f"{name}-{round_number}.log", settings[name])
            try:
                replica.wait_ready(600)
                figures[name].append(measure(replica, bodies, args.concurrency))
                print(f"round {round_number + 1} {name}: {json.dumps({k: round(v, 3) for k, v in figures[name][-1].items()})}",
                      file=sys.stderr, flush=True)
            finally:
                replica.stop()
    report(figures, args)


def report(figures: Dict[str, List[Dict[str, float]]], args) -> None:
    def med(name: str, key: str) -> float:
        values = [f[key] for f in figures[name] if f[key] == f[key]]  # drop NaN
        return statistics.median(values) if values else float("nan")

    print(f"order-JSON workload: {args.requests} requests x {args.rounds} rounds, concurrency {args.concurrency}, "
          f"max_tokens {args.max_tokens}, temperature {args.temperature}; DSpark on = {args.on_args!r}")
    print(f"{'':22}{'off':>12}{'on':>12}{'on/off':>10}")
    for key, label in (("tok_s", "output tok/s"), ("p50_ms", "P50 latency ms"), ("p99_ms", "P99 latency ms")):
        off, on = med("off", key), med("on", key)
        print(f"{label:22}{off:12.1f}{on:12.1f}{on / off if off else float('nan'):10.2f}")
    print(f"{'acceptance rate':22}{'-':>12}{med('on', 'acceptance_rate'):12.3f}")
    print(f"{'tokens per verify':22}{'1.00':>12}{med('on', 'tokens_per_verify'):12.2f}")
    print(f"{'format-error rate':22}{med('off', 'format_error_rate'):12.3f}{med('on', 'format_error_rate'):12.3f}")
    print(f"{'failed requests':22}{med('off', 'failed'):12.0f}{med('on', 'failed'):12.0f}")


if __name__ == "__main__":
    main()
