"""Affinity routing benchmark (issue 30): round-robin vs expected-finish-time vs expected-finish-time
with prefix affinity, on three real DSpark replicas behind real GPUStack servers with the plugin.

Why: JSON traffic repeats a few long system prompts (instructions + a schema + examples), one per
schema. A replica that served a schema recently holds that prefix in vLLM's prefix cache (and
its grammar compiled); balancing by load alone spreads every schema over every replica, so
each replica prefills every prompt again and keeps all of them cached. Affinity sends a
schema's requests to the replica that has its prefix, within a load bound. This measures
whether that pays: TTFT, throughput, cache hit rate and load balance, side by side.

What runs: three real `dspark-serve` replicas (real vLLM on CPU; `--model real` the pretrained
SmolLM2-135M-Instruct, `--model expanded`, the default, the fixture expanded to a ~86 M-parameter
model's cost, `--model fixture` the tiny fixture for a quick smoke), started with VLLM_SERVER_DEV_MODE=1 (for `POST /reset_prefix_cache`) and a
context of `--max-model-len` (default 2048, past the fixture's 1024 positions:
VLLM_ALLOW_LONG_MAX_MODEL_LEN=1; RoPE computes any position, the figures are about cost, not
quality). Per routing configuration one real GPUStack server with the plugin (its own
PostgreSQL, a CPU worker, a `--dspark-policy-dir` with the configuration's routing.yaml), all
three alive at once and all pointing at the SAME three replica processes (stand-in instance
rows: tests/support/stand_in_instances.py):

  round_robin   proxy: {balance: round_robin, affinity: {enabled: false}}
  eft           proxy: {balance: expected_finish_time, affinity: {enabled: false}}
  eft+affinity  proxy: {balance: expected_finish_time, affinity: {enabled: true, load_bound: 1.5,
                        prefix_bytes: 4096}}

(`--no-affinity-key` leaves the `affinity` block out, for a plugin that does not know it yet.)

Workload: ~30 JSON Schemas of the team's JSONSchemaBench sample that the replica's own checks
accept (request limits, then the grammar compile: gpustack_dspark/worker/schema_check.py, run
in the worker venv), each with its own seeded system prompt of >= `--prompt-tokens` tokens of
the model's tokenizer (instructions, the schema, made-up examples), then a short unique user
message; Zipf popularity over the schemas (s = `--zipf-s`), Poisson arrivals at `--rate`
(default: 0.9x the requests/s that round_robin sustains in a closed loop of `--calibrate-concurrency`
for `--calibrate-s`), streamed through GPUStack's /v1/chat/completions with `response_format:
json_schema` (strict), temperature 0, `--max-tokens`. Every configuration of one run replays
the same requests at the same times; the order of the configurations rotates per run. Before
each configuration's run every replica's prefix cache is reset. Grammars: before measuring,
each schema is sent once to each replica directly (`--cold-grammars` skips it), so every
configuration finds all grammars compiled (vLLM keeps compiled grammars for the process's life
and cannot be told to forget them; without this only the first configuration would pay).

Printed per run: one table, a row per configuration: TTFT P50/P99 (x eft), completion tokens/s
and requests/s over the run's wall time (x eft), errors, replies cut at max_tokens, the
replicas' prefix-cache hit rate (vLLM's vllm:prefix_cache_hits/queries counters, summed and per
replica), grammar compiles (a replica counter if one exists, else n/a), the time-averaged
in-flight per instance (`GET /v2/dspark/status` routing.in_flight every 0.25 s) and its max/min;
after an eft+affinity run its status' `routing.affinity` block, if any. Then medians over runs
and the paired ratios eft+affinity / eft beside the issue's targets (TTFT P50 <= 0.5x,
throughput >= 1.3x, in-flight max/min <= 2).

    .venv/bin/python -m tests.bench.affinity_routing [--model expanded] [--runs 3] [--requests 120]
        [--rate R | --rate-factor 0.9 | --closed-loop C] [--configs round_robin,eft,eft+affinity]
        [--load-bound 1.5] [--no-affinity-key]

`--closed-loop C` replaces the Poisson arrivals by C senders that each send the next request as
soon as the last is answered: the same requests at the deployment's peak throughput (what
"throughput" compares when no configuration may fall behind its arrivals: with Poisson
arrivals below every configuration's capacity, requests/s is the arrival rate for all).

    # a quick smoke (~4.5 minutes here, most of it starting things):
    .venv/bin/python -m tests.bench.affinity_routing --model fixture --requests 20 --runs 1 \\
        --configs round_robin,eft --no-affinity-key --calibrate-s 10

Needs DSPARK_WORKER_VENV (or .venv-worker in the checkout) for the replicas. The servers and the
replicas run this checkout's gpustack_dspark (PYTHONPATH), whatever the venvs installed.
Memory: ~2.9 GB per expanded replica, ~1 GB per server + worker + PostgreSQL.
How long, on this 2-core machine with the expanded model (an estimate: a cold 1,000-token
prefill costs it seconds, so a replica serves well under one request per second): ~6-8 min to
start everything and warm grammars, ~1 min calibration, then ~3-5 min per configuration and run
(120 requests near saturation): the default 3 configurations x 3 runs take roughly 40-60 minutes.
With the fixture the prompts fit too (the same 2048 context), and everything is ~10x cheaper.
Long prompts (docs/architecture.md, 2026-12-06): `--prompt-tokens 3000 --max-model-len 4096
--kv-tokens 47104` (about 15 prompts per cache) hold ~4.5 GB per replica; a closed loop of 12
with `--warmup 80 --requests 150 --configs eft,eft+affinity` took 55 minutes for three runs.
"""

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import httpx

