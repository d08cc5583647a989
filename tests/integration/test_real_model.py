"""The real model end to end: SmolLM2-135M-Instruct converted from the pinned PyPI package, served
by real `dspark-serve` replicas on real vLLM (CPU), judged on what it answers.

- conversion: the pinned wheel becomes a Llama directory that gives its golden greedy answer;
- greedy: the drafting layer's replies are token-identical to plain vLLM's on fresh extraction
  requests of every family (bench/extraction.py; a new seed every run, so no replica has seen
  them), and they are right in most fields;
- answers through GPUStack's /v1 with the OpenAI SDK: a Pydantic model parsed with the values
  of the text; real-world schemas (JSONSchemaBench) answered valid;
- exactness: at temperature 1, a ticket's enums and boolean (a finite reply space) sampled with
  the layer and without speculation follow one distribution (two-sample test), and a
  deliberately wrong verifier (draft positions verified greedily) is rejected.

One module, its replicas shared by all its tests: a real-model replica is a minute of CPU to start.
"""

import json
import os
import secrets
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import List, Optional

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from gpustack_dspark.bench import extraction
from gpustack_dspark.devstack import real_model
from gpustack_dspark.devstack.replica import start_replica
from tests.bench import exactness
from tests.bench.order_json import SAME_VLLM_ARGS
from tests.conftest import WRONG_VERIFIER_ENV, all_ready

pytestmark = pytest.mark.integration

NAME = real_model.SERVED_NAME
REAL_ARGS = ["--served-model-name", NAME, "--max-model-len", str(real_model.MAX_MODEL_LEN),
             "--dspark-warmup-requests", "1", *SAME_VLLM_ARGS]
LAYER_ARGS = ["--enable-dspark", "--dspark-speculative-length=8"]
BENCH = Path(__file__).resolve().parents[3] / "shared" / "data" / "jsonschemabench"
# Fresh requests: a new seed every run (printed, so a failure can be replayed).
SEED = int(os.environ.get("DSPARK_TEST_SEED") or secrets.randbelow(1 << 30))
GREEDY_TASKS = len(extraction.FAMILIES)  # one of each family
EXACTNESS_SAMPLES = 160  # per arm: CI-sized (the benchmark draws N >= 1,000)
# The wrong verifier moves the distribution far (TV 0.66 at n = 240 when this was written): fewer
# samples reject it.
WRONG_SAMPLES = 80
# As in test_drafting_layer.py: a rejection is confirmed on fresh samples before the test fails.
EXACTNESS_ALPHA = 0.001
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """A conversion of this run's own, from the pinned package (pip's cache may hold the wheel)."""
    return real_model.real_model(root=tmp_path_factory.mktemp("real-model-cache"))


@pytest.fixture(scope="module")
def replicas(model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("real-model")
    settings = {"plain": (REAL_ARGS, None), "layer": (LAYER_ARGS + REAL_ARGS, None),
                "wrong": (LAYER_ARGS + REAL_ARGS, WRONG_VERIFIER_ENV)}
    started = {name: start_replica(logs / f"{name}.log", args, model=model_dir, env=env)
               for name, (args, env) in settings.items()}
    with all_ready(started, 900):
        yield started


def post_all(replica, bodies, concurrency=2):
    def one(body):
        r = httpx.post(f"{replica.base_url}/v1/chat/completions", json=body, timeout=600)
        return r.status_code, r.json()

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, bodies))


def test_the_pinned_package_converts_to_a_model_with_its_golden_answer(model_dir):
    info = json.loads((model_dir / "build-info.json").read_text())
    assert info["package"] == f"{real_model.PACKAGE}=={real_model.PACKAGE_VERSION}"
    assert info["wheel_sha256"] == real_model.WHEEL_SHA256
    assert info["golden"] == [real_model.GOLDEN_PROMPT, real_model.GOLDEN_REPLY]  # checked before it was kept
    config = json.loads((model_dir / "config.json").read_text())
    assert (config["model_type"], config["vocab_size"], config["num_hidden_layers"], config["hidden_size"]) == (
        "llama", 49152, 30, 576)
    assert "quantization_config" not in config and config["tie_word_embeddings"] is True
    assert (model_dir / "chat_template.jinja").exists() and (model_dir / "tokenizer.json").exists()
    assert real_model.link_path(model_dir.parent).resolve() == model_dir
    # found, not built again
    assert real_model.real_model(root=model_dir.parent) == model_dir


