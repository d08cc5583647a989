"""Real-world schemas through GPUStack's `/v1`: JSONSchemaBench, one request per schema.

Not a test. One run starts a real PostgreSQL, then per configuration a real GPUStack 2.3
server with the plugin, a real CPU worker and one real `dspark-serve` replica (real vLLM on
CPU, the tiny fixture model), and sends every schema once with the OpenAI SDK
(`response_format: json_schema`, "Reply with a JSON object.", temperature 0):

- `before`: what was built before issue 20: GPUStack's stock status codes (routing policy
  `proxy.pass_replica_status: false`), xgrammar only (`--structured-outputs-config` naming it)
  and schemas vLLM's xgrammar backend refuses refused (`DSPARK_SCHEMA_RELAX=0`);
- `relaxed`: the replica's own status passed through, xgrammar only, those schemas served with
  the refused keywords relaxed out of the grammar and the reply checked against the original;
- `after` (the default replica): both engines (xgrammar first, llguidance where xgrammar
  refuses or cannot compile the schema, lenient only where the reply is checked), and one more
  attempt with the other engine after a withheld reply.

Each reply is classified: valid (finished and validates), cut by max_tokens, refused (status
and reason), withheld (the replica's reply check: 5xx SchemaViolationError), invalid delivered
(finished, delivered and does not validate: must be 0), error (no answer). Prints a table per
split and in total for both configurations.

    .venv/bin/python -m tests.bench.schema_bench [--per-split N] [--limit N] [--max-tokens 256]
        [--concurrency 2] [--temperature 1 --samples 3 [--seed S]] [--out results.json]

The sampled property test is `--only after --temperature 1 --samples 3`: every reply either
valid, cut by max_tokens, or refused before any token; each withheld (or invalid) reply is
listed with its schema, sample and cause. CI runs a slice of it (`property_slice`,
tests/integration/test_request_path.py).

All 333 schemas take about half an hour per configuration on a busy 2-core machine (~5 s a
request at concurrency 2 with the tiny CPU model); `--per-split 10` takes a third of that.
"""

import argparse
import collections
import json
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, Tuple

CLASSES = ("valid", "cut", "refused", "withheld", "invalid", "error")
DEFAULT_BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"


def bench_paths(bench: Path, limit: int = 0, per_split: int = 0) -> List[Path]:
    paths = sorted(bench.glob("*/*.json"))
    if per_split:
        by_split: Dict[str, List[Path]] = collections.defaultdict(list)
        for path in paths:
            by_split[path.parent.name].append(path)
        paths = [p for split in sorted(by_split) for p in by_split[split][:per_split]]
    return paths[:limit] if limit else paths


def classify(schema: Any, status: int, body: Any) -> Tuple[str, str]:
    """(class, detail) of one answer (pure)."""
    import jsonschema

    if status != 200:
        error = body.get("error") if isinstance(body, dict) else None
        error = error if isinstance(error, dict) else (body if isinstance(body, dict) else {})
        message = str(error.get("message") or body)[:160]
        if status >= 500 and error.get("type") == "SchemaViolationError":
            return "withheld", message
        return "refused", f"{status} {message}"
    choice = body["choices"][0]
    content = choice["message"].get("content") or ""
    if choice.get("finish_reason") == "length":
        return "cut", ""
    try:
        jsonschema.validators.validator_for(schema)(schema).validate(json.loads(content))
    except Exception as e:
        return "invalid", str(e).splitlines()[0][:160]
    return "valid", ""


def property_slice(bench: Path) -> List[Path]:
    """CI's slice of the bench for the sampled property test: the first schema of each split,
    and the first of each split that the request path says again in another form
    (worker/normalize.py)."""
    from gpustack_dspark.worker import normalize

    paths = bench_paths(bench, per_split=1)
    said: Dict[str, Path] = {}
    for path in bench_paths(bench):
        if path.parent.name not in said and normalize.normalized(json.loads(path.read_text()))[1]:
            said[path.parent.name] = path
    return paths + [p for p in said.values() if p not in paths]