from gpustack_dspark import backend
from gpustack_dspark.bench.runner import request_once
from gpustack_dspark.devstack.api import GPUStackAPI
from gpustack_dspark.devstack.postgres import Postgres, start_postgres
from gpustack_dspark.devstack.processes import loopback_env
from gpustack_dspark.devstack.replica import SERVED_NAME, Replica, start_replica, worker_python
from gpustack_dspark.devstack.server import GPUStackServer
from gpustack_dspark.devstack.worker import GPUStackWorker, join_cpu_worker
from gpustack_dspark.worker import request_limits
from tests.bench.models import add_model_argument, resolve
from tests.bench.schema_bench import DEFAULT_BENCH
from tests.conftest import wait_for
from tests.integration.shared_stack import listening
from tests.support.stand_in_instances import (
    RunningStateKeeper, create_stand_in_model, instances_of, wait_routable,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
AFFINITY_ON = "{{enabled: true, load_bound: {load_bound}, prefix_bytes: 4096}}"  # .format(load_bound=...)
LOAD_BOUND = 1.5  # the shipped default (policies/routing.yaml)
AFFINITY_OFF = "{{enabled: false}}"
# name -> (balance, the affinity block)
CONFIGS: Dict[str, Tuple[str, str]] = {
    "round_robin": ("round_robin", AFFINITY_OFF),
    "eft": ("expected_finish_time", AFFINITY_OFF),
    "eft+affinity": ("expected_finish_time", AFFINITY_ON),
}
BASELINE = "eft"
TARGETS = {"ttft_p50": "<= 0.5x", "tok_s": ">= 1.3x", "inflight_ratio": "<= 2"}
STATUS_EVERY_S = 0.25
PROGRESS_EVERY_S = 15.0

_T0 = time.monotonic()


def log(message: str) -> None:
    print(f"[{time.monotonic() - _T0:7.1f}s] {message}", flush=True)


def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..1); NaN for none."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[max(1, math.ceil(q * len(ordered))) - 1]


def median(values: Sequence[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(values) if values else math.nan


def ratio(a: float, b: float) -> float:
    if a is None or b is None or math.isnan(a) or math.isnan(b):
        return math.nan
    return a / b if b else (math.inf if a else math.nan)


def policy_yaml(name: str, affinity_key: bool, load_bound: float = LOAD_BOUND) -> str:
    """The routing.yaml of configuration `name`, exactly the issue's block (or without `affinity`)."""
    balance, affinity = CONFIGS[name]
    affinity = affinity.format(load_bound=load_bound)
    proxy = f"balance: {balance}" + (f", affinity: {affinity}" if affinity_key else "")
    return f"version: 1\nproxy: {{{proxy}}}\n"


# ------------------------------------------------------------------------------ workload

def tokenizer_of(model: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model))


def chat_tokens(tokenizer, messages: List[Dict[str, str]]) -> int:
    ids = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return len(ids)


CHECK_CODE = r"""
import json, sys
from pathlib import Path
from gpustack_dspark.worker import schema_check
model, paths = sys.argv[1], json.loads(sys.stdin.read())
config = json.loads((Path(model) / "config.json").read_text())
schema_check.use_model_tokenizer(model, config.get("vocab_size"))
ok = []
for p in paths:
    schema = json.loads(Path(p).read_text())
    try:
        problem = schema_check.check_schema(schema) or schema_check.xgrammar_unsupported(schema)
    except Exception as e:
        problem = repr(e)
    if problem is None:
        ok.append(p)
print(json.dumps(ok))
"""


def replica_accepts(model: Path, paths: List[Path]) -> List[Path]:
    """The schemas the replica's own check accepts (valid, compiles for this vocabulary, and
    xgrammar supports them exactly), run in the worker venv where xgrammar lives."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV",)}
    env["PYTHONPATH"] = str(REPO_ROOT)
    done = subprocess.run([str(worker_python()), "-c", CHECK_CODE, str(model)], input=json.dumps([str(p) for p in paths]),
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"schema check in the worker venv failed:\n{done.stderr[-3000:]}")
    return [Path(p) for p in json.loads(done.stdout.strip().splitlines()[-1])]


def select_schemas(bench: Path, count: int, tokenizer, max_schema_tokens: int, model: Path,
                   seed: int) -> List[Tuple[str, Dict[str, Any]]]:
    """`count` distinct object schemas, spread over the splits (seeded), each within the request
    limits, at most `max_schema_tokens` tokens as the prompt writes it, and accepted by the
    replica's check."""
    by_split: Dict[str, List[Path]] = {}
    seen = set()
    for path in sorted(bench.glob("*/*.json")):
        if path.name == "index.json":
            continue
        try:
            schema = json.loads(path.read_text())
            request_limits.check_schema(schema)
        except (ValueError, request_limits.LimitExceeded):
            continue
        if not isinstance(schema, dict) or not (schema.get("type") == "object" or "properties" in schema):
            continue  # an object per reply, as the prompts ask
        text = schema_text(schema)
        if text in seen or len(tokenizer(text)["input_ids"]) > max_schema_tokens:
            continue
        seen.add(text)
        by_split.setdefault(path.parent.name, []).append(path)
    rng = random.Random(seed)
    for paths in by_split.values():
        rng.shuffle(paths)
    interleaved: List[Path] = []  # one of each split in turn, so no split dominates
    while any(by_split.values()):
        for split in sorted(by_split):
            if by_split[split]:
                interleaved.append(by_split[split].pop())
    accepted = set(replica_accepts(model, interleaved))
    chosen = [p for p in interleaved if p in accepted][:count]
    if len(chosen) < count:
        raise SystemExit(f"only {len(chosen)} schemas of {bench} fit (wanted {count}); "
                         f"raise --prompt-tokens or lower --schemas")
    return [(re.sub(r"[^A-Za-z0-9_-]", "_", f"{p.parent.name}_{p.stem}")[:64], json.loads(p.read_text()))
            for p in chosen]


WORDS = ("amber", "river", "ledger", "orbit", "falcon", "harbor", "quartz", "meadow", "signal", "canvas",
         "summit", "lantern", "cobalt", "willow", "beacon", "delta", "ember", "glacier", "juniper", "mosaic",
         "nectar", "onyx", "prairie", "raven", "saffron", "timber", "velvet", "zephyr", "atlas", "bramble")
RULES = (
    "Reply with exactly one JSON object and nothing else: no prose, no code fences.",
    "Every required property must be present; leave out optional properties you cannot infer.",
    "Use the exact property names of the schema; never invent new ones unless the schema allows it.",
    "Numbers are plain JSON numbers without units; dates are ISO 8601 strings.",
    "When the user is vague, choose the most common sensible value rather than asking back.",
    "Strings are short and factual; do not repeat the user's message verbatim.",
    "Enumerations must use one of the listed values, spelled exactly as listed.",
    "Do not include comments, trailing commas or duplicate keys.",
)


def fake_value(node: Any, rng: random.Random, depth: int = 0) -> Any:
    """A made-up value of roughly the node's type (examples for the prompt, not validated)."""
    if not isinstance(node, dict) or depth > 2:
        return rng.choice(WORDS)
    if "enum" in node and node["enum"]:
        return rng.choice(node["enum"])
    kind = node.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "object" or "properties" in node:
        props = list((node.get("properties") or {}).items())[:6]
        return {k: fake_value(v, rng, depth + 1) for k, v in props} or {rng.choice(WORDS): rng.randint(1, 99)}
    if kind == "array":
        return [fake_value(node.get("items"), rng, depth + 1) for _ in range(rng.randint(1, 2))]
    if kind == "integer":
        return rng.randint(0, 500)
    if kind == "number":
        return round(rng.uniform(0, 500), 2)
    if kind == "boolean":
        return rng.random() < 0.5
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3)))