def test_a_wheel_with_another_hash_is_refused_and_removed(tmp_path):
    (tmp_path / real_model.WHEEL_NAME).write_bytes(b"not the pinned wheel")
    with pytest.raises(real_model.RealModelError, match=r"sha256 [0-9a-f]{64}, expected " + real_model.WHEEL_SHA256):
        real_model.download_wheel(tmp_path)
    assert not (tmp_path / real_model.WHEEL_NAME).exists()


def test_greedy_replies_with_the_layer_are_token_identical_to_plain_vllm_on_every_family(replicas):
    print(f"seed {SEED}")
    tasks = extraction.tasks(SEED, GREEDY_TASKS)
    assert {t.family for t in tasks} == set(extraction.FAMILIES)
    bodies = [{**extraction.body(t, NAME), "logprobs": True, "return_tokens_as_token_ids": True} for t in tasks]
    plain, layered = post_all(replicas["plain"], bodies), post_all(replicas["layer"], bodies)
    scores = []
    for task, (s_plain, r_plain), (s_layer, r_layer) in zip(tasks, plain, layered):
        assert (s_plain, s_layer) == (200, 200), (task.family, r_plain, r_layer)
        a, b = r_plain["choices"][0], r_layer["choices"][0]
        assert exactness.token_ids(b) == exactness.token_ids(a), (task.family, a["message"], b["message"])
        assert b["finish_reason"] == a["finish_reason"]
        scores.append(extraction.score(task, b["message"]["content"], b["finish_reason"]))
    summary = extraction.summarize(scores)
    print(extraction.summary_line(summary))
    # The drafts did the work: the layer's replica verified several tokens per forward pass.
    stats = [r["usage"]["dspark_stats"] for _, r in layered]
    per_forward = sum(s["accepted_tokens"] for s in stats) / sum(s["verify_steps"] for s in stats) + 1
    assert per_forward > 2.0, stats
    assert summary.valid == GREEDY_TASKS and summary.finished_stop == GREEDY_TASKS, summary
    # A real model: most fields copied right (about 60-70 % measured on SmolLM2-135M; the
    # fixture's answers would score near 0).
    assert summary.accuracy >= 0.4, extraction.summary_line(summary)


# ---- through GPUStack's /v1 with the OpenAI SDK ------------------------------------------------

@pytest.fixture(scope="module")
def client(shared_stack, replicas, tmp_path_factory):
    server, api = shared_stack.gpustack()
    with shared_stack.models_on(tmp_path_factory.mktemp("real-model-on-gpustack"),
                                {NAME: ([replicas["layer"].port], 300)}):
        yield openai.OpenAI(base_url=f"{server.url}/v1", api_key=api.api_key, max_retries=0, timeout=300)


class Address(BaseModel):
    street: str = Field(max_length=60)
    city: str = Field(max_length=60)
    postal_code: str = Field(pattern=r"^\d{5}$")


class Contact(BaseModel):
    name: str = Field(max_length=60)
    company: str = Field(max_length=60)
    address: Address


CONTACT_EXAMPLE = ("New contact: Tom Reed (Blue Harbor Ltd). Mailing address: 14 Oak Street, Rome, postal code 00184.",
                   {"name": "Tom Reed", "company": "Blue Harbor Ltd",
                    "address": {"street": "14 Oak Street", "city": "Rome", "postal_code": "00184"}})
CONTACTS = [
    ("New contact: Anna Berg (Nordic Tools AS). Mailing address: 7 Lake Road, Oslo, postal code 01502.",
     Contact(name="Anna Berg", company="Nordic Tools AS",
             address=Address(street="7 Lake Road", city="Oslo", postal_code="01502"))),
    ("New contact: Luis Ortega (Sunrise Foods). Mailing address: 22 Hill Avenue, Madrid, postal code 28013.",
     Contact(name="Luis Ortega", company="Sunrise Foods",
             address=Address(street="22 Hill Avenue", city="Madrid", postal_code="28013"))),
]


def test_sdk_parse_with_a_pydantic_model_gets_the_texts_values(client):
    system = "Extract the contact from the user's text as JSON. Use only values stated in the text."
    right = 0
    for text, expected in CONTACTS:
        completion = client.chat.completions.parse(
            model=NAME, response_format=Contact, max_tokens=160, temperature=0,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": CONTACT_EXAMPLE[0]},
                      {"role": "assistant", "content": json.dumps(CONTACT_EXAMPLE[1])},
                      {"role": "user", "content": text}])
        choice = completion.choices[0]
        assert choice.finish_reason == "stop" and isinstance(choice.message.parsed, Contact), choice
        got = choice.message.parsed
        print(got.model_dump_json())
        right += sum(a == b for a, b in zip(_leaves(got.model_dump()), _leaves(expected.model_dump())))
    # 6 leaves a contact; the model copies most of them (all 12 when this was written)
    assert right >= 9, right


