"""Benchmark: DSpark drafting variants side by side, in one run, on real vLLM (CPU).

    .venv/bin/python -m tests.bench.drafting [--requests 48] [--concurrency 8] [--model expanded] [--rounds 3]

One replica per variant (identical vLLM settings and speculative length), started one after
the other; with `--rounds N` all of them are up at once and each round runs every variant back
to back, the ratio to no speculation taken per round (paired: on this shared 2-core machine
the no-speculation arm alone moved 18 % between two sequential runs). Each serves two
workloads: order JSON (the schema of tests/bench/order_json.py) and a
fixed schema from JSONSchemaBench (Glaiveai2K `book_flight_ec10069a`, MIT, copied to
tests/bench/data/). Variants: no speculation / vLLM's base drafter only (n-gram) / the layer's
statistical drafts only / grammar-forced drafts only / forced + statistical, and a threshold
sweep of forced + statistical; last (after `--lengths`' variants), forced + statistical with
one-hot drafts at every temperature (the layer before sampled drafts), then with drawn tokens
from the continuation counts only (the layer before it drew from the verifier's rows). Grammar engines
(issue 20): forced + statistical with xgrammar
only (the replica before both engines), and with every request's grammar held by llguidance
(the `x-dspark-engine` annotation) — the default variant has both engines, xgrammar serving
these schemas.

Last of all, no speculation with the requests' response format left out: what constrained
decoding does to accuracy (a reply that is not JSON scores no field).

Figures per workload: output tok/s and its ratio to no speculation, P50/P99, acceptance,
forced tokens' acceptance, sampled tokens (temperature > 0: their share of the draft tokens /
the share kept), output tokens per target forward pass, the layer's own share of the
profiled step time and vLLM's split of a request's time into prefill and decode (per request,
ms: at concurrency 1 the prompt's forward is a fixed cost no draft shortens). Every step of the target model yields one sampled
token plus the drafts it accepted, so forward passes = output tokens - accepted draft tokens
(vLLM's counters, read before and after): a figure that does not depend on the hardware.
Figures, not assertions. `--model expanded` serves the benchmark model instead of the fixture
(same tokens, a ~100 M-parameter model's step cost: docs/drafting.md, "The benchmark model").
"""

import argparse
import asyncio
import itertools
import json
import math
import secrets
import shlex
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import httpx

from gpustack_dspark.bench.load import acceptance, json_check, run_load, spec_counters
from gpustack_dspark.bench import extraction
from gpustack_dspark.bench.workloads import ORDER_SCHEMA, order_body
from gpustack_dspark.console.figures import increase, parse_metrics
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica
from gpustack_dspark.worker.drafting.ngram_index import SOURCES  # where a statistical token came from
from tests.bench.models import add_model_argument, resolve
from tests.bench.order_json import SAME_VLLM_ARGS