def user_text(rng: random.Random, tag: str) -> str:
    return f"Request {tag}: " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 12))) + "."


def schema_text(schema: Dict[str, Any]) -> str:
    return json.dumps(schema, separators=(", ", ": "), sort_keys=True)


def system_prompt(name: str, schema: Dict[str, Any], tokenizer, target: int, seed: int) -> Tuple[str, int]:
    """The schema's own long system prompt (seeded): instructions, the schema, made-up examples
    until the chat (with a typical user message) has >= `target` tokens. (text, tokens)."""
    rng = random.Random(f"{seed}:{name}")
    title = " ".join(rng.choice(WORDS).capitalize() for _ in range(2))
    rules = list(RULES)
    rng.shuffle(rules)
    parts = [f"You are the structured-output assistant of the {title} team (form {name}).",
             "Follow these rules strictly:", *(f"{i + 1}. {r}" for i, r in enumerate(rules)),
             "The reply must validate against this JSON Schema:",
             schema_text(schema), "Examples of requests and their replies:"]
    probe_user = user_text(random.Random(0), "0-0")

    def count(lines: List[str]) -> int:
        return chat_tokens(tokenizer, [{"role": "system", "content": "\n".join(lines)},
                                       {"role": "user", "content": probe_user}])

    tokens, k = count(parts), 0
    while tokens < target:  # examples while one more fits, then short notes up to the target
        k += 1
        example = json.dumps(fake_value(schema, rng), separators=(", ", ": "))
        line = f"Example {k}. User: \"{user_text(rng, f'ex{k}')}\" Reply: {example}"
        more = count(parts + [line])
        if more > target + 8:
            line = f"Note {k}: " + " ".join(rng.choice(WORDS) for _ in range(4)) + "."
            more = count(parts + [line])
        parts.append(line)
        tokens = more
        if k > 1000:
            raise RuntimeError(f"{name}: the prompt does not reach {target} tokens")
    return "\n".join(parts), tokens


@dataclass
class Item:
    at_s: float  # arrival, seconds after the run's start
    schema: int
    body: Dict[str, Any]