def _leaves(value) -> List:
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _leaves(value[key])]
    return [str(value).strip().lower()]


SCHEMA_CHARS = 1500  # schemas short enough to write into the prompt of a 2,048-token context


def _bench_schemas() -> List[tuple]:
    picks = []
    for folder in ("Glaiveai2K", "Github_easy"):
        files = sorted((BENCH / folder).glob("*.json"))
        if not files:
            pytest.fail(f"no JSONSchemaBench schemas in {BENCH / folder} (../shared/data beside the checkout)")
        small = [p for p in files if len(p.read_text()) <= SCHEMA_CHARS]
        picks += [(f"{folder}/{path.stem}", json.loads(path.read_text())) for path in small[:2]]
    return picks


def test_real_world_schemas_through_the_sdk_are_answered_valid(client):
    outcomes = {}
    for name, schema in _bench_schemas():
        try:
            completion = client.chat.completions.create(
                model=NAME, max_tokens=160, temperature=0,
                messages=[{"role": "user", "content": f"Fill in an example {name.split('/')[1].split('_')[0]} "
                                                      f"as JSON. Schema: {json.dumps(schema)}"}],
                response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
        except openai.BadRequestError as e:  # a schema the replica names as unusable: a 400 that says why
            outcomes[name] = f"400 {e.message[:80]}"
            continue
        choice = completion.choices[0]
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), schema)
        outcomes[name] = choice.finish_reason
    print(json.dumps(outcomes, indent=1))
    # Every finished reply validated above; a 135 M model runs some of these to max_tokens (an
    # array it keeps filling): cut replies are the client's limit, not invalid ones.
    assert len(outcomes) == 4 and sum(1 for v in outcomes.values() if v == "stop") >= 2, outcomes


# ---- exactness at temperature 1 -----------------------------------------------------------------

def sample(replica, samples: int) -> List[str]:
    # A withheld reply is an outcome of its own, not asked again (exactness.WITHHELD).
    choices = exactness.collect(replica.base_url, exactness.ticket_body(NAME, {"temperature": 1.0}, 8), samples,
                                reask=False)
    return [exactness.canonical_reply(c["message"]["content"]) for c in choices]


def same_distribution(replicas, name: str, reference: List[str]):
    first = exactness.two_sample(reference, sample(replicas[name], EXACTNESS_SAMPLES))
    if first.p_value > EXACTNESS_ALPHA:
        return first, None
    print(f"{name}: {first.line()} rejected; confirming on fresh samples", flush=True)
    return first, exactness.two_sample(sample(replicas["plain"], EXACTNESS_SAMPLES),
                                       sample(replicas[name], EXACTNESS_SAMPLES))


def exact(result) -> bool:
    first, confirmation = result
    return (confirmation or first).p_value > EXACTNESS_ALPHA


def lines(result) -> str:
    return " then ".join(c.line() for c in result if c is not None)


def counters(replica, settle_s=1.5):
    time.sleep(settle_s)  # the engine writes its counters at most every 0.5 s
    return replica.info()["drafting"]["counters"]


def test_sampled_replies_follow_the_models_distribution_and_a_wrong_verifier_is_caught(replicas):
    before = counters(replicas["layer"], settle_s=0)
    reference = sample(replicas["plain"], EXACTNESS_SAMPLES)
    assert len(set(reference)) >= 6, sorted(set(reference))  # the model spreads over the reply space
    layer = same_distribution(replicas, "layer", reference)
    after = counters(replicas["layer"])
    # The negative control gets one more look with more of its samples where the first was not
    # enough (TV 0.40 at n = 80 over 32 outcomes came out at p 0.017 once): a control that moved
    # nothing would still pass only by a chance rejection, about 2 runs in 1,000.
    wrong_replies = sample(replicas["wrong"], WRONG_SAMPLES)
    wrong = exactness.two_sample(reference, wrong_replies)
    if wrong.p_value > EXACTNESS_ALPHA:
        print(f"wrong: {wrong.line()} not rejected; a second look with more samples", flush=True)
        wrong = exactness.two_sample(reference, wrong_replies + sample(replicas["wrong"], 2 * WRONG_SAMPLES))
    print("layer", lines(layer), "| wrong", wrong.line())
    assert exact(layer), ("layer, length 8", lines(layer))
    assert wrong.p_value <= EXACTNESS_ALPHA and wrong.tv > layer[0].tv, ("verified greedily", wrong.line())
    # Drawn draft tokens were proposed and verified in this run (the path under test ran).
    assert after["sampled_proposed"] - before["sampled_proposed"] > 50, (before, after)
