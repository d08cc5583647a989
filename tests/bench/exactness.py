"""Benchmark: does speculation sample the model's own distribution under the grammar?

    .venv/bin/python -m tests.bench.exactness [--samples 1000] [--settings t1,t07p09] [--model real]

Speculative decoding is exact only if every verified draft position is judged against the
target's grammar-masked, temperature-scaled distribution, a one-hot draft is accepted with the
target's probability of its token and a rejected position is resampled from the masked
residual. Valid JSON says nothing about that, so this compares *distributions*: one request
constrained to a small finite reply space (`CHOICE_SCHEMA`: 4 × 3 × 2 = 24 replies), sampled
many times from real replicas (real vLLM on CPU, the fixture model) with and without
speculation, and a two-sample test per variant against plain vLLM:

- chi-square statistic of the 2 × K table, with a permutation p-value (labels reshuffled;
  no asymptotic approximation, so sparse cells are fine);
- total-variation distance with a 95 % interval (basic bootstrap);
- "plain vs plain" (a second, independent sample of the same replica) gives the noise floor
  of both figures at this sample size.

A second workload, one free string field (`STRING_SCHEMA`), compares the distribution of the
token at each of the string's first positions (vLLM's token ids, `return_tokens_as_token_ids`).

The pure statistics (`two_sample`, `tv_distance`) are what the CI test in
tests/integration/test_drafting_layer.py uses on fewer samples. Figures, not assertions.
"""

import argparse
import asyncio
import json
import math
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import httpx

CHOICE_SCHEMA = {
    "type": "object",
    "properties": {"action": {"enum": ["buy", "sell", "refund", "cancel"]},
                   "priority": {"enum": ["low", "normal", "high"]},
                   "express": {"type": "boolean"}},
    "required": ["action", "priority", "express"],
    "additionalProperties": False,
}
CHOICE_REPLIES = 24
STRING_SCHEMA = {
    "type": "object",
    "properties": {"timestamp": {"type": "string", "maxLength": 12}},
    "required": ["timestamp"],
    "additionalProperties": False,
}
STRING_POSITIONS = 4
# The real model's finite reply space (`--model real`): a support ticket's enums and boolean
# (4 x 4 x 2 = 32 replies), asked about a ticket that leaves them open.
TICKET_SCHEMA = {
    "type": "object",
    "properties": {"priority": {"enum": ["low", "medium", "high", "urgent"]},
                   "category": {"enum": ["billing", "technical", "account", "shipping"]},
                   "refund_requested": {"type": "boolean"}},
    "required": ["priority", "category", "refund_requested"],
    "additionalProperties": False,
}
TICKET_REPLIES = 32
# Temperature settings: name -> sampling parameters.
SETTINGS = {"t1": {"temperature": 1.0}, "t07p09": {"temperature": 0.7, "top_p": 0.9}}


@dataclass
class Comparison:
    n_a: int
    n_b: int
    categories: int
    chi2: float
    p_value: float
    """Permutation p-value: the share of label shuffles whose chi-square is >= the observed one."""
    tv: float
    tv_low: float
    tv_high: float

    def line(self) -> str:
        return (f"n={self.n_a}/{self.n_b} k={self.categories} chi2={self.chi2:.1f} p={self.p_value:.4f} "
                f"TV={self.tv:.3f} [{self.tv_low:.3f}, {self.tv_high:.3f}]")


def _table(a: Sequence[Any], b: Sequence[Any]):
    import numpy as np

    labels = sorted(set(a) | set(b), key=repr)
    index = {label: i for i, label in enumerate(labels)}
    return (np.array([index[x] for x in a], dtype=np.int64), np.array([index[x] for x in b], dtype=np.int64),
            len(labels))


def _chi2(counts_a, counts_b) -> float:
    import numpy as np

    total = counts_a + counts_b
    keep = total > 0
    counts_a, counts_b, total = counts_a[keep], counts_b[keep], total[keep]
    n_a, n_b = counts_a.sum(), counts_b.sum()
    n = n_a + n_b
    expected_a, expected_b = total * n_a / n, total * n_b / n
    return float(np.sum((counts_a - expected_a) ** 2 / expected_a) + np.sum((counts_b - expected_b) ** 2 / expected_b))