def workload(schemas, prompts, count: int, rate: float, zipf_s: float, max_tokens: int, seed: int) -> List[Item]:
    """`count` requests (seeded): Zipf popularity over a seeded ranking of the schemas, Poisson
    arrivals at `rate`/s, each with its schema's system prompt and a short unique user message."""
    rng = random.Random(seed)
    ranking = list(range(len(schemas)))
    rng.shuffle(ranking)
    weights = [0.0] * len(schemas)
    for rank, index in enumerate(ranking, 1):
        weights[index] = 1.0 / rank ** zipf_s
    items, at = [], 0.0
    for i in range(count):
        index = rng.choices(range(len(schemas)), weights)[0]
        name, schema = schemas[index]
        body = {"model": SERVED_NAME, "stream": True, "stream_options": {"include_usage": True},
                "temperature": 0, "max_tokens": max_tokens,
                "messages": [{"role": "system", "content": prompts[index]},
                             {"role": "user", "content": user_text(rng, f"{seed}-{i}")}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": name, "schema": schema, "strict": True}}}
        items.append(Item(at, index, body))
        at += rng.expovariate(rate) if rate > 0 else 0.0
    return items


# ------------------------------------------------------------------------------ the stack

@dataclass
class Deployment:
    """One GPUStack server with the plugin and its routing.yaml, a CPU worker, the model
    SERVED_NAME with one instance per replica port."""

    name: str
    pg: Postgres
    server: GPUStackServer
    key: str
    api: Optional[GPUStackAPI] = None
    worker: Optional[GPUStackWorker] = None
    keeper: Optional[RunningStateKeeper] = None
    row: Optional[Dict] = None
    model: Optional[Dict] = None
    port_of: Dict[str, int] = field(default_factory=dict)  # instance id (str) -> replica port

    @property
    def headers(self) -> Dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def status(self) -> Dict:
        response = httpx.get(f"{self.server.url}/v2/dspark/status", headers=self.headers, timeout=10)
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        for step in (self.keeper and self.keeper.stop, self.worker and self.worker.stop, self.server.stop,
                     self.api and self.api.close, self.pg.stop):
            if step:
                try:
                    step()
                except Exception as e:  # keep stopping the rest
                    log(f"{self.name}: stop: {type(e).__name__}: {e}")


def checkout_pythonpath() -> str:
    """The loopback PYTHONPATH with this checkout first: the servers run this tree's plugin."""
    return loopback_env(extra_paths=[str(REPO_ROOT)])["PYTHONPATH"]


def start_server(name: str, base: Path, affinity_key: bool, load_bound: float = LOAD_BOUND) -> Deployment:
    policy_dir = base / f"policy-{name.replace('+', '-')}"
    policy_dir.mkdir(parents=True, exist_ok=True)
    (policy_dir / "routing.yaml").write_text(policy_yaml(name, affinity_key, load_bound))
    pg = start_postgres(base / f"pg-{name.replace('+', '-')}")
    try:
        server = GPUStackServer(data_dir=base / f"server-{name.replace('+', '-')}", database_url=pg.url,
                                extra_args=["--dspark-policy-dir", str(policy_dir)],
                                extra_pythonpath=[str(REPO_ROOT)]).start(timeout_s=300)
    except BaseException:
        pg.stop()
        raise
    dep = Deployment(name, pg, server, server.create_api_key())
    dep.api = GPUStackAPI(server.url, dep.key)
    return dep


def check_policy(dep: Deployment, affinity_key: bool, load_bound: float = LOAD_BOUND) -> None:
    """The server runs the configuration's policy (a bad routing.yaml turns only routing off)."""
    deadline = time.monotonic() + 90
    status = dep.status()
    while status["features"].get("routing", {}).get("state") != "enabled" and time.monotonic() < deadline:
        if status["features"].get("routing", {}).get("state") in ("failed", "disabled", "error"):
            break
        time.sleep(1)
        status = dep.status()
    feature = status["features"].get("routing", {})
    routing = status.get("routing") or {}
    balance = CONFIGS[dep.name][0]
    if feature.get("state") != "enabled" or routing.get("balance") != balance:
        raise SystemExit(f"{dep.name}: routing is not running the written policy "
                         f"(feature {json.dumps(feature)[:600]}, balance {routing.get('balance')}); "
                         f"without the affinity key in the plugin, pass --no-affinity-key")
    if affinity_key:
        affinity = ((routing.get("policy") or {}).get("proxy") or {}).get("affinity")
        wanted = dep.name == "eft+affinity"
        if not affinity or bool(affinity.get("enabled")) != wanted or (
                wanted and float(affinity.get("load_bound", 0)) != load_bound):
            raise SystemExit(f"{dep.name}: the server's policy has affinity {affinity}, wanted enabled={wanted}"
                             + (f", load_bound {load_bound}" if wanted else ""))


def join_worker(dep: Deployment, base: Path) -> None:
    dep.worker = join_cpu_worker(dep.api, dep.server.url, f"bench30-{dep.name.replace('+', '-')}",
                                 base / f"worker-{dep.name.replace('+', '-')}",
                                 extra_env={"PYTHONPATH": checkout_pythonpath()})
    dep.row = dep.api.get(f"/v2/workers/{dep.worker.id}")
    wait_for(lambda: listening(dep.worker.worker_port), 120, f"{dep.name}: the worker's port")


def register_model(dep: Deployment, base: Path, ports: List[int]) -> None:
    dep.model = create_stand_in_model(dep.api, SERVED_NAME, backend.BACKEND_NAME, backend.CPU_VERSION,
                                      dep.row["cluster_id"], dep.row, ports,
                                      base / f"model-{dep.name.replace('+', '-')}")
    dep.keeper = RunningStateKeeper(GPUStackAPI(dep.server.url, dep.key), dep.row).start()
    dep.keeper.watch(dep.model["id"])
    dep.port_of = {str(i["id"]): i["ports"][0] for i in instances_of(dep.api, dep.model["id"]) if i["ports"]}
    wait_routable(dep.server.url, dep.key, SERVED_NAME, 300,
                  body={"model": SERVED_NAME, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                        "response_format": {"type": "json_object"}})


def wait_ramps_over(deps: List[Deployment], timeout_s: float = 120) -> None:
    """Until no instance is in its slow-start ramp on any server (measured runs start level)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not any((d.status().get("routing") or {}).get("slow_start", {}).get("ramping") for d in deps):
            return
        time.sleep(2)
    log("warning: slow-start ramps still running")


def replica_args(max_model_len: int, kv_bytes: int, block_size: int = 0) -> List[str]:
    return ["--enable-dspark", "--dspark-warmup-requests", "2", "--enforce-eager", "--dtype", "float32",
            "--max-model-len", str(max_model_len), "--kv-cache-memory-bytes", str(kv_bytes),
            *(["--block-size", str(block_size)] if block_size else [])]


def kv_bytes_per_token(model: Path) -> int:
    config = json.loads((model / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return 2 * config["num_hidden_layers"] * heads * head_dim * 4  # fp32


# ------------------------------------------------------------------------------ replica side

def scrape(replica: Replica) -> Dict[str, float]:
    """The counters read per run: prefix cache hits/queries, grammar compiles (if exposed)."""
    text = httpx.get(f"{replica.base_url}/metrics", timeout=10).text
    out = {"hits": 0.0, "queries": 0.0}
    compiles = None
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        value = float(line.rsplit(" ", 1)[1])
        if name == "vllm:prefix_cache_hits_total":
            out["hits"] += value
        elif name == "vllm:prefix_cache_queries_total":
            out["queries"] += value
        elif "grammar" in name and "compil" in name and name.endswith("_total"):
            compiles = (compiles or 0.0) + value
    if compiles is not None:
        out["compiles"] = compiles
    return out


def reset_prefix_caches(replicas: List[Replica], timeout_s: float = 60) -> None:
    """POST /reset_prefix_cache on every replica (vLLM's dev API); retried while blocks are held."""
    for replica in replicas:
        deadline = time.monotonic() + timeout_s
        while True:
            response = httpx.post(f"{replica.base_url}/reset_prefix_cache", timeout=30)
            if response.status_code == 404:
                raise SystemExit(f"replica :{replica.port}: no /reset_prefix_cache (VLLM_SERVER_DEV_MODE=1 unset?)")
            response.raise_for_status()
            try:
                success = bool(response.json().get("success", True))
            except ValueError:
                success = True
            if success:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"replica :{replica.port}: /reset_prefix_cache never succeeded")
            time.sleep(1)


async def warm_grammars(replicas: List[Replica], schemas) -> None:
    """Each schema once on each replica, straight to it (short prompt, 2 tokens): compiles every
    grammar everywhere before any configuration is measured."""
    async with httpx.AsyncClient(timeout=300) as client:
        async def one_replica(replica: Replica) -> int:
            failed = 0
            for name, schema in schemas:
                r = await client.post(f"{replica.base_url}/v1/chat/completions", json={
                    "model": SERVED_NAME, "max_tokens": 2, "temperature": 0,
                    "messages": [{"role": "user", "content": "Reply with a JSON object."}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema,
                                                                               "strict": True}}})
                failed += r.status_code != 200
            return failed

        failed = await asyncio.gather(*(one_replica(r) for r in replicas))
    if any(failed):
        log(f"warning: grammar warmup requests failed per replica: {failed}")


# ------------------------------------------------------------------------------ load

@dataclass
class Outcome:
    ok: bool
    latency_s: float
    ttft_s: Optional[float] = None
    tokens: int = 0
    finish: str = ""
    error: str = ""
    done_at: float = 0.0


async def stream_one(client: httpx.AsyncClient, dep: Deployment, body: Dict) -> Outcome:
    """One streamed request through the server's /v1, as `gpustack-dspark bench` sends it."""
    result = await request_once(client, dep.server.url, body, stream=True, api_key=dep.key, timeout_s=900)
    ok = result.status == 200 and not result.error and result.ttft_s is not None
    return Outcome(ok, result.latency_s, result.ttft_s, result.output_tokens, result.finish_reason,
                   result.error or ("" if ok else "no content"), time.perf_counter())


async def sample_in_flight(dep: Deployment, stop: asyncio.Event, samples: List[Dict[str, int]]) -> None:
    async with httpx.AsyncClient(timeout=10, headers=dep.headers) as client:
        while not stop.is_set():
            try:
                response = await client.get(f"{dep.server.url}/v2/dspark/status")
                rows = (response.json().get("routing") or {}).get("in_flight") or {}
                samples.append({k: int(v.get("in_flight") or 0) for k, v in rows.items() if k in dep.port_of})
            except (httpx.HTTPError, ValueError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), STATUS_EVERY_S)
            except asyncio.TimeoutError:
                pass


