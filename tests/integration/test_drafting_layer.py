"""The DSpark drafting layer inside real vLLM 0.32 (CPU, the tiny fixture model).

Four real `dspark-serve` replicas from the worker venv, started side by side: plain vLLM (no
speculation), the layer with its defaults (forced + statistical), the layer at threshold
0.99, and the layer with the per-step speculation budget (`--dspark-speculative-length auto`)
and a small step token budget, so waiting prefills cap the drafts. Greedy replies must be
token-identical with and without the layer and the budget; the layer's counters (served on
/metrics and /dspark/info) must show forced tokens that the grammar never trims.

Sampled replies (temperature > 0) must come from the model's own distribution under the
grammar: many samples of one request with 24 possible replies, with and without the layer,
compared by a two-sample test (bench/exactness.py). A fifth replica is the deliberately wrong
variant: the layer whose draft positions are verified greedily (tests/support/dspark_test_faults.py,
through the door of worker/vllm_fixes.py); the same test must tell it apart. (vLLM's CPU fault
that the fixes repair did the same by chance: the garbage it left was sometimes the right
value, so the unfixed build was once not told apart, p = 0.036.)
"""

import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from gpustack_dspark.bench.workloads import ORDER_SCHEMA
from gpustack_dspark.devstack.replica import SERVED_NAME, start_replica, worker_env, worker_python
from gpustack_dspark.worker.drafting.draft_builder import FORCED, SAMPLED, SPELLED, STATISTICAL
from gpustack_dspark.worker.drafting.ngram_index import SOURCES
from tests.bench import exactness
from tests.conftest import WRONG_VERIFIER_ENV, all_ready
from tests.bench.order_json import SAME_VLLM_ARGS

pytestmark = pytest.mark.integration

BENCH = Path("/work/shared/data/jsonschemabench")
if not BENCH.exists():
    BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
SCHEMA_FILES = sorted((BENCH / "Glaiveai2K").glob("*.json"))[:11]
PROMPTS_PER_SCHEMA = 3  # 12 schemas x 3: 36 greedy replies compared (60 took 96 s of a CI run)
MAX_TOKENS = 64
LAYER_ARGS = ["--enable-dspark", "--dspark-speculative-length=8"]
# 256 tokens per step: with 8 requests in flight and prompts of a few hundred tokens, prefills
# wait and the budget must leave them their tokens.
BUDGET_ARGS = ["--enable-dspark", "--dspark-speculative-length=auto", "--max-num-batched-tokens", "256"]


def schemas():
    out = [("order", ORDER_SCHEMA)]
    out += [(path.stem, json.loads(path.read_text())) for path in SCHEMA_FILES]
    return out


def bodies():
    out = []
    for name, schema in schemas():
        for i in range(PROMPTS_PER_SCHEMA):
            prompt = f"Request {i}: fill in {name.split('_')[0]} for case {i * 7 + 3}. Schema: {json.dumps(schema)}"
            out.append({"model": SERVED_NAME, "messages": [{"role": "user", "content": prompt}],
                        "max_tokens": MAX_TOKENS, "temperature": 0.0,
                        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    return out


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    logs = tmp_path_factory.mktemp("drafting")
    settings = {
        "plain": SAME_VLLM_ARGS,
        "layer": LAYER_ARGS + SAME_VLLM_ARGS,
        "strict": LAYER_ARGS + ["--dspark-accept-threshold=0.99"] + SAME_VLLM_ARGS,
        "budget": BUDGET_ARGS + SAME_VLLM_ARGS,
        "unfixed": LAYER_ARGS + SAME_VLLM_ARGS,
    }
    started = {name: start_replica(logs / f"{name}.log", args + ["--dspark-warmup-requests", "2"],
                                   env=WRONG_VERIFIER_ENV if name == "unfixed" else None)
               for name, args in settings.items()}
    with all_ready(started, 600):
        yield started


def post_all(replica, requests, concurrency=4):
    def one(body):
        r = httpx.post(f"{replica.base_url}/v1/chat/completions", json=body, timeout=300)
        return r.status_code, r.json()

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, requests))


_PLAIN: dict = {}


def plain_replies(replicas, requests):
    """The plain replica's replies, asked once per module (two tests compare with them)."""
    key = json.dumps(requests, sort_keys=True)
    if key not in _PLAIN:
        _PLAIN.clear()
        _PLAIN[key] = post_all(replicas["plain"], requests)
    return _PLAIN[key]


def drafting_counters(replica, settle_s=1.5):
    time.sleep(settle_s)  # the engine writes its counters at most every 0.5 s
    return replica.info()["drafting"]["counters"]