def tv_distance(a: Sequence[Any], b: Sequence[Any]) -> float:
    """Total-variation distance between the empirical distributions of two samples."""
    ca, cb = Counter(a), Counter(b)
    return 0.5 * sum(abs(ca[k] / len(a) - cb[k] / len(b)) for k in set(ca) | set(cb))


def two_sample(a: Sequence[Any], b: Sequence[Any], permutations: int = 4000, bootstrap: int = 1000,
               seed: int = 0) -> Comparison:
    """Are `a` and `b` (hashable outcomes) samples of one distribution?"""
    import numpy as np

    if not a or not b:
        raise ValueError("two_sample needs two non-empty samples")
    rng = np.random.default_rng(seed)
    xa, xb, k = _table(a, b)
    observed = _chi2(np.bincount(xa, minlength=k), np.bincount(xb, minlength=k))
    pooled = np.concatenate([xa, xb])
    at_least = 0
    for _ in range(permutations):
        rng.shuffle(pooled)
        stat = _chi2(np.bincount(pooled[:len(xa)], minlength=k), np.bincount(pooled[len(xa):], minlength=k))
        at_least += stat >= observed - 1e-9
    pa, pb = np.bincount(xa, minlength=k) / len(xa), np.bincount(xb, minlength=k) / len(xb)
    tvs = []
    for _ in range(bootstrap):
        ra = rng.multinomial(len(xa), pa) / len(xa)
        rb = rng.multinomial(len(xb), pb) / len(xb)
        tvs.append(0.5 * np.abs(ra - rb).sum())
    # The basic (reverse-percentile) bootstrap interval: resampled TVs sit above the sample's own
    # (TV of two samples is biased upwards), so the percentiles are reflected around it.
    tv = 0.5 * float(np.abs(pa - pb).sum())
    low, high = np.percentile(tvs, [2.5, 97.5])
    return Comparison(len(a), len(b), k, observed, (at_least + 1) / (permutations + 1),
                      tv, max(0.0, 2 * tv - float(high)), max(0.0, 2 * tv - float(low)))


# ---- the workloads -------------------------------------------------------------------------

def choice_body(model: str, sampling: Dict[str, Any], n: int) -> Dict[str, Any]:
    prompt = ("Create an order record with an action, a priority and whether it ships express. "
              f"Schema: {json.dumps(CHOICE_SCHEMA, separators=(',', ':'))}")
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 48, "n": n,
            **sampling,
            "response_format": {"type": "json_schema", "json_schema": {"name": "choice", "schema": CHOICE_SCHEMA}}}


def ticket_body(model: str, sampling: Dict[str, Any], n: int) -> Dict[str, Any]:
    return {"model": model, "n": n, "max_tokens": 48, **sampling,
            "messages": [{"role": "system", "content": "You triage support tickets. Reply with JSON."},
                         {"role": "user", "content": "Ticket: my order arrived late and the box was open. "
                                                     "Give its priority, category and whether a refund is requested."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "ticket", "schema": TICKET_SCHEMA}}}


def string_body(model: str, sampling: Dict[str, Any], n: int) -> Dict[str, Any]:
    prompt = ("Create an order record for user 1234: buy 12.50. Only the timestamp. "
              f"Schema: {json.dumps(STRING_SCHEMA, separators=(',', ':'))}")
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "n": n,
            "logprobs": True, "top_logprobs": 0, "return_tokens_as_token_ids": True, **sampling,
            "response_format": {"type": "json_schema", "json_schema": {"name": "when", "schema": STRING_SCHEMA}}}


def canonical_reply(content: str) -> str:
    """The reply as a key for counting: the parsed value, re-serialised with sorted keys."""
    return json.dumps(json.loads(content), sort_keys=True)


def token_ids(choice: Dict[str, Any]) -> List[int]:
    """The reply's token ids, from logprobs entries spelled 'token_id:123'."""
    out = []
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        token = entry.get("token", "")
        out.append(int(token.split(":", 1)[1]) if token.startswith("token_id:") else -1)
    return out


# What a withheld request's choices count as where withheld replies are not asked again: an
# outcome of its own, which no correct variant's sample holds.
WITHHELD = json.dumps("<withheld by the replica>")


