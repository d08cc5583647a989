"""Routing benchmark: stock GPUStack round-robin vs the plugin's least-connections and
expected-finish-time balancing, slow start on scale-out, and the routing layer's cost.

Not a test. A real PostgreSQL, real GPUStack 2.3 servers (`--dspark-disable` = stock;
otherwise the plugin with a routing policy written for the configuration) each with a real
CPU worker, and stand-in replicas (test stand-ins for vLLM, tests/support/stand_in_replica.py)
whose latency grows with their own in-flight past a capacity. Parts (`--parts`):

- `skew`: replicas A and B, B 3x slower; a closed loop of mixed requests (80% short, 20%
  4x long) per configuration and run: time-averaged in-flight max/min over the steady
  window, P50 / P99, the split.
- `scaleout`: three equal replicas, two RUNNING under a steady closed loop; then the third
  turns RUNNING, cold (its capacity grows from 1 to full over 30 s, as caches fill). With
  and without slow start: steady P50 before, the first requests sent to the newcomer
  (median and max of its first 10) and the first-minute P99 of its requests and overall.
- `cost`: zero-delay replicas behind three servers alive at once (stock; the plugin; the
  plugin with `proxy.gc_freeze`), batches interleaved (the order shuffled per batch) at
  concurrency 1 and 8; the median of per-batch medians, what the plugin adds over stock,
  P99.9 and the server's full garbage collections (from `GET /v2/dspark/status`).

    .venv/bin/python -m tests.bench.routing_compare [--parts skew,scaleout,cost] [--runs 3]

Bounded: every loop stops after a set count or time; all parts take ~15-20 minutes here.
"""

import argparse
import random
import statistics
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import httpx

from gpustack_dspark import backend
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.postgres import Postgres, start_postgres
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.worker import join_cpu_worker
from tests.support.stand_in_instances import (
    RunningStateKeeper, create_stand_in_model, instances_of, set_running, wait_routable,
)
from tests.support.stand_in_replica import StandInReplica

BODY = {"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}
STOCK = "stock-round-robin"


def pct(values: List[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] if ordered else float("nan")


def policy_args(base: Path, name: str, policy: Optional[str]) -> List[str]:
    """`--dspark-policy-dir` with a routing.yaml of `policy` (None: the built-in defaults)."""
    if policy is None:
        return []
    directory = base / f"policy-{name}"
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "routing.yaml").write_text(policy)
    return ["--dspark-policy-dir", str(directory)]


@dataclass
class Deployment:
    """One GPUStack server + CPU worker + a stand-in model `json-m` on `replicas`."""

    name: str
    server: GPUStackServer
    api: GPUStackAPI
    key: str
    worker: object
    keeper: RunningStateKeeper
    row: Dict
    model: Dict
    extra: List[object] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"{self.server.url}/v1/chat/completions"

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def status(self) -> Dict:
        return httpx.get(f"{self.server.url}/v2/dspark/status", headers=self.headers, timeout=10).json()

    def stop(self) -> None:
        self.keeper.stop()
        self.worker.stop()
        self.server.stop()
        self.api.close()


def deploy(name: str, extra_args: List[str], pg: Postgres, base: Path, replicas: List[StandInReplica],
           running: Optional[int] = None) -> Deployment:
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
                                  [r.port for r in replicas], base / f"model-{name}", running=running)
    keeper = RunningStateKeeper(GPUStackAPI(server.url, key), row).start()
    keeper.watch(model["id"])
    wait_routable(server.url, key, "json-m", 180)
    return Deployment(name, server, api, key, worker, keeper, row, model)


# ---- skew ----