async def send_load(dep: Deployment, items: List[Item], label: str,
                    concurrency: int = 0) -> Tuple[List[Outcome], float, List[Dict]]:
    """Sends every item at its arrival time (Poisson, open loop), or with `concurrency` > 0 in a
    closed loop: that many senders, each sending the next item as soon as its last one is
    answered (arrival times ignored) — the deployment's peak throughput on the same requests.
    Returns the outcomes, the wall time from the first send to the last answer, and the
    in-flight samples taken meanwhile."""
    outcomes: List[Outcome] = []
    samples: List[Dict[str, int]] = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=len(items) + 8, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=30), limits=limits) as client:
        sampler = asyncio.create_task(sample_in_flight(dep, stop, samples))
        start = time.perf_counter()
        queue = iter(items)

        async def one(item: Item) -> None:
            delay = start + item.at_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            outcomes.append(await stream_one(client, dep, item.body))

        async def sender() -> None:
            for item in queue:  # one shared iterator: each item is sent once
                outcomes.append(await stream_one(client, dep, item.body))

        async def progress() -> None:
            while True:
                await asyncio.sleep(PROGRESS_EVERY_S)
                errors = sum(not o.ok for o in outcomes)
                log(f"  {label}: {len(outcomes)}/{len(items)} done, {errors} errors")

        reporter = asyncio.create_task(progress())
        try:
            if concurrency > 0:
                await asyncio.gather(*(sender() for _ in range(concurrency)))
            else:
                await asyncio.gather(*(one(item) for item in items))
        finally:
            reporter.cancel()
            stop.set()
            await sampler
        wall = max((o.done_at for o in outcomes), default=time.perf_counter()) - start
    return outcomes, wall, samples