async def _collect(base_url: str, body: Dict[str, Any], samples: int, per_request: int,
                   concurrency: int, reask: bool = True) -> List[Dict[str, Any]]:
    """`samples` choices; a reply the replica withholds (its delivery check: 500, the reply did not
    validate) is counted and printed, and asked for again, up to a tenth of the requests: a
    broken variant (the "before the fix" one) must still give its table row. With `reask`
    false (the tests), its choices count as the outcome WITHHELD instead: never dropped from
    the sample (dropping them would compare the distribution given validity)."""
    choices: List[Dict[str, Any]] = []
    withheld: List[str] = []
    requests = math.ceil(samples / per_request)
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=600) as client:
        async def one() -> None:
            async with sem:
                while True:
                    r = await client.post("/v1/chat/completions", json=body)
                    if r.status_code == 200:
                        choices.extend(r.json()["choices"])
                        return
                    if r.status_code != 500 or (reask and len(withheld) >= max(1, requests // 10)):
                        raise RuntimeError(f"{base_url}: {r.status_code} {r.text[:300]}")
                    withheld.append(r.text[:200])
                    if not reask:
                        choices.extend({"message": {"content": WITHHELD}} for _ in range(per_request))
                        return

        await asyncio.gather(*(one() for _ in range(requests)))
    if withheld:
        print(f"    {len(withheld)} request(s) of {requests} withheld by the replica (not valid), "
              f"{'asked again' if reask else 'counted as an outcome'}; first: {withheld[0]}", flush=True)
    return choices[:samples]


def collect(base_url: str, body: Dict[str, Any], samples: int, concurrency: int = 4,
            reask: bool = True) -> List[Dict[str, Any]]:
    """`samples` choices of `body` (its `n` per request), withheld replies as above."""
    return asyncio.run(_collect(base_url, body, samples, int(body.get("n", 1)), concurrency, reask))


def sample_choices(base_url: str, model: str, sampling: Dict[str, Any], samples: int,
                   per_request: int = 8, concurrency: int = 4, body_of=choice_body,
                   reask: bool = True) -> List[str]:
    """`samples` replies to the choice request (or `body_of`'s), as canonical JSON strings."""
    body = body_of(model, sampling, per_request)
    choices = asyncio.run(_collect(base_url, body, samples, per_request, concurrency, reask))
    return [canonical_reply(c["message"]["content"]) for c in choices]


def sample_string_tokens(base_url: str, model: str, sampling: Dict[str, Any], samples: int,
                         per_request: int = 8, concurrency: int = 4) -> List[List[int]]:
    body = string_body(model, sampling, per_request)
    choices = asyncio.run(_collect(base_url, body, samples, per_request, concurrency))
    return [token_ids(c) for c in choices]


def string_positions(sequences: Iterable[List[int]], prefix_tokens: int) -> List[List[int]]:
    """Per position j of the string value (after the `prefix_tokens` forced ones): the tokens there."""
    columns: List[List[int]] = [[] for _ in range(STRING_POSITIONS)]
    for seq in sequences:
        for j in range(STRING_POSITIONS):
            at = prefix_tokens + j
            columns[j].append(seq[at] if at < len(seq) else -1)  # -1: the reply ended before
    return columns


def common_prefix(sequences: Sequence[List[int]]) -> int:
    """Tokens every reply shares from the start (the grammar-forced `{"timestamp":"`)."""
    if not sequences:
        return 0
    first = sequences[0]
    n = 0
    while n < len(first) and all(len(s) > n and s[n] == first[n] for s in sequences):
        n += 1
    return n


# ---- the benchmark ------------------------------------------------------------------------

LAYER = ["--enable-dspark", "--dspark-grammar-mode=json"]


def variants() -> List[Tuple[str, List[str], Dict[str, str]]]:
    """(name, dspark-serve args, extra env); the first is the reference."""
    fixed = LAYER + ["--dspark-speculative-length=8"]
    return [
        ("no speculation", [], {}),
        ("forced + statistical, length 8", fixed + ["--dspark-drafting=forced+statistical"], {}),
        ("forced + statistical, auto", LAYER + ["--dspark-speculative-length=auto"], {}),
        ("forced only, length 8", fixed + ["--dspark-drafting=forced"], {}),
        ("statistical only, length 8", fixed + ["--dspark-drafting=statistical"], {}),
        ("before the fix: forced + statistical, length 8", fixed + ["--dspark-drafting=forced+statistical"],
         {"DSPARK_VLLM_FIXES": "off"}),
    ]


def main(argv: Optional[List[str]] = None) -> int:
    from tests.bench.models import add_model_argument, resolve
    from tests.bench.order_json import SAME_VLLM_ARGS
    from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=1000, help="replies per variant and setting")
    parser.add_argument("--settings", default="t1,t07p09", help=f"comma-separated of {', '.join(SETTINGS)}")
    parser.add_argument("--only", default="", help="comma-separated variant numbers (1-based; 1 always runs)")
    parser.add_argument("--no-string", action="store_true", help="skip the per-position string workload")
    add_model_argument(parser)
    args = parser.parse_args(argv)
    model, model_args = resolve(args.model)
    # The fixture answers the order choice; the real model a ticket's (32 replies), no string workload.
    body_of, space = (ticket_body, TICKET_REPLIES) if args.model == "real" else (choice_body, CHOICE_REPLIES)
    if args.model == "real":
        args.no_string = True
    settings = [s for s in args.settings.split(",") if s]
    unknown = [s for s in settings if s not in SETTINGS]
    if unknown:
        parser.error(f"--settings: {', '.join(unknown)} unknown (allowed: {', '.join(SETTINGS)})")
    chosen = variants()
    if args.only:
        chosen = [chosen[0]] + [chosen[int(i) - 1] for i in args.only.split(",") if i != "1"]

    reference_name = chosen[0][0]
    logs = Path(tempfile.mkdtemp(prefix="dspark-exactness-"))
    print(f"replica logs in {logs}", flush=True)
    replies: Dict[Tuple[str, str], List[str]] = {}
    strings: Dict[Tuple[str, str], List[List[int]]] = {}
    for number, (name, knobs, env) in enumerate(chosen, 1):
        replica = start_replica(logs / f"variant-{number}.log", knobs + SAME_VLLM_ARGS + model_args, env=env,
                                model=model)
        try:
            replica.wait_ready(900)
            for setting in settings:
                sampling = SETTINGS[setting]
                print(f"[{number}/{len(chosen)}] {name}, {setting}: sampling {args.samples}", flush=True)
                replies[(name, setting)] = sample_choices(replica.base_url, SERVED_NAME, sampling, args.samples,
                                                          body_of=body_of)
                if number == 1:  # the noise floor: the same replica, sampled again
                    replies[("no speculation, again", setting)] = sample_choices(
                        replica.base_url, SERVED_NAME, sampling, args.samples, body_of=body_of)
                if number > 1 or (name + ", again", setting) in replies:  # as soon as it is known
                    shown = name + ", again" if number == 1 else name
                    c = two_sample(replies[(reference_name, setting)], replies[(shown, setting)])
                    print(f"    {shown}, {setting}: {c.line()}", flush=True)
                if not args.no_string:
                    strings[(name, setting)] = sample_string_tokens(replica.base_url, SERVED_NAME, sampling,
                                                                    args.samples)
        finally:
            replica.stop()

    names = [reference_name + ", again"] + [name for name, _, _ in chosen[1:]]
    for setting in settings:
        print(f"\nchoice schema ({space} replies; model {model.name}), {setting} {SETTINGS[setting]}, "
              f"vs {reference_name}")
        print(f"{'variant':50}{'chi2':>9}{'p':>9}{'TV':>7}{'TV 95% CI':>16}  most frequent (ref/variant)")
        ref = replies[(reference_name, setting)]
        for name in names:
            if (name, setting) not in replies:
                continue
            got = replies[(name, setting)]
            c = two_sample(ref, got)
            top, count = Counter(got).most_common(1)[0]
            print(f"{name:50}{c.chi2:9.1f}{c.p_value:9.4f}{c.tv:7.3f}   [{c.tv_low:.3f}, {c.tv_high:.3f}]"
                  f"  {Counter(ref)[top]}/{count} {top}")
        if not strings:
            continue
        ref_seq = strings[(reference_name, setting)]
        prefix = common_prefix(ref_seq)
        print(f"\nstring field, token at each of the first {STRING_POSITIONS} positions after {prefix} "
              f"forced tokens, {setting}: p (TV) per position")
        ref_cols = string_positions(ref_seq, prefix)
        for name, _, _ in chosen[1:]:
            if (name, setting) not in strings:
                continue
            cols = string_positions(strings[(name, setting)], prefix)
            cells = [two_sample(r, c, permutations=2000, bootstrap=200) for r, c in zip(ref_cols, cols)]
            print(f"{name:50}" + "  ".join(f"{c.p_value:.3f} ({c.tv:.3f})" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
