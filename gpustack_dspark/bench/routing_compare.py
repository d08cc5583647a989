"""Routing benchmark: stock GPUStack round-robin vs gpustack-dspark least-connections.

Not a test. One run starts a real PostgreSQL, then for each configuration a real GPUStack
2.3 server (`--dspark-disable` = stock; default = ours) with a real CPU worker, and two
stand-in replicas (test stand-ins for vLLM, devstack/stand_in_replica.py), B 3x slower
than A, both capacity-limited (latency grows with their own in-flight). It prints, per
configuration and run:

- time-averaged in-flight at each replica over the steady window (until the last request
  is sent) and the max/min ratio,
- P50 / P99 latency of mixed requests (80% short, 20% long = 4x work),
and, with zero-delay replicas, the median proxy latency at concurrency 1 and 8 for both
configurations (what our routing adds over the stock proxy).

    .venv/bin/python -m gpustack_dspark.bench.routing_compare [--runs 3] [--requests 200] [--concurrency 16]

Bounded: each run stops after --requests requests; the whole script takes ~8-10 minutes.
"""

import argparse
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Dict, List

import httpx

from gpustack_dspark import backend
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.postgres import start_postgres
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.stand_in_instances import RunningStateKeeper, create_stand_in_model, wait_routable
from gpustack_dspark.devstack.stand_in_replica import StandInReplica
from gpustack_dspark.devstack.worker import join_cpu_worker

BODY = {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}


def pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def closed_loop(url, headers, replicas, requests, concurrency, seed):
    rng = random.Random(seed)
    works = [4.0 if rng.random() < 0.2 else 1.0 for _ in range(requests)]
    for r in replicas:
        r.stats.reset()
    done, lock, steady, latencies = [0], threading.Lock(), {}, []
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=concurrency * 2))

    def one(i):
        started = time.monotonic()
        answer = client.post(url, headers=headers, json={"model": "json-m", **BODY, "metadata": {"work": works[i]}})
        elapsed = time.monotonic() - started
        with lock:
            done[0] += 1
            latencies.append(elapsed)
            if done[0] == requests - concurrency:
                steady["avg"] = [r.stats.time_averaged() for r in replicas]
                steady["peak"] = [r.stats.peak for r in replicas]
        return answer.status_code

    with ThreadPoolExecutor(concurrency) as pool:
        codes = list(pool.map(one, range(requests)))
    client.close()
    served = [r.stats.served for r in replicas]
    avg = steady["avg"]
    return {"ratio": max(avg) / max(min(avg), 1e-9), "avg": avg, "served": served,
            "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99), "errors": sum(c != 200 for c in codes)}


def overhead(url, headers, concurrency, requests=120):
    client = httpx.Client(timeout=60, limits=httpx.Limits(max_connections=concurrency * 2))
    latencies = []

    def one(_):
        started = time.monotonic()
        client.post(url, headers=headers, json={"model": "json-m", **BODY})
        latencies.append(time.monotonic() - started)

    for _ in range(10):
        one(0)  # warm connections
    latencies.clear()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(requests)))
    client.close()
    return statistics.median(latencies)


def run_config(name, extra_args, pg, base: Path, replicas, args):
    pg.reset()
    server = GPUStackServer(data_dir=base / f"server-{name}", database_url=pg.url, extra_args=extra_args).start()
    key = server.create_api_key()
    api = GPUStackAPI(server.url, key)
    worker = join_cpu_worker(api, server.url, f"bench-{name}", base / f"worker-{name}")
    row = api.get(f"/v2/workers/{worker.id}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            httpx.get(f"http://127.0.0.1:{worker.worker_port}/healthz", timeout=2)
            break
        except httpx.HTTPError:
            time.sleep(1)
    if not any(b["backend_name"] == backend.BACKEND_NAME for b in api.items("/v2/inference-backends")):
        # stock server: the plugin did not register its backend; the model only needs a name
        api.post("/v2/inference-backends", {"backend_name": backend.BACKEND_NAME, "health_check_path": "/health",
                                            "version_configs": {backend.CPU_VERSION: {"image_name": "x/y:1",
                                                                                     "custom_framework": "cpu"}}})
    model = create_stand_in_model(api, "json-m", backend.BACKEND_NAME, backend.CPU_VERSION, row["cluster_id"], row,
                                  [r.port for r in replicas], base / f"model-{name}")
    keeper = RunningStateKeeper(GPUStackAPI(server.url, key), row).start()
    keeper.watch(model["id"])
    wait_routable(server.url, key, "json-m", 180)
    url, headers = f"{server.url}/v1/chat/completions", {"Authorization": f"Bearer {key}"}
    results = {"runs": [], "overhead": {}}
    try:
        fast, slow = replicas
        fast.base_s, slow.base_s, fast.slowdown, slow.slowdown = 0.0, 0.0, 1, 1
        fast.capacity = slow.capacity = None
        for c in (1, 8):
            results["overhead"][c] = overhead(url, headers, c)
        fast.base_s = slow.base_s = args.base_s
        slow.slowdown = 3.0
        fast.capacity = slow.capacity = args.capacity
        for run in range(args.runs):
            results["runs"].append(closed_loop(url, headers, replicas, args.requests, args.concurrency, seed=run))
            print(f"  {name} run {run + 1}: {results['runs'][-1]}", flush=True)
    finally:
        keeper.stop()
        worker.stop()
        server.stop()
        api.close()
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--base-s", type=float, default=0.4, help="replica A's time for a short request")
    parser.add_argument("--capacity", type=int, default=4, help="in-flight a replica serves at full speed")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="dspark-routing-bench-"))
    pg = start_postgres(base / "pg")
    replicas = [StandInReplica("A"), StandInReplica("B")]
    for r in replicas:
        r.start()
    try:
        out: Dict[str, dict] = {}
        for name, extra in (("stock-round-robin", ["--dspark-disable"]), ("dspark-least-connections", [])):
            print(f"== {name}", flush=True)
            out[name] = run_config(name, extra, pg, base, replicas, args)
    finally:
        for r in replicas:
            r.stop()
        pg.stop()
    print("\n| configuration | in-flight max/min (per run) | P50 s | P99 s | split A/B | proxy median c=1 / c=8 ms |")
    print("|---|---|---|---|---|---|")
    for name, res in out.items():
        runs = res["runs"]
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in runs)
        p50 = statistics.median(r["p50"] for r in runs)
        p99 = statistics.median(r["p99"] for r in runs)
        split = "; ".join(f"{r['served'][0]}/{r['served'][1]}" for r in runs)
        oh = res["overhead"]
        print(f"| {name} | {ratios} | {p50:.2f} | {p99:.2f} | {split} | {oh[1] * 1000:.1f} / {oh[8] * 1000:.1f} |")
    stock, ours = out["stock-round-robin"], out["dspark-least-connections"]
    p99_ratio = statistics.median(r["p99"] for r in ours["runs"]) / statistics.median(r["p99"] for r in stock["runs"])
    print(f"\nP99 ours / stock: {p99_ratio:.2f}")
    for c in (1, 8):
        print(f"median added by our routing at concurrency {c}: "
              f"{(ours['overhead'][c] - stock['overhead'][c]) * 1000:+.1f} ms")


if __name__ == "__main__":
    main()