async def closed_loop_rate(dep: Deployment, items: List[Item], concurrency: int, seconds: float) -> float:
    """Requests/s answered by a closed loop of `concurrency` over `seconds` (items in turn)."""
    done = [0]
    queue = iter(items)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900, connect=30)) as client:
        start = time.perf_counter()
        deadline = start + seconds

        async def loop() -> None:
            while time.perf_counter() < deadline:
                item = next(queue, None)
                if item is None:
                    return
                outcome = await stream_one(client, dep, item.body)
                if outcome.ok and time.perf_counter() <= deadline:
                    done[0] += 1

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        elapsed = min(time.perf_counter(), deadline) - start
    return done[0] / elapsed if elapsed > 0 else 0.0


# ------------------------------------------------------------------------------ one run

def measure(dep: Deployment, replicas: List[Replica], items: List[Item], label: str,
            concurrency: int = 0, warmup: Optional[List[Item]] = None, warmup_concurrency: int = 12) -> Dict[str, Any]:
    """One configuration on `items` from empty prefix caches; with `warmup`, those requests go
    first in a closed loop of `warmup_concurrency`, unmeasured (the steady state of a long job:
    each key's first miss on each replica is paid there, not in the figures)."""
    reset_prefix_caches(replicas)
    if warmup:
        outcomes, wall, _ = asyncio.run(send_load(dep, warmup, f"{label} warm-up", warmup_concurrency))
        log(f"{label} warm-up: {len(warmup)} requests in {wall:.0f} s, {sum(not o.ok for o in outcomes)} errors "
            f"(not measured)")
    before = [scrape(r) for r in replicas]
    status_before = dep.status().get("routing") or {}
    outcomes, wall, samples = asyncio.run(send_load(dep, items, label, concurrency))
    after = [scrape(r) for r in replicas]
    status_after = dep.status().get("routing") or {}
    ok = [o for o in outcomes if o.ok]
    ports = [r.port for r in replicas]
    per_replica = []
    for b, a in zip(before, after):
        queries = a["queries"] - b["queries"]
        per_replica.append((a["hits"] - b["hits"]) / queries if queries else math.nan)
    hits = sum(a["hits"] - b["hits"] for a, b in zip(after, before))
    queries = sum(a["queries"] - b["queries"] for a, b in zip(after, before))
    compiles = (None if not all("compiles" in x for x in before + after)
                else sum(a["compiles"] - b["compiles"] for a, b in zip(after, before)))
    # time-averaged in-flight per instance (uniform samples), in replica order
    averages = []
    for port in ports:
        ids = [i for i, p in dep.port_of.items() if p == port]
        values = [sum(s.get(i, 0) for i in ids) for s in samples]
        averages.append(sum(values) / len(values) if values else math.nan)
    low = min(averages) if averages else math.nan
    ramps = ((status_after.get("slow_start") or {}).get("ramps_started", 0)
             - (status_before.get("slow_start") or {}).get("ramps_started", 0))
    errors = [o.error for o in outcomes if not o.ok]
    return {
        "requests": len(outcomes), "ok": len(ok), "errors": len(errors), "error_examples": errors[:3],
        "cut": sum(o.finish == "length" for o in ok),
        "ttft_p50": pct([o.ttft_s for o in ok], 0.5), "ttft_p99": pct([o.ttft_s for o in ok], 0.99),
        "latency_p50": pct([o.latency_s for o in ok], 0.5),
        "tok_s": sum(o.tokens for o in ok) / wall if wall > 0 else math.nan,
        "req_s": len(ok) / wall if wall > 0 else math.nan, "wall_s": wall,
        "hit_rate": hits / queries if queries else math.nan, "hit_rate_per_replica": per_replica,
        "hit_tokens": hits, "query_tokens": queries,
        "compiles": compiles, "inflight_avg": averages,
        "inflight_ratio": (max(averages) / low if low > 0 else math.inf) if averages else math.nan,
        "status_samples": len(samples), "ramps": ramps, "affinity": status_after.get("affinity"),
    }


# ------------------------------------------------------------------------------ report

def fmt(value: Optional[float], spec: str = ".2f") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf"
    return format(value, spec)


def x_base(value: float, base: Optional[float]) -> str:
    return "" if base is None else f" ({fmt(ratio(value, base))}x)"