def closed_loop(dep: Deployment, replicas, requests, concurrency, seed):
    rng = random.Random(seed)
    works = [4.0 if rng.random() < 0.2 else 1.0 for _ in range(requests)]
    for r in replicas:
        r.stats.reset()
    done, lock, steady, latencies = [0], threading.Lock(), {}, []
    client = httpx.Client(timeout=120, limits=httpx.Limits(max_connections=concurrency * 2))

    def one(i):
        started = time.monotonic()
        answer = client.post(dep.url, headers=dep.headers, json={"model": "json-m", **BODY,
                                                                 "metadata": {"work": works[i]}})
        elapsed = time.monotonic() - started
        with lock:
            done[0] += 1
            latencies.append(elapsed)
            if done[0] == requests - concurrency:
                steady["avg"] = [r.stats.time_averaged() for r in replicas]
        return answer.status_code

    with ThreadPoolExecutor(concurrency) as pool:
        codes = list(pool.map(one, range(requests)))
    client.close()
    avg = steady["avg"]
    return {"ratio": max(avg) / max(min(avg), 1e-9), "avg": avg, "served": [r.stats.served for r in replicas],
            "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99), "errors": sum(c != 200 for c in codes)}


SKEW_CONFIGS = (
    (STOCK, ["--dspark-disable"], None),
    ("least-connections", [], "version: 1\nproxy:\n  balance: least_connections\n"),
    ("expected-finish-time", [], None),  # the default
)


def part_skew(pg, base, args) -> Dict[str, List[dict]]:
    replicas = [StandInReplica("A").start(), StandInReplica("B").start()]
    out: Dict[str, List[dict]] = {}
    try:
        for name, extra, policy in SKEW_CONFIGS:
            print(f"== skew: {name}", flush=True)
            pg.reset()
            for r in replicas:
                r.base_s, r.slowdown, r.capacity = 0.05, 1.0, None
            dep = deploy(name, extra + policy_args(base, name, policy), pg, base, replicas)
            try:
                replicas[0].base_s = replicas[1].base_s = args.base_s
                replicas[1].slowdown = 3.0
                replicas[0].capacity = replicas[1].capacity = args.capacity
                out[name] = []
                for run in range(args.runs):
                    out[name].append(closed_loop(dep, replicas, args.requests, args.concurrency, seed=run))
                    print(f"  run {run + 1}: {out[name][-1]}", flush=True)
            finally:
                dep.stop()
    finally:
        for r in replicas:
            r.stop()
    print("\n| configuration | in-flight max/min (per run) | P50 s | P99 s | P99 / stock | split A/B (B 3x slower) |")
    print("|---|---|---|---|---|---|")
    stock_p99 = statistics.median(r["p99"] for r in out[STOCK])
    for name, runs in out.items():
        p99 = statistics.median(r["p99"] for r in runs)
        ratios = ", ".join(f"{r['ratio']:.2f}" for r in runs)
        split = "; ".join(f"{r['served'][0]}/{r['served'][1]}" for r in runs)
        print(f"| {name} | {ratios} | {statistics.median(r['p50'] for r in runs):.2f} | {p99:.2f} "
              f"| {p99 / stock_p99:.2f} | {split} |")
    return out


# ---- scale-out ----

def part_scaleout(pg, base, args) -> Dict[str, dict]:
    out: Dict[str, dict] = {}
    for name, policy in (("slow-start-off", "version: 1\nproxy:\n  slow_start:\n    ramp_s: 0\n"),
                         ("slow-start-on", None)):
        print(f"== scale-out: {name}", flush=True)
        pg.reset()
        replicas = [StandInReplica(n, base_s=args.base_s, capacity=args.capacity).start() for n in ("A", "B", "C")]
        dep = deploy(name, policy_args(base, name, policy), pg, base, replicas, running=2)
        records: List[tuple] = []  # (sent at, latency, replica)
        stop = threading.Event()
        lock = threading.Lock()

        def client_loop():
            with httpx.Client(timeout=120) as client:
                while not stop.is_set():
                    started = time.monotonic()
                    answer = client.post(dep.url, headers=dep.headers, json={"model": "json-m", **BODY})
                    replica = answer.json().get("replica") if answer.status_code == 200 else f"error {answer.status_code}"
                    with lock:
                        records.append((started, time.monotonic() - started, replica))

        try:
            loaders = [threading.Thread(target=client_loop, daemon=True) for _ in range(args.scaleout_clients)]
            for t in loaders:
                t.start()
            time.sleep(args.steady_s)
            warm_at = time.monotonic()
            newcomer = instances_of(dep.api, dep.model["id"])[2]
            replicas[2].turned_warm(args.cold_s)
            set_running(dep.api, newcomer, dep.row, replicas[2].port)
            dep.keeper.watch(dep.model["id"])
            time.sleep(60)
            stop.set()
            for t in loaders:
                t.join(timeout=120)
        finally:
            dep.stop()
            for r in replicas:
                r.stop()
        steady = [lat for at, lat, _ in records if warm_at - args.steady_s / 2 <= at < warm_at]
        minute = [(at, lat, rep) for at, lat, rep in records if warm_at <= at < warm_at + 60]
        to_new = [lat for at, lat, rep in sorted(minute) if rep == "C"]
        out[name] = {"steady_p50": pct(steady, 0.5), "first10_median": statistics.median(to_new[:10]) if to_new else None,
                     "first10_max": max(to_new[:10]) if to_new else None,
                     "new_p99": pct(to_new, 0.99), "overall_p99": pct([lat for _, lat, _ in minute], 0.99),
                     "to_new": len(to_new), "minute": len(minute),
                     "errors": sum(1 for *_, rep in records if str(rep).startswith("error"))}
        print(f"  {out[name]}", flush=True)
    print("\n| slow start | steady P50 s | newcomer's first 10: median s (x steady P50) / max s "
          "| first minute P99: newcomer / overall s | requests to newcomer / all (first minute) | errors |")
    print("|---|---|---|---|---|---|")
    for name, r in out.items():
        ratio = (r["first10_median"] or float("nan")) / r["steady_p50"]
        print(f"| {name} | {r['steady_p50']:.2f} | {r['first10_median'] or float('nan'):.2f} ({ratio:.2f}x) / "
              f"{r['first10_max'] or float('nan'):.2f} | {r['new_p99']:.2f} / {r['overall_p99']:.2f} "
              f"| {r['to_new']} / {r['minute']} | {r['errors']} |")
    return out


# ---- cost ----

COST_CONFIGS = (
    (STOCK, ["--dspark-disable"], None),
    ("dspark", [], "version: 1\nproxy:\n  gc_freeze: false\n"),
    ("dspark+gc_freeze", [], "version: 1\nproxy:\n  gc_freeze: true\n"),
)


def _batch(client, dep: Deployment, concurrency: int, requests: int, pool) -> List[float]:
    def one(_):
        started = time.monotonic()
        answer = client.post(dep.url, headers=dep.headers, json={"model": "json-m", **BODY})
        if answer.status_code != 200:
            raise RuntimeError(f"{dep.name}: {answer.status_code} {answer.text[:200]}")
        return time.monotonic() - started

    return list(pool.map(one, range(requests))) if concurrency > 1 else [one(0) for _ in range(requests)]


def _full_pauses(dep: Deployment, since: float) -> Optional[List[float]]:
    """The server's full garbage collections (ms) since wall time `since`; None if not timed."""
    gc_status = (dep.status().get("routing") or {}).get("gc")
    if not gc_status or not gc_status.get("timed"):
        return None
    return [ms for at, ms in gc_status["recent_full_ms"] if at >= since]


def part_cost(base, args) -> Dict[str, dict]:
    replicas = [StandInReplica(n, base_s=0.0).start() for n in ("A", "B")]
    deps: List[Deployment] = []
    pgs: List[Postgres] = []
    try:
        for name, extra, policy in COST_CONFIGS:
            print(f"== cost: starting {name}", flush=True)
            pgs.append(start_postgres(base / f"pg-{name}"))
            deps.append(deploy(name, extra + policy_args(base, name, policy), pgs[-1], base, replicas))
        time.sleep(25)  # past the gc_freeze delay (observe/gc_pauses.py FREEZE_AFTER_S)
        rng = random.Random(7)
        medians = {d.name: {1: [], 8: []} for d in deps}
        latencies = {d.name: [] for d in deps}
        run_started = time.time()
        clients = {d.name: httpx.Client(timeout=60, limits=httpx.Limits(max_connections=32)) for d in deps}
        with ThreadPoolExecutor(8) as pool:
            for d in deps:  # warm connections
                _batch(clients[d.name], d, 8, 40, pool)
            for index in range(args.cost_batches):
                for concurrency, size in ((1, args.cost_batch // 2), (8, args.cost_batch)):
                    order = list(deps)
                    rng.shuffle(order)
                    for d in order:
                        values = _batch(clients[d.name], d, concurrency, size, pool)
                        medians[d.name][concurrency].append(statistics.median(values))
                        latencies[d.name] += values
                if (index + 1) % 5 == 0:
                    print(f"  batch {index + 1}/{args.cost_batches}", flush=True)
        for c in clients.values():
            c.close()
        out = {}
        for d in deps:
            pauses = _full_pauses(d, run_started)
            full = None if pauses is None else {"count": len(pauses), "max_ms": max(pauses, default=0.0)}
            out[d.name] = {"c1": statistics.median(medians[d.name][1]), "c8": statistics.median(medians[d.name][8]),
                           "p999": pct(latencies[d.name], 0.999), "max": max(latencies[d.name]),
                           "requests": len(latencies[d.name]), "full_gc": full}
    finally:
        for d in deps:
            d.stop()
        for r in replicas:
            r.stop()
        for pg in pgs:
            pg.stop()
    stock = out[STOCK]
    print("\n| server | median of batch medians c=1 / c=8 ms | added over stock c=1 / c=8 ms "
          "| P99.9 / max ms | requests | full GCs during the run (max pause ms) |")
    print("|---|---|---|---|---|---|")
    for name, r in out.items():
        full = r["full_gc"]
        gc_text = f"{full['count']} ({full['max_ms']:.0f})" if full else "not timed (plugin off)"
        print(f"| {name} | {r['c1'] * 1000:.2f} / {r['c8'] * 1000:.2f} | {(r['c1'] - stock['c1']) * 1000:+.2f} / "
              f"{(r['c8'] - stock['c8']) * 1000:+.2f} | {r['p999'] * 1000:.0f} / {r['max'] * 1000:.0f} "
              f"| {r['requests']} | {gc_text} |")
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", default="skew,scaleout,cost")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--base-s", type=float, default=0.4, help="replica A's time for a short request")
    parser.add_argument("--capacity", type=int, default=4, help="in-flight a replica serves at full speed")
    parser.add_argument("--scaleout-clients", type=int, default=12)
    parser.add_argument("--steady-s", type=float, default=20.0)
    parser.add_argument("--cold-s", type=float, default=30.0, help="the newcomer's capacity ramp after it turns warm")
    parser.add_argument("--cost-batches", type=int, default=20)
    parser.add_argument("--cost-batch", type=int, default=60, help="requests per concurrency-8 batch (half at c=1)")
    args = parser.parse_args()
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    unknown = sorted(set(parts) - {"skew", "scaleout", "cost"})
    if unknown:
        parser.error(f"--parts: unknown part(s) {', '.join(unknown)} (allowed: skew, scaleout, cost)")
    base = Path(tempfile.mkdtemp(prefix="dspark-routing-bench-"))
    pg = start_postgres(base / "pg") if {"skew", "scaleout"} & set(parts) else None
    try:
        if "skew" in parts:
            part_skew(pg, base, args)
        if "scaleout" in parts:
            part_scaleout(pg, base, args)
        if "cost" in parts:
            part_cost(base, args)
    finally:
        if pg is not None:
            pg.stop()


if __name__ == "__main__":
    main()