def metric(replica, name):
    for line in httpx.get(f"{replica.base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_greedy_output_is_token_identical_with_and_without_the_layer(replicas):
    requests = bodies()
    plain = plain_replies(replicas, requests)
    layered = post_all(replicas["layer"], requests)
    compared, schemas_seen = 0, set()
    for body, (s1, r1), (s2, r2) in zip(requests, plain, layered):
        assert s1 == s2, (s1, s2, r1, r2)
        if s1 != 200:
            continue
        a, b = r1["choices"][0], r2["choices"][0]
        assert (a["message"]["content"], a["finish_reason"]) == (b["message"]["content"], b["finish_reason"])
        assert r1["usage"]["completion_tokens"] == r2["usage"]["completion_tokens"]
        compared += 1
        schemas_seen.add(json.dumps(body["response_format"]["json_schema"]["schema"], sort_keys=True))
    assert compared >= 30 and len(schemas_seen) >= 10, (compared, len(schemas_seen))

    counters = drafting_counters(replicas["layer"])
    assert counters["forced_proposed"] > 0 and counters["statistical_proposed"] > 0
    # Every statistical token has one source (the prompt, the reply, other replies, or none), and
    # on these prompts some come from the prompt.
    sources = {source: counters[f"{source}_proposed"] for source in SOURCES}
    assert sum(sources.values()) == counters["statistical_proposed"] + counters["sampled_proposed"], (sources, counters)
    assert sources["prompt"] > 0 and sources["history"] > 0, sources
    # Forced tokens are proposed only where the grammar allows them: vLLM's check trims none.
    assert counters["grammar_trimmed_tokens"] == 0 and counters["layer_errors"] == 0
    assert counters["forced_acceptance"] > 0.3
    assert counters["tokens_per_forward"] > 1.5
    # The same counters on /metrics, beside vLLM's spec-decode counters.
    assert metric(replicas["layer"], "dspark_draft_forced_tokens_proposed_total") >= counters["forced_proposed"]
    assert metric(replicas["layer"], "vllm:spec_decode_num_draft_tokens_total") > 0


def test_the_speculation_budget_keeps_greedy_output_and_leaves_prefills_their_tokens(replicas):
    requests = bodies()
    plain = plain_replies(replicas, requests)
    # Two prompts per schema, eight in flight: prefills wait while others decode.
    picked = [i for i in range(len(requests)) if i % PROMPTS_PER_SCHEMA < 2]
    budgeted = post_all(replicas["budget"], [requests[i] for i in picked], concurrency=8)
    schemas_seen = set()
    for i, (status, reply) in zip(picked, budgeted):
        s1, r1 = plain[i]
        assert status == s1 == 200, (status, s1, reply)
        a, b = r1["choices"][0], reply["choices"][0]
        assert (a["message"]["content"], a["finish_reason"]) == (b["message"]["content"], b["finish_reason"])
        schemas_seen.add(json.dumps(requests[i]["response_format"]["json_schema"]["schema"], sort_keys=True))
    assert len(schemas_seen) >= 10

    info = replicas["budget"].info()
    assert info["drafting"]["budget"] is not None and info["speculative_length"] == 8
    assert "speculative_length auto" in " ".join(info["notes"])
    counters = drafting_counters(replicas["budget"])
    budget = replicas["budget"].info()["drafting"]["budget"]
    assert counters["layer_errors"] == 0 and counters["grammar_trimmed_tokens"] == 0
    # It decided real steps with a time model fitted on this replica ...
    assert counters["budget_steps"] > 0 and budget["time_model"]["in_use"] is True
    assert budget["time_model"]["a_ms"] > 0
    # ... trimmed drafts where waiting prefills needed the step's tokens, and still speculated.
    assert counters["budget_steps_capped_by_prefill"] > 0, budget
    assert 0 < counters["budget_tokens_kept"] < counters["budget_tokens_offered"], budget
    assert counters["tokens_per_forward"] > 1.2, (budget.get("realized"), budget["counters"], budget["last_reason"])
    assert budget["acceptance_per_position"]["forced"][0] is not None
    # The same on /metrics.
    assert metric(replicas["budget"], "dspark_budget_steps_total") >= counters["budget_steps"]
    assert metric(replicas["budget"], "dspark_step_time_fixed_seconds") > 0


def test_threshold_099_proposes_only_forced_tokens(replicas):
    results = post_all(replicas["strict"], bodies()[:20])
    assert all(status == 200 for status, _ in results)
    counters = drafting_counters(replicas["strict"])
    info = replicas["strict"].info()
    assert info["accept_threshold"]["value"] == 0.99 and info["accept_threshold"]["applied"] is True
    assert counters["forced_proposed"] > 0
    assert counters["statistical_proposed"] == 0 and counters["drafts_cut_by_threshold"] > 0


def test_layer_steps_aside_for_requests_without_a_grammar(replicas):
    replica = replicas["layer"]
    before = drafting_counters(replica, settle_s=0)["requests_without_grammar"]
    body = {"model": SERVED_NAME, "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 16, "temperature": 0.0, "response_format": {"type": "text"}}
    r = httpx.post(f"{replica.base_url}/v1/chat/completions", json=body, timeout=120)
    assert r.status_code == 200
    assert drafting_counters(replica)["requests_without_grammar"] == before + 1
    log = replica.process.log_path.read_text()
    assert "DSpark drafting off for request" in log and "it has no grammar" in log


# 200 per arm (300 until 2026-12-07; six arms were 224 s of CI): the wrong variant's TV of about
# 0.4 stays far above the noise of a correct one's (about 0.15 over 24 replies at this size).
EXACTNESS_SAMPLES = 200
# p-values below this reject "one distribution"; a correct variant fails by chance 1 run in 1,000
# per comparison, and a rejection is confirmed on fresh samples (below): 1 in 1,000,000.
EXACTNESS_ALPHA = 0.001


def same_distribution(sample, name, sampling, reference):
    """The two-sample test of `name` against plain vLLM at `sampling`, with the reference
    replies `reference`. A rejection is confirmed on fresh samples of both before the test
    fails: with four comparisons per run, chance rejections at alpha 0.001 came up once in about
    six CI runs (p = 0.0005, TV 0.19 at n = 300, while 3,000 samples per arm of the same
    variant gave p = 0.54 and 0.46, idle and with three CPU burners). A real bias is rejected
    again: the wrong variant's TV is about 0.4. Returns (first, confirmation or None)."""
    first = exactness.two_sample(reference, sample(name, sampling))
    if first.p_value > EXACTNESS_ALPHA:
        return first, None
    print(f"{name}: {first.line()} rejected; confirming on fresh samples", flush=True)
    return first, exactness.two_sample(sample("plain", sampling), sample(name, sampling))


def exact(result) -> bool:
    first, confirmation = result
    return (confirmation or first).p_value > EXACTNESS_ALPHA


def lines(result) -> str:
    return " then ".join(c.line() for c in result if c is not None)


def test_sampled_replies_follow_the_models_own_distribution_and_a_wrong_verifier_is_caught(replicas):
    def sample(name, sampling, samples=EXACTNESS_SAMPLES):
        # A withheld reply is an outcome of its own, not asked again (exactness.WITHHELD).
        return exactness.sample_choices(replicas[name].base_url, SERVED_NAME, sampling, samples, reask=False)

    t1 = exactness.SETTINGS["t1"]
    before = drafting_counters(replicas["layer"], settle_s=0)
    reference = sample("plain", t1)
    # Every reply is one of the 24 the schema allows, and the model uses many of them.
    assert len(set(reference)) >= 8, sorted(set(reference))
    layer = same_distribution(sample, "layer", t1, reference)
    after = drafting_counters(replicas["layer"])
    budget_before = drafting_counters(replicas["budget"], settle_s=0)
    budget = same_distribution(sample, "budget", t1, reference)
    budget_after = drafting_counters(replicas["budget"])
    wrong = same_distribution(sample, "unfixed", t1, reference)
    assert exact(layer), ("forced + statistical, length 8", lines(layer))
    assert exact(budget), ("auto", lines(budget))
    assert not exact(wrong), ("draft positions verified greedily", lines(wrong))
    assert wrong[0].tv > layer[0].tv and wrong[0].tv > budget[0].tv, (lines(wrong), lines(layer), lines(budget))

    # Grammar-forced tokens (the only token the grammar allows) are certain: accepted at
    # temperature 1 too; spelled ones (other spellings allowed) are the model's choice.
    reached = {kind: (after[f"{kind}_accepted"] - before[f"{kind}_accepted"],
                      after[f"{kind}_rejected"] - before[f"{kind}_rejected"]) for kind in ("forced", "spelled")}
    accepted, rejected = reached["forced"]
    assert accepted > 100 and accepted / (accepted + rejected) >= 0.99, reached
    # Statistical tokens were drawn from their counts and verified against that distribution
    # (draft_probs.py): the two-sample test above covered them.
    sampled = after["sampled_proposed"] - before["sampled_proposed"]
    assert sampled > 50, (sampled, after)
    # ... drawn from the verifier's own distributions where it had checked the same context
    # before (verifier_rows.py): its rows came back from the runner and were learned.
    learned = after["verifier_rows"] - before["verifier_rows"]
    assert learned > 50, (learned, after)

    # The budget's arm decided steps and verified drafts in its run (a budget that kept
    # speculation off would pass the two-sample test trivially). Whether it lets drawn tokens
    # through depends on the machine's load: 35 drawn tokens verified in one CI run, 0 in another
    # (its forced tokens verified all the same); the drawn-token check is the fixed-length arms'.
    assert budget_after["budget_steps"] > budget_before["budget_steps"], (budget_before, budget_after)
    assert verified_any(budget_before, budget_after) >= 10, (budget_before, budget_after)

    # top_p on draft positions too (it was expanded as garbage like the temperature).
    t07 = exactness.SETTINGS["t07p09"]
    plain_t07 = sample("plain", t07)
    nucleus_before = drafting_counters(replicas["layer"], settle_s=0)
    nucleus = same_distribution(sample, "layer", t07, plain_t07)
    nucleus_after = drafting_counters(replicas["layer"])
    assert exact(nucleus), ("temperature 0.7, top_p 0.9", lines(nucleus))
    assert verified_drawn(nucleus_before, nucleus_after) >= 10, (nucleus_before, nucleus_after)


def verified_any(before, after) -> int:
    """Draft tokens of the layer (every kind) the target verified between two reads."""
    return verified_drawn(before, after, (FORCED, SPELLED, STATISTICAL, SAMPLED))


def verified_drawn(before, after, kinds=(SAMPLED,)) -> int:
    """Drawn draft tokens (statistical, temperature > 0; or those of `kinds`) the target
    verified between two reads of a replica's counters: accepted plus the first rejected of each
    draft."""
    return sum(after[f"{kind}_{k}"] - before[f"{kind}_{k}"] for kind in kinds for k in ("accepted", "rejected"))


def test_seeded_sampling_with_chunked_prefills_is_served_and_the_replica_stays_up(replicas):
    # The budget replica's step budget is 256 tokens: these prompts (~400 tokens) are prefilled
    # in chunks, where vLLM rewinds a seeded request's generator, which CPU generators cannot.
    replica = replicas["budget"]
    filler = " ".join(f"Line {i}: the order ships from warehouse {i % 7} to depot {i % 5}." for i in range(30))

    def body(seed):
        return {"model": SERVED_NAME, "max_tokens": 128, "temperature": 1.0, "seed": seed,
                "messages": [{"role": "user", "content": f"{filler} Create an order record for user {seed}."}],
                "response_format": {"type": "json_schema",
                                    "json_schema": {"name": "order", "schema": ORDER_SCHEMA}}}

    results = post_all(replica, [body(seed) for seed in range(8)], concurrency=8)
    assert [status for status, _ in results] == [200] * 8, results
    assert all(reply["usage"]["prompt_tokens"] > 256 for _, reply in results)
    finished = [reply["choices"][0] for _, reply in results if reply["choices"][0]["finish_reason"] == "stop"]
    assert len(finished) >= 4, results  # sampled at temperature 1: a few may run to max_tokens
    for choice in finished:  # valid orders (the grammar held through the chunked prefill)
        assert set(json.loads(choice["message"]["content"])) == set(ORDER_SCHEMA["required"])
    assert replica.process.alive() and replica.ready_status() == 200
    assert "cpu_generator_rewind applied" in replica.process.log_path.read_text()


VERSION_PROBE = """
import json, sys
from gpustack_dspark.worker.drafting import scheduler
if sys.argv[1] == "remove":
    from vllm.v1.core.sched.scheduler import Scheduler
    del Scheduler.update_draft_token_ids
problems = scheduler.check_vllm_internals()
if sys.argv[1] == "keep":  # the speculation budget's instance-level needs, on a stand-in scheduler
    from types import SimpleNamespace
    from gpustack_dspark.worker.drafting import budget_step
    problems += budget_step.check_scheduler(SimpleNamespace(
        running=[], waiting=[], max_num_scheduled_tokens=1, max_num_running_reqs=1))
    assert budget_step.check_scheduler(SimpleNamespace())[0] == "Scheduler.running is missing"
print(json.dumps(problems))
"""


def test_pinned_vllm_internals_are_present_and_their_absence_is_caught():
    def probe(mode):
        out = subprocess.run([str(worker_python()), "-c", VERSION_PROBE, mode], env=worker_env(),
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert probe("keep") == []
    problems = probe("remove")
    assert problems == ["vllm.v1.core.sched.scheduler.Scheduler.update_draft_token_ids is missing"]