def print_run_table(title: str, results: Dict[str, Dict[str, Any]]) -> None:
    base = results.get(BASELINE)
    print(f"\n{title}  (x: ratio to {BASELINE})" if base else f"\n{title}")
    print("| configuration | ok / errors / cut | TTFT P50 s | TTFT P99 s | completion tok/s | req/s "
          "| prefix hit % (per replica) | grammar compiles | in-flight avg per instance | in-flight max/min |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        b = base or {}
        per = "/".join(fmt(100 * h, ".0f") for h in r["hit_rate_per_replica"])
        compiles = "n/a" if r["compiles"] is None else fmt(r["compiles"], ".0f")
        avgs = "/".join(fmt(a, ".2f") for a in r["inflight_avg"])
        print(f"| {name} | {r['ok']} / {r['errors']} / {r['cut']} "
              f"| {fmt(r['ttft_p50'], '.3f')}{x_base(r['ttft_p50'], b.get('ttft_p50'))} "
              f"| {fmt(r['ttft_p99'], '.3f')}{x_base(r['ttft_p99'], b.get('ttft_p99'))} "
              f"| {fmt(r['tok_s'], '.1f')}{x_base(r['tok_s'], b.get('tok_s'))} "
              f"| {fmt(r['req_s'], '.3f')}{x_base(r['req_s'], b.get('req_s'))} "
              f"| {fmt(100 * r['hit_rate'], '.1f')} ({per}) | {compiles} | {avgs} | {fmt(r['inflight_ratio'])} |")
    for name, r in results.items():
        notes = [f"prefix cache {r['hit_tokens']:.0f} of {r['query_tokens']:.0f} prompt tokens hit; "
                 f"wall {r['wall_s']:.0f} s; {r['status_samples']} status samples"]
        if r["error_examples"]:
            notes.append(f"errors e.g. {r['error_examples']}")
        if r["ramps"]:
            notes.append(f"{r['ramps']} slow-start ramp(s) began during the run (an instance re-turned RUNNING)")
        print(f"  {name}: " + "; ".join(notes))
    sys.stdout.flush()


def print_summary(per_run: List[Dict[str, Dict[str, Any]]], names: List[str]) -> None:
    keys = ("ttft_p50", "ttft_p99", "tok_s", "req_s", "hit_rate", "inflight_ratio", "errors")
    print(f"\nSummary over {len(per_run)} run(s): medians per configuration")
    print("| configuration | TTFT P50 s | TTFT P99 s | completion tok/s | req/s | prefix hit % | in-flight max/min "
          "| errors (sum) |")
    print("|---|---|---|---|---|---|---|---|")
    for name in names:
        runs = [run[name] for run in per_run if name in run]
        m = {k: median([r[k] for r in runs]) for k in keys}
        print(f"| {name} | {fmt(m['ttft_p50'], '.3f')} | {fmt(m['ttft_p99'], '.3f')} | {fmt(m['tok_s'], '.1f')} "
              f"| {fmt(m['req_s'], '.3f')} | {fmt(100 * m['hit_rate'], '.1f')} | {fmt(m['inflight_ratio'])} "
              f"| {sum(r['errors'] for r in runs)} |")
    if "eft+affinity" in names and BASELINE in names:
        paired = [(run["eft+affinity"], run[BASELINE]) for run in per_run]
        ttft = [ratio(a["ttft_p50"], b["ttft_p50"]) for a, b in paired]
        tok = [ratio(a["tok_s"], b["tok_s"]) for a, b in paired]
        inflight = [a["inflight_ratio"] for a, _ in paired]
        print("\neft+affinity vs eft (median of the per-run ratios; per run in brackets) | issue 30's target")
        print(f"  TTFT P50 ratio       {fmt(median(ttft))}  [{', '.join(fmt(v) for v in ttft)}]  | {TARGETS['ttft_p50']}")
        print(f"  throughput ratio     {fmt(median(tok))}  [{', '.join(fmt(v) for v in tok)}]  | {TARGETS['tok_s']}")
        print(f"  in-flight max/min    {fmt(median(inflight))}  [{', '.join(fmt(v) for v in inflight)}]  "
              f"| {TARGETS['inflight_ratio']}")
    sys.stdout.flush()


# ------------------------------------------------------------------------------ main

def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_argument(parser, default="expanded")
    parser.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--no-affinity-key", action="store_true",
                        help="write routing.yaml without the `affinity` block (a plugin that does not know it)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--requests", type=int, default=120, help="per configuration and run")
    parser.add_argument("--rate", type=float, default=0.0,
                        help="Poisson arrivals per second (default: calibrated, see --rate-factor)")
    parser.add_argument("--rate-factor", type=float, default=0.9,
                        help="without --rate: this times round_robin's closed-loop requests/s")
    parser.add_argument("--load-bound", type=float, default=LOAD_BOUND,
                        help="eft+affinity's proxy.affinity.load_bound (1-10; the shipped default 1.5)")
    parser.add_argument("--closed-loop", type=int, default=0, metavar="C",
                        help="instead of Poisson arrivals: C senders in a closed loop over the same requests "
                             "(peak throughput; no calibration)")
    parser.add_argument("--warmup", type=int, default=0, metavar="N",
                        help="before each configuration's measured requests, N others of the same workload "
                             "(closed loop, not measured): steady-state figures, first misses excluded")
    parser.add_argument("--calibrate-concurrency", type=int, default=12)
    parser.add_argument("--calibrate-s", type=float, default=30.0)
    parser.add_argument("--schemas", type=int, default=30)
    parser.add_argument("--zipf-s", type=float, default=1.1)
    parser.add_argument("--prompt-tokens", type=int, default=1000,
                        help="each schema's system prompt: at least this many tokens (with the user message)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--kv-tokens", type=int, default=14336,
                        help="each replica's KV cache in tokens (14336: ~1 GiB of the expanded model)")
    parser.add_argument("--block-size", type=int, default=0,
                        help="the replicas' KV block size in tokens (vLLM on CPU: 128 unless set; a multiple of 32): "
                             "prefix-cache hits are whole blocks")
    parser.add_argument("--cold-grammars", action="store_true", help="skip compiling every grammar up front")
    parser.add_argument("--seed", type=int, default=30)
    parser.add_argument("--bench", type=Path, default=DEFAULT_BENCH, help="the JSONSchemaBench sample")
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.configs.split(",") if n.strip()]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown or not names:
        parser.error(f"--configs: unknown {unknown} (allowed: {', '.join(CONFIGS)})")
    affinity_key = not args.no_affinity_key
    if not affinity_key and "eft+affinity" in names:
        print("warning: --no-affinity-key: eft+affinity runs without the affinity block (= eft)", flush=True)

    def interrupted(*_):
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, interrupted)

    log(f"model {args.model}: resolving")
    model, _ = resolve(args.model)
    tokenizer = tokenizer_of(model)
    kv_bytes = kv_bytes_per_token(model) * args.kv_tokens
    if args.prompt_tokens + args.max_tokens + 64 > args.max_model_len:
        parser.error("--prompt-tokens + --max-tokens must fit --max-model-len (with ~64 to spare)")
    base = Path(tempfile.mkdtemp(prefix="dspark-affinity-bench-"))
    log(f"model {model}; logs and data under {base}")

    replicas: List[Replica] = []
    deps: List[Deployment] = []
    try:
        log("replicas: starting 3 (they load while the servers start)")
        env = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1", "PYTHONPATH": str(REPO_ROOT)}
        for i in range(3):
            replicas.append(start_replica(base / f"replica-{i}.log",
                                          replica_args(args.max_model_len, kv_bytes, args.block_size),
                                          model=model, cpu_layout=False, env=env))

        log(f"workload: choosing {args.schemas} schemas of {args.bench}")
        schemas = select_schemas(args.bench, args.schemas, tokenizer, max(args.prompt_tokens // 2, 400), model,
                                 args.seed)
        prompts, counts = [], []
        for name, schema in schemas:
            text, tokens = system_prompt(name, schema, tokenizer, args.prompt_tokens, args.seed)
            assert tokens >= args.prompt_tokens, (name, tokens)
            assert tokens + args.max_tokens <= args.max_model_len, (name, tokens)
            prompts.append(text)
            counts.append(tokens)
        log(f"workload: {len(schemas)} schemas, prompt tokens min {min(counts)} / median "
            f"{int(statistics.median(counts))} / max {max(counts)} (+ max_tokens {args.max_tokens} "
            f"<= {args.max_model_len})")

        for name in names:
            log(f"server {name}: starting (routing.yaml: "
                f"{policy_yaml(name, affinity_key, args.load_bound).splitlines()[1]})")
            deps.append(start_server(name, base, affinity_key, args.load_bound))
            check_policy(deps[-1], affinity_key, args.load_bound)
            join_worker(deps[-1], base)
        log("replicas: waiting until ready")
        for replica in replicas:
            replica.wait_ready(900)
        ports = [r.port for r in replicas]
        log(f"replicas ready on ports {ports}")
        for dep in deps:
            log(f"server {dep.name}: registering the model on the 3 replica ports")
            register_model(dep, base, ports)
        reset_prefix_caches(replicas)  # fails early if the dev API is missing
        if not args.cold_grammars:
            log(f"grammars: compiling each schema on each replica ({len(schemas) * len(replicas)} requests)")
            asyncio.run(warm_grammars(replicas, schemas))

        rate = args.rate
        if rate <= 0 and not args.closed_loop:
            calibrator = next((d for d in deps if d.name == "round_robin"), deps[0])
            log(f"calibration: closed loop of {args.calibrate_concurrency} on {calibrator.name} for "
                f"{args.calibrate_s:.0f} s")
            reset_prefix_caches(replicas)
            items = workload(schemas, prompts, 100000, 0.0, args.zipf_s, args.max_tokens, args.seed + 1000)
            sustained = asyncio.run(closed_loop_rate(calibrator, items, args.calibrate_concurrency, args.calibrate_s))
            rate = args.rate_factor * sustained
            log(f"calibration: {sustained:.3f} requests/s sustained; rate {rate:.3f}/s ({args.rate_factor}x)")
            if rate <= 0:
                raise SystemExit("calibration answered nothing; pass --rate")
        wait_ramps_over(deps)

        by_name = {d.name: d for d in deps}
        per_run: List[Dict[str, Dict[str, Any]]] = []
        for run in range(args.runs):
            # warm-up requests continue the same seeded list (same popularity ranking; the measured
            # ones are exactly those of a run without warm-up)
            items = workload(schemas, prompts, args.requests + args.warmup, 0.0 if args.closed_loop else rate,
                             args.zipf_s, args.max_tokens, args.seed + run)
            items, warmup = items[:args.requests], items[args.requests:]
            load = (f"closed loop of {args.closed_loop}" if args.closed_loop
                    else f"rate {rate:.3f}/s (arrivals over {items[-1].at_s:.0f} s)")
            order = names[run % len(names):] + names[:run % len(names)]
            results: Dict[str, Dict[str, Any]] = {}
            for name in order:
                label = f"run {run + 1}/{args.runs} {name}"
                log(f"{label}: {len(items)} requests, {load}, prefix caches reset")
                results[name] = measure(by_name[name], replicas, items, label, args.closed_loop, warmup,
                                        args.closed_loop or args.calibrate_concurrency)
                r = results[name]
                log(f"{label}: done in {r['wall_s']:.0f} s, {r['ok']} ok, {r['errors']} errors, "
                    f"TTFT P50 {fmt(r['ttft_p50'], '.3f')} s, hit rate {fmt(100 * r['hit_rate'], '.1f')} %")
                if name == "eft+affinity" and r["affinity"] is not None:
                    print(f"  routing.affinity: {json.dumps(r['affinity'], separators=(',', ':'))}", flush=True)
            results = {n: results[n] for n in names}
            per_run.append(results)
            after = f", after {args.warmup} unmeasured" if args.warmup else ""
            print_run_table(f"Run {run + 1}/{args.runs} (order {', '.join(order)}; {args.requests} requests, "
                            f"{load.split(' (')[0]}{after}, model {model.name}, {len(schemas)} schemas, "
                            f"Zipf s={args.zipf_s}, prompts >= {args.prompt_tokens} tokens, "
                            f"max_tokens {args.max_tokens})", results)
        print_summary(per_run, names)
    finally:
        log("cleanup: stopping servers, workers, PostgreSQL and replicas")
        for dep in deps:
            dep.stop()
        for replica in replicas:
            try:
                replica.stop()
            except Exception as e:
                log(f"replica :{replica.port}: stop: {type(e).__name__}: {e}")
        log(f"done; logs under {base}")


if __name__ == "__main__":
    main()