def run_requests(url: str, key: str, model: str, paths: List[Path], max_tokens: int,
                 concurrency: int, temperature: float = 0.0, samples: int = 1,
                 seed: int = 0) -> List[Dict[str, Any]]:
    """Each schema `samples` times (sample i with seed `seed * 1000 + i`), in the OpenAI SDK's
    own request, classified (`classify`)."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=300)

    def one(job: Tuple[Path, int]) -> Dict[str, Any]:
        path, sample = job
        schema = json.loads(path.read_text())
        started = time.monotonic()
        try:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=[{"role": "user", "content": "Reply with a JSON object."}],
                temperature=temperature, seed=seed * 1000 + sample,
                max_tokens=max_tokens, response_format={"type": "json_schema", "json_schema": {
                    "name": "bench", "schema": schema}})
            status, body = raw.http_response.status_code, raw.http_response.json()
        except openai.APIStatusError as e:
            status = e.status_code
            try:
                body = e.response.json()
            except ValueError:
                body = {"error": {"message": e.response.text[:300]}}
        except Exception as e:  # no answer at all
            return {"path": str(path), "split": path.parent.name, "sample": sample, "class": "error",
                    "detail": repr(e)[:200], "seconds": round(time.monotonic() - started, 2)}
        kind, detail = classify(schema, status, body)
        content = body["choices"][0]["message"].get("content") if status == 200 else None
        return {"path": str(path), "split": path.parent.name, "sample": sample, "class": kind, "detail": detail,
                "status": status, "content": content, "seconds": round(time.monotonic() - started, 2)}

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, [(p, i) for p in paths for i in range(samples)]))


def withheld_lines(results: List[Dict[str, Any]]) -> List[str]:
    """One line per withheld or invalid reply: which schema, which sample, the cause."""
    return [f"{r['class']:9} {Path(r['path']).parent.name}/{Path(r['path']).stem} sample {r.get('sample', 0)}: "
            f"{r['detail']}" for r in results if r["class"] in ("withheld", "invalid")]


def summary(results: List[Dict[str, Any]]) -> Dict[str, Dict[str, int]]:
    table: Dict[str, Dict[str, int]] = collections.defaultdict(lambda: {c: 0 for c in CLASSES})
    for r in results:
        table[r["split"]][r["class"]] += 1
        table["TOTAL"][r["class"]] += 1
    return dict(table)


def print_tables(out: Dict[str, List[Dict[str, Any]]]) -> None:
    names = list(out)
    tables = {name: summary(results) for name, results in out.items()}
    splits = sorted({s for t in tables.values() for s in t if s != "TOTAL"}) + ["TOTAL"]
    print("\n| split | " + " | ".join(f"{n}: valid / cut / refused / withheld / invalid / error" for n in names) + " |")
    print("|---|" + "---|" * len(names))
    for split in splits:
        cells = []
        for name in names:
            row = tables[name].get(split, {c: 0 for c in CLASSES})
            cells.append(" / ".join(str(row[c]) for c in CLASSES))
        print(f"| {split} | " + " | ".join(cells) + " |")
    for name in names:
        total = tables[name]["TOTAL"]
        n = sum(total.values()) or 1
        statuses = collections.Counter(r.get("status") for r in out[name] if r["class"] == "refused")
        print(f"{name}: served-and-valid + cut = {100 * (total['valid'] + total['cut']) / n:.1f}% of {n}; "
              f"invalid delivered = {total['invalid']}; refusal statuses {dict(statuses)}")
        # The replica's own verdict that no document satisfies a schema (worker/one_of.py): listed,
        # so each can be checked by hand, and the share served among the others beside it.
        impossible = [r["path"] for r in out[name] if "no document satisfies" in r["detail"]]
        if impossible:
            print(f"    refused as unsatisfiable: {', '.join(Path(p).parent.name + '/' + Path(p).stem for p in impossible)}; "
                  f"served among the other {n - len(impossible)}: "
                  f"{100 * (total['valid'] + total['cut']) / max(1, n - len(impossible)):.1f}%")
        reasons = collections.Counter(r["detail"][:90] for r in out[name] if r["class"] == "refused")
        for reason, count in reasons.most_common(6):
            print(f"    {count:4d}  {reason}")
        for line in withheld_lines(out[name]):  # every one, with its cause
            print(f"    {line}")


XGRAMMAR_ONLY = ["--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}']
CONFIGS = (("before", False, False, XGRAMMAR_ONLY), ("relaxed", True, True, XGRAMMAR_ONLY), ("after", True, True, []))


def run_config(name: str, pass_status: bool, relax: bool, replica_args: List[str], pg, base: Path, paths,
               args) -> List[Dict[str, Any]]:
    from gpustack_dspark import backend
    from gpustack_dspark.devstack.api import GPUStackAPI
    from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica
    from gpustack_dspark.devstack.server import GPUStackServer
    from tests.support.stand_in_instances import RunningStateKeeper, create_stand_in_model, wait_routable
    from gpustack_dspark.devstack.worker import join_cpu_worker

    policy_dir = base / f"policy-{name}"
    policy_dir.mkdir()
    (policy_dir / "routing.yaml").write_text(f"version: 1\nproxy:\n  pass_replica_status: {str(pass_status).lower()}\n")
    replica = start_replica(base / f"replica-{name}.log", ["--enable-dspark", "--dspark-warmup-requests", "2",
                                                           *replica_args],
                            env={"DSPARK_SCHEMA_RELAX": "1" if relax else "0"})
    pg.reset()
    server = GPUStackServer(data_dir=base / f"server-{name}", database_url=pg.url,
                            extra_args=["--dspark-policy-dir", str(policy_dir)]).start(timeout_s=600)
    key = server.create_api_key()
    api = GPUStackAPI(server.url, key)
    worker = keeper = None
    try:
        worker = join_cpu_worker(api, server.url, f"bench-{name}", base / f"worker-{name}")
        row = api.get(f"/v2/workers/{worker.id}")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(b["backend_name"] == backend.BACKEND_NAME for b in api.items("/v2/inference-backends")):
                break
            time.sleep(1)
        replica.wait_ready(600)
        model = create_stand_in_model(api, SERVED_NAME, backend.BACKEND_NAME, backend.CPU_VERSION,
                                      row["cluster_id"], row, [replica.port], base / f"model-{name}")
        keeper = RunningStateKeeper(GPUStackAPI(server.url, key), row).start()
        keeper.watch(model["id"])
        wait_routable(server.url, key, SERVED_NAME, 300)
        started = time.monotonic()
        results = run_requests(server.url, key, SERVED_NAME, paths, args.max_tokens, args.concurrency,
                               args.temperature, args.samples, args.seed)
        print(f"== {name}: {len(results)} requests in {time.monotonic() - started:.0f} s", flush=True)
        counters = replica.info()["requests"]
        print(f"== {name}: replica counters {json.dumps(counters)}", flush=True)
        return results
    finally:
        if keeper:
            keeper.stop()
        if worker:
            worker.stop()
        server.stop()
        api.close()
        replica.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bench", type=Path, default=DEFAULT_BENCH)
    parser.add_argument("--limit", type=int, default=0, help="first N schemas (sorted by path); 0 = all")
    parser.add_argument("--per-split", type=int, default=0, help="first N schemas of each split; 0 = all")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--only", choices=[c[0] for c in CONFIGS], action="append",
                        help="run only this configuration (repeatable)")
    parser.add_argument("--match", action="append", default=[],
                        help="only schemas whose split/name contains this text (repeatable)")
    parser.add_argument("--temperature", type=float, default=0.0,
                        help="sampling temperature (default 0; the sampled property test: 1)")
    parser.add_argument("--samples", type=int, default=1, help="requests per schema, each with its own seed")
    parser.add_argument("--seed", type=int, default=None, help="the run's seed (default: drawn and printed)")
    parser.add_argument("--out", type=Path, help="write every classified reply as JSON")
    args = parser.parse_args()
    if args.seed is None:
        import random

        args.seed = random.randrange(1, 10 ** 6)
    print(f"temperature {args.temperature}, {args.samples} sample(s) per schema, seed {args.seed}", flush=True)

    from gpustack_dspark.devstack.postgres import start_postgres

    paths = bench_paths(args.bench, args.limit, args.per_split)
    if args.match:
        paths = [p for p in paths if any(m in f"{p.parent.name}/{p.stem}" for m in args.match)]
    if not paths:
        raise SystemExit(f"no schemas under {args.bench}")
    base = Path(tempfile.mkdtemp(prefix="dspark-schema-bench-"))
    pg = start_postgres(base / "pg")
    out: Dict[str, List[Dict[str, Any]]] = {}
    try:
        for name, pass_status, relax, replica_args in CONFIGS:
            if args.only and name not in args.only:
                continue
            out[name] = run_config(name, pass_status, relax, replica_args, pg, base, paths, args)
    finally:
        pg.stop()
    print_tables(out)
    if args.out:
        args.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