FIXED_SCHEMA = json.loads((Path(__file__).parent / "data" / "glaive_book_flight.schema.json").read_text())
CITIES = ("Paris", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Seoul", "Rome")


def fixed_schema_bodies(count: int, max_tokens: int, temperature: float, offset: int = 0) -> List[Dict]:
    bodies = []
    for i in range(offset, offset + count):
        prompt = (f"Book a flight to {CITIES[i % len(CITIES)]} for {1 + i % 4} passengers, leaving "
                  f"2026-0{1 + i % 9}-1{i % 10} and returning 2026-0{1 + i % 9}-2{i % 10}. "
                  f"Schema: {json.dumps(FIXED_SCHEMA, separators=(',', ':'))}")
        bodies.append({"model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}],
                       "max_tokens": max_tokens, "temperature": temperature, "seed": i,
                       "response_format": {"type": "json_schema",
                                           "json_schema": {"name": "book_flight", "schema": FIXED_SCHEMA}}})
    return bodies


EXTRACTION = "extraction (six families, fresh records)"


@dataclass(frozen=True)
class Batch:
    """One arm's requests: the bodies, the schema they share (None: each its own) and, for
    extraction, the tasks they were written from (to score replies against)."""
    bodies: List[Dict]
    schema: Optional[Dict]
    tasks: Optional[List[extraction.Task]] = None


def workload_names(kind: str) -> List[str]:
    if kind == "extraction":
        return [EXTRACTION]
    return ["order JSON", "fixed schema (JSONSchemaBench Glaiveai2K book_flight)"]


def batch(workload: str, count: int, serial: int, seed: int, max_tokens: int, temperature: float,
          top_p: Optional[float], example: str = extraction.PER_REQUEST) -> Batch:
    """`count` requests of `workload` no earlier batch of this run had: `serial` numbers the batch
    (a round and concurrency level, or the warmup), and each serial draws new requests
    (extraction: their worked examples as `example` says, `extraction.EXAMPLES`)."""
    if workload == EXTRACTION:
        tasks = extraction.tasks(seed * 1000 + serial, count, example=example)
        return Batch([extraction.body(t, SERVED_NAME, temperature, top_p) for t in tasks], None, tasks)
    if workload == "order JSON":
        bodies, schema = [order_body(serial * count + i, max_tokens, temperature, SERVED_NAME)
                          for i in range(count)], ORDER_SCHEMA
    else:
        bodies, schema = fixed_schema_bodies(count, max_tokens, temperature, serial * count), FIXED_SCHEMA
    if top_p is not None:
        bodies = [{**body, "top_p": top_p} for body in bodies]
    return Batch(bodies, schema)


FORCED_STATISTICAL = "--dspark-drafting=forced+statistical"


def fixed_length(n: int) -> List[str]:
    return ["--enable-dspark", f"--dspark-speculative-length={n}"]


def auto_up_to(n: int) -> List[str]:
    return ["--enable-dspark", "--dspark-speculative-length=auto", f"--dspark-speculative-max={n}", FORCED_STATISTICAL]


def variants(length: int, sweep: Sequence[float], lengths: Sequence[int] = ()) -> List[Tuple[str, List[str]]]:
    spec = fixed_length(length)
    out = [
        ("no speculation", []),
        ("base drafter only (vLLM n-gram)", spec + ["--dspark-drafting=off"]),
        ("statistical only", spec + ["--dspark-drafting=statistical"]),
        ("forced only", spec + ["--dspark-drafting=forced"]),
        ("forced + statistical", spec + [FORCED_STATISTICAL]),
        ("forced + statistical, auto", auto_up_to(length)),
    ]
    out += [(f"forced + statistical, threshold {t}", spec + [FORCED_STATISTICAL, f"--dspark-accept-threshold={t}"])
            for t in sweep]
    out += [("forced + statistical, xgrammar only", spec + [FORCED_STATISTICAL, *XGRAMMAR_ONLY]),
            (LLGUIDANCE_VARIANT, spec + [FORCED_STATISTICAL])]
    # Other lengths come last, so the numbers above stay what docs and commands name.
    for n in lengths:
        out += [(f"forced + statistical, length {n}", fixed_length(n) + [FORCED_STATISTICAL]),
                (f"forced + statistical, auto, max {n}", auto_up_to(n))]
    # Last of all (after the lengths): the layer before sampled drafts, and before drawing from
    # the verifier's rows, for side-by-side runs.
    out += [("forced + statistical, one-hot drafts", spec + [FORCED_STATISTICAL, *ONE_HOT_DRAFTS]),
            ("forced + statistical, counts-only draws", spec + [FORCED_STATISTICAL, *COUNTS_ONLY])]
    # What constrained decoding does to accuracy: the same requests without their response format.
    out += [(NO_GRAMMAR_VARIANT, [])]
    # The layer before values were copied from the prompt by their text (prompt_copy.py).
    out += [("forced + statistical, token-id copies only", spec + [FORCED_STATISTICAL, *TOKEN_ID_COPIES])]
    return out


# Statistical tokens as the most frequent continuation at any temperature, verified one-hot
# (draft_builder.Sampler off; a diagnostic of DraftingConfig.sampled_drafts).
ONE_HOT_DRAFTS = ["--additional-config", '{"dspark_drafting":{"sampled_drafts":false}}']
# Drawn tokens from the continuation counts only, not the verifier's rows (verifier_rows.py; a
# diagnostic of DraftingConfig.verifier_rows).
COUNTS_ONLY = ["--additional-config", '{"dspark_drafting":{"verifier_rows":false}}']

# Values copied from the prompt by token ids only (a diagnostic of DraftingConfig.prompt_copy).
TOKEN_ID_COPIES = ["--additional-config", '{"dspark_drafting":{"prompt_copy":false}}']


XGRAMMAR_ONLY = ["--structured-outputs-config", '{"backend":"xgrammar","disable_any_whitespace":true}']
LLGUIDANCE_VARIANT = "forced + statistical, llguidance for every request"
NO_GRAMMAR_VARIANT = "no speculation, no grammar (the schema unsent)"


def for_variant(name: str, bodies: List[Dict]) -> List[Dict]:
    """The requests as a variant is sent them (the llguidance variant's carry the annotation; the
    no-grammar variant's have no response format: the model writes what it likes, scored as sent)."""
    if name == NO_GRAMMAR_VARIANT:
        return [{k: v for k, v in body.items() if k != "response_format"} for body in bodies]
    return on_llguidance(bodies) if name == LLGUIDANCE_VARIANT else bodies


def on_llguidance(bodies: List[Dict]) -> List[Dict]:
    """The same requests with the annotation that makes the replica's engine use llguidance."""
    out = []
    for body in bodies:
        body = json.loads(json.dumps(body))
        schema = body["response_format"]["json_schema"]["schema"]
        body["response_format"]["json_schema"]["schema"] = {**schema, "x-dspark-engine": "llguidance"}
        out.append(body)
    return out


def measure(base_url: str, bodies: List[Dict], schema: Optional[Dict], concurrency: int,
            tasks: Optional[List[extraction.Task]] = None) -> Dict[str, float]:
    import jsonschema

    def metric_text() -> str:
        return httpx.get(f"{base_url}/metrics", timeout=10).text

    def layer_counts() -> Dict[str, int]:  # the layer's own counters (absent without the layer)
        counters = (httpx.get(f"{base_url}/dspark/info", timeout=10).json().get("drafting") or {}).get("counters") or {}
        out = {f"{kind}_{what}": counters.get(f"{kind}_{what}", 0)
               for kind in ("forced", "spelled", "sampled", "base") + SOURCES for what in ("accepted", "rejected", "proposed")}
        return {**out, "layer_us": counters.get("layer_us", 0), "step_us": counters.get("step_us", 0)}

    text_before, layer_before = metric_text(), layer_counts()
    check = json_check(lambda v: jsonschema.validate(v, schema)) if schema is not None else None
    stats = asyncio.run(run_load(base_url, bodies, concurrency, check=check))
    fields = {}
    if tasks is not None:  # each reply judged by its own schema and scored against its record
        summary = extraction.summarize(extraction.score_results(tasks, stats.ok))
        stats.format_errors = summary.format_errors
        fields = {"fields_right": summary.fields_right, "fields_total": summary.fields_total,
                  "stopped": summary.finished_stop}
    text_after, layer_after = metric_text(), layer_counts()
    spec = acceptance(spec_counters(text_before), spec_counters(text_after))
    served = increase(parse_metrics(text_before), parse_metrics(text_after)).values
    requests = served.get("requests", 0.0)
    layer = {what: layer_after[what] - layer_before[what] for what in layer_after}
    reached = layer["forced_accepted"] + layer["forced_rejected"]
    sampled_reached = layer["sampled_accepted"] + layer["sampled_rejected"]
    accepted = spec["accepted"]
    tokens = stats.output_tokens
    # Per source (report_sources): the draft tokens kept, and those the verifier reached.
    parts = {"grammar": ("forced", "spelled"), "base": ("base",), **{source: (source,) for source in SOURCES}}
    by_source = {f"{what}_{source}": sum(layer[f"{kind}_accepted"] + (layer[f"{kind}_rejected"] if what == "reached" else 0)
                                         for kind in kinds)
                 for source, kinds in parts.items() for what in ("kept", "reached")}
    return {**by_source, "tok_s": stats.tokens_per_s, "p50_ms": stats.latency_percentile(50) * 1000,
            "p99_ms": stats.latency_percentile(99) * 1000,
            "acceptance": spec["acceptance_rate"],
            "forced_acceptance": layer["forced_accepted"] / reached if reached else math.nan,
            # tokens drawn from their counts (temperature > 0): their share of the draft tokens
            # verified, and the share of those reached that were kept
            "sampled_share": layer["sampled_proposed"] / spec["drafted"] if spec["drafted"] else math.nan,
            "sampled_acceptance": layer["sampled_accepted"] / sampled_reached if sampled_reached else math.nan,
            # the layer's own code (drafting, the budget, its bookkeeping) over the profiled steps' time
            "layer_share": layer["layer_us"] / layer["step_us"] if layer["step_us"] else math.nan,
            "tokens_per_forward": tokens / (tokens - accepted) if tokens > accepted else math.nan,
            # vLLM's own split of a request's time: its prefill (the prompt's forward) and its
            # decode (every later step); at concurrency 1 the prefill bounds what drafts can gain
            "prefill_ms": 1000 * served.get("prefill_seconds", math.nan) / requests if requests else math.nan,
            "decode_ms": 1000 * served.get("decode_seconds", math.nan) / requests if requests else math.nan,
            "format_errors": stats.format_errors, "truncated": stats.truncated,
            "failed": len(stats.results) - len(stats.ok), **fields}


SOURCE_COLUMNS = ("grammar",) + SOURCES + ("base",)
SUMMED = ("format_errors", "truncated", "failed", "fields_right", "fields_total", "stopped",
          *(f"{what}_{source}" for what in ("kept", "reached") for source in SOURCE_COLUMNS))


def combined(rounds: List[Dict[str, float]], base_rounds: List[Dict[str, float]]) -> Dict[str, float]:
    """One variant's figures over its rounds: means (counts summed), and its throughput ratio to
    the first variant as the geometric mean of the per-round ratios (each round's arms ran
    back to back, so a ratio within one round is free of the machine's drift between rounds),
    with the lowest and highest round's ratio."""
    out: Dict[str, float] = {}
    for key in rounds[0]:
        values = [r[key] for r in rounds]
        out[key] = sum(values) if key in SUMMED else sum(values) / len(values)
    ratios = [r["tok_s"] / b["tok_s"] for r, b in zip(rounds, base_rounds) if b["tok_s"]]
    if ratios:
        out["ratio"] = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
        out["ratio_min"], out["ratio_max"] = min(ratios), max(ratios)
    return out


def report(workload: str, rows: List[Tuple[str, Dict[str, float]]]) -> None:
    base = rows[0][1]["tok_s"] if rows else math.nan
    spread = any("ratio_min" in f and f["ratio_min"] != f["ratio_max"] for _, f in rows)
    print(f"\n{workload}")
    print(f"{'variant':40}{'tok/s':>9}{'x none':>8}" + (f"{'rounds':>13}" if spread else "")
          + f"{'P50 ms':>9}{'P99 ms':>9}{'accept':>8}{'forced':>8}{'sampled':>13}{'tok/fwd':>9}{'layer%':>8}"
          f"{'prefill/decode ms':>19}{'fmt err':>8}{'cut':>5}{'fields right':>14}")
    for name, f in rows:
        ratio = f.get("ratio", f["tok_s"] / base if base else math.nan)
        acc = "-" if math.isnan(f["acceptance"]) else f"{f['acceptance']:.3f}"
        forced = "-" if math.isnan(f.get("forced_acceptance", math.nan)) else f"{f['forced_acceptance']:.3f}"
        rounds = f"{f['ratio_min']:.2f}-{f['ratio_max']:.2f}" if spread and "ratio_min" in f else ""
        share, kept = f.get("sampled_share", math.nan), f.get("sampled_acceptance", math.nan)
        layer_share = "-" if math.isnan(f.get("layer_share", math.nan)) else f"{100 * f['layer_share']:.1f}"
        sampled = "-" if not share or math.isnan(share) else f"{share:.2f}/" + ("-" if math.isnan(kept) else f"{kept:.2f}")
        split = f"{f.get('prefill_ms', math.nan):.0f}/{f.get('decode_ms', math.nan):.0f}"
        print(f"{name:40}{f['tok_s']:9.1f}{ratio:8.2f}" + (f"{rounds:>13}" if spread else "")
              + f"{f['p50_ms']:9.0f}{f['p99_ms']:9.0f}{acc:>8}{forced:>8}{sampled:>13}"
              f"{f['tokens_per_forward']:9.2f}{layer_share:>8}{split:>19}{f['format_errors'] + f['failed']:8d}"
              f"{f['truncated']:5d}{fields_right(f):>14}")


def report_sources(rows: List[Tuple[str, Dict[str, float]]]) -> None:
    """Where the kept draft tokens came from, per variant: each source's share of them and, in
    brackets, the share of its tokens the verifier reached that it kept. grammar: forced and
    spelled tokens; prompt / reply / history: the n-gram index that saw the token (the request's
    prompt, its reply so far, recent replies on the replica); learned: drawn from the verifier's
    rows; base: vLLM's own drafter."""
    rows = [(name, f) for name, f in rows if sum(f.get(f"kept_{s}", 0) for s in SOURCE_COLUMNS)]
    if not rows:
        return
    print("  kept draft tokens by source: share of the kept (acceptance where reached)")
    print(f"  {'variant':38}" + "".join(f"{s:>16}" for s in SOURCE_COLUMNS))
    for name, f in rows:
        total = sum(f.get(f"kept_{s}", 0) for s in SOURCE_COLUMNS)
        cells = []
        for s in SOURCE_COLUMNS:
            kept, reached = f.get(f"kept_{s}", 0), f.get(f"reached_{s}", 0)
            cells.append(f"{100 * kept / total:.0f}% ({kept / reached:.2f})" if reached else "-")
        print(f"  {name:38}" + "".join(f"{c:>16}" for c in cells))


def fields_right(f: Dict[str, float]) -> str:
    if not f.get("fields_total"):
        return "-"
    return f"{f['fields_right']:.0f}/{f['fields_total']:.0f} {100 * f['fields_right'] / f['fields_total']:.0f}%"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=48, help="requests per workload and variant")
    parser.add_argument("--concurrency", default="8", help="comma-separated levels, each measured per variant")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=None, help="top_p of every request (default: unset)")
    parser.add_argument("--length", type=int, default=8, help="speculative length of every variant")
    parser.add_argument("--sweep", default="0.5,0.7,0.9", help="extra thresholds for forced + statistical")
    parser.add_argument("--lengths", default="",
                        help="other lengths (1-16): per length, forced + statistical at that fixed length and "
                             "`auto` with that maximum, numbered after every other variant")
    parser.add_argument("--only", default="", help="comma-separated variant numbers to run (1-based)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="with more than 1: every variant's replica up at once, each round running every "
                             "variant back to back; ratios are per-round (paired) geometric means")
    parser.add_argument("--warmup", type=int, default=0,
                        help="requests per workload (other prompts) sent to each replica before measuring, not "
                             "counted: the drafting layer's shared history then holds the workload")
    parser.add_argument("--workload", choices=("extraction", "classic"), default=None,
                        help="extraction: fresh requests of six families written from seeded records, scored "
                             "field by field (default with --model real); classic: order JSON and the fixed "
                             "schema (default otherwise)")
    parser.add_argument("--seed", type=int, default=None,
                        help="the run's seed (default: a new one, printed): every round and concurrency level "
                             "draws requests no replica has seen")
    parser.add_argument("--example", choices=extraction.EXAMPLES, default=extraction.PER_REQUEST,
                        help=extraction.EXAMPLE_HELP)
    parser.add_argument("--vllm-args", default="", metavar="ARGS",
                        help="more engine arguments for every arm's replica, one shell-quoted string "
                             "(e.g. '--block-size 32': vLLM's CPU default is 128, the prefix cache's unit)")
    add_model_argument(parser)
    args = parser.parse_args(argv)
    model, model_args = resolve(args.model)
    model_args = model_args + shlex.split(args.vllm_args)
    kind = args.workload or ("extraction" if args.model == "real" else "classic")
    seed = args.seed if args.seed is not None else secrets.randbelow(1 << 20)

    sweep = [float(t) for t in args.sweep.split(",") if t]
    chosen = variants(args.length, sweep, [int(n) for n in args.lengths.split(",") if n])
    if args.only:
        chosen = [chosen[int(i) - 1] for i in args.only.split(",")]
    levels = [int(c) for c in str(args.concurrency).split(",") if c]
    names = workload_names(kind)
    # Batch serials: 0 the warmup, then one per round, level and workload. Every replica gets a
    # batch's requests once; no batch repeats another's.
    serials = itertools.count(1)
    batches: Dict[Tuple[int, int, str], Batch] = {}

    def requests(r: int, level: int, workload: str) -> Batch:
        if (r, level, workload) not in batches:
            batches[(r, level, workload)] = batch(workload, args.requests, next(serials), seed, args.max_tokens,
                                                  args.temperature, args.top_p, args.example)
        return batches[(r, level, workload)]

    def warm(replica, name: str) -> None:
        """`--warmup` requests per workload (their own batch), not measured: the replica's recent
        outputs (the drafting layer's shared history) hold this workload, as on a replica that has
        served it."""
        for workload in names:
            if args.warmup:
                warmup = batch(workload, args.warmup, 0, seed, args.max_tokens, args.temperature, args.top_p,
                               args.example)
                asyncio.run(run_load(replica.base_url, for_variant(name, warmup.bodies), 8))
    logs = Path(tempfile.mkdtemp(prefix="dspark-drafting-bench-"))
    results: Dict[str, List[Tuple[str, Dict[str, float]]]] = {f"{w}, concurrency {c}": [] for c in levels
                                                              for w in names}

    def run_arm(number: int, name: str, replica, level: int, workload: str, r: int, tag: str = "") -> Dict[str, float]:
        b = requests(r, level, workload)
        figures = measure(replica.base_url, for_variant(name, b.bodies), b.schema, level, b.tasks)
        print(f"[{number}/{len(chosen)}{tag}] {name} / {workload} / c={level}: "
              f"{json.dumps({k: round(v, 3) for k, v in figures.items() if not k.startswith(('kept_', 'reached_'))})}",
              file=sys.stderr, flush=True)
        return figures

    # The order of the arms rotates with the seed (across runs) and with the round (within one).
    first = seed % len(chosen)
    if args.rounds <= 1:
        for i in list(range(first, len(chosen))) + list(range(first)):
            number, (name, knobs) = i + 1, chosen[i]
            replica = start_replica(logs / f"variant-{number}.log",
                                    knobs + SAME_VLLM_ARGS + model_args + ["--dspark-warmup-requests", "2"], model=model)
            try:
                replica.wait_ready(600)
                warm(replica, name)
                for level in levels:
                    for workload in names:
                        results[f"{workload}, concurrency {level}"].append(
                            (name, run_arm(number, name, replica, level, workload, 0)))
            finally:
                replica.stop()
        for key, rows in results.items():  # printed in the variants' order, the first the baseline
            results[key] = sorted(rows, key=lambda row: [n for n, _ in chosen].index(row[0]))
    else:
        # Every variant's replica up at once; each round runs every variant back to back (in
        # an order that rotates), so drift of the machine between rounds cancels in the ratios.
        replicas = []
        try:
            for number, (name, knobs) in enumerate(chosen, 1):
                replicas.append(start_replica(logs / f"variant-{number}.log",
                                              knobs + SAME_VLLM_ARGS + model_args + ["--dspark-warmup-requests", "2"],
                                              model=model))
            for replica in replicas:
                replica.wait_ready(600)
            for replica, (name, _) in zip(replicas, chosen):
                warm(replica, name)
            per_round: Dict[Tuple[str, int, str], List[Dict[str, float]]] = {}
            for r in range(args.rounds):
                for level in levels:
                    for workload in names:
                        order = list(range(len(chosen)))
                        shift = (first + r) % len(order)
                        order = order[shift:] + order[:shift]
                        for i in order:
                            figures = run_arm(i + 1, chosen[i][0], replicas[i], level, workload, r,
                                              f", round {r + 1}/{args.rounds}")
                            per_round.setdefault((workload, level, chosen[i][0]), []).append(figures)
            for level in levels:
                for workload in names:
                    base = per_round[(workload, level, chosen[0][0])]
                    results[f"{workload}, concurrency {level}"] = [
                        (name, combined(per_round[(workload, level, name)], base)) for name, _ in chosen]
        finally:
            for replica in replicas:
                replica.stop()
    print(f"{args.requests} requests per workload (after {args.warmup} warmup), concurrency {args.concurrency}, max_tokens {args.max_tokens}, "
          f"temperature {args.temperature}, top_p {args.top_p or 'unset'}, speculative length {args.length}; model {model.name}; "
          f"{args.rounds} round(s); " + (f"engine arguments {args.vllm_args!r} on every arm; " if args.vllm_args else "")
          + "real vLLM 0.32 on this CPU")
    print(f"requests: fresh (seed {seed}): every round and concurrency level draws requests of its own, each "
          "sent once to each replica, so no replica is measured on a request it has seen (its suffix history, "
          "verifier rows and prefix cache hold only earlier, other requests); arms in the order "
          f"{', '.join(str((first + k) % len(chosen) + 1) for k in range(len(chosen)))} in the first round, rotating"
          + ("; each family's worked example the same in every request (its prompt up to the text shared, "
             "as an application's fixed few-shot prompt)" if kind == "extraction" and args.example == extraction.PER_FAMILY
             else ""))
    for workload, rows in results.items():
        report(workload, rows)
        report_sources(rows)


if __name__ == "__main__":
    main()
