"""DSpark settings refused where GPUStack accepts models, against a real GPUStack 2.3 server with
the plugin on a real PostgreSQL (one server for the module): `POST`/`PUT /v2/models`, the
import (dry run and real), revision rollback and the deploy form's compatibility check; the
database is compared before and after every refusal. Hostile documents and bodies sent to the
server are refused in bounded time while the server stays up."""

import json
import time

import httpx
import pytest

from gpustack_dspark import backend_ids
from gpustack_dspark.worker.serve import main as dspark_serve
from tests.conftest import admin_api, dspark_status, wait_backend_registered

pytestmark = pytest.mark.integration

CPU = backend_ids.CPU_VERSION
TABLES = ("models", "model_instances", "model_revisions", "model_routes", "model_route_targets")
GOOD = ["--enable-dspark", "--dspark-speculative-length=4", "--dspark-grammar-mode=json"]


@pytest.fixture(scope="module")
def stack(start_server, postgres, tmp_path_factory):
    server = start_server()
    api = admin_api(server)
    wait_backend_registered(server, api.api_key)
    cluster_id = api.ensure_cluster("dspark-admission")
    folder = tmp_path_factory.mktemp("model")
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}')
    client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {api.api_key}"}, timeout=30)
    try:
        yield {"server": server, "api": api, "client": client, "cluster_id": cluster_id,
               "folder": str(folder), "postgres": postgres}
    finally:
        client.close()
        api.close()


def spec(stack, name, params, backend=backend_ids.BACKEND_NAME, **extra):
    body = {"name": name, "source": "local_path", "local_path": stack["folder"], "backend": backend,
            "backend_parameters": params, "replicas": 0, "cluster_id": stack["cluster_id"]}
    if backend == backend_ids.BACKEND_NAME:
        body["backend_version"] = CPU
    body.update(extra)
    return body


def database(stack):
    """Every row of the tables a model write touches (ids, specs, states), as text."""
    pg = stack["postgres"]
    return {t: pg.psql(f"SELECT coalesce(md5(string_agg(x::text, '|' ORDER BY x.id)), '') FROM {t} x")
            for t in TABLES}


def settled(stack, timeout_s: float = 30):
    """The database once GPUStack's controllers have finished with the last write (two equal
    snapshots a second apart): the baseline a refusal must leave unchanged."""
    deadline = time.monotonic() + timeout_s
    last = database(stack)
    while time.monotonic() < deadline:
        time.sleep(1)
        now = database(stack)
        if now == last:
            return now
        last = now
    raise AssertionError("GPUStack's tables kept changing")


def refused(response, *needles):
    assert response.status_code == 400, (response.status_code, response.text)
    message = response.json()["message"]
    for needle in needles:
        assert needle in message, message
    return message


def create(stack, name, params, **extra):
    response = stack["client"].post("/v2/models", json=spec(stack, name, params, **extra))
    assert response.status_code == 200, response.text
    return response.json()


def test_status_reports_admission_features(stack):
    features = dspark_status(stack["server"], stack["api"].api_key)["features"]
    assert features["admission"]["state"] == "enabled"
    assert features["start_failure_reasons"]["state"] == "enabled"


def test_the_issue_example_is_refused_with_dspark_serve_s_own_line(stack, capsys):
    before = settled(stack)
    message = refused(stack["client"].post("/v2/models", json=spec(
        stack, "bad-example", ["--enable-dspark", "--dspark-speculative-length=99", "--dspark-method=bogus"])),
        "--dspark-speculative-length", "'99'", "an integer 1-16", "--dspark-method", "'bogus'")
    assert database(stack) == before
    # The same line dspark-serve prints before it exits 2.
    with pytest.raises(SystemExit) as exit_:
        dspark_serve([stack["folder"], "--dspark-speculative-length=99"])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.removeprefix("dspark-serve: error: ") in message


# (backend_parameters, what the message must name) — every knob's own parser, several spellings.
BAD_PARAMS = [
    (["--dspark-speculative-length=0"], ["--dspark-speculative-length", "'0'"]),
    (["--dspark-speculative-length", "17"], ["--dspark-speculative-length", "'17'"]),
    (["--dspark-speculative-length=four"], ["'four'", "an integer 1-16"]),
    (["--dspark-speculative-length 99"], ["'99'"]),  # one entry holding flag and value, as the UI sends it
    (["--dspark-accept-threshold=1.5"], ["--dspark-accept-threshold", "0 < x < 1"]),
    (["--dspark-accept-threshold=nan"], ["--dspark-accept-threshold", "'nan'"]),
    (["--dspark-method=eagle"], ["--dspark-method", "'eagle'", "eagle3"]),
    (["--dspark-grammar-mode=yaml"], ["--dspark-grammar-mode", "json|off"]),
    (["--dspark-drafting=sometimes"], ["--dspark-drafting", "'sometimes'"]),
    (["--dspark-precision=int4"], ["--dspark-precision", "auto|bf16|fp8"]),
    (["--dspark-warmup-requests=-1"], ["--dspark-warmup-requests", "0-10000"]),
    (["--dspark-warmup-concurrency=0"], ["--dspark-warmup-concurrency", "1-256"]),
    (["--dspark-warmup-timeout=0"], ["--dspark-warmup-timeout", "0 < x <= 86400"]),
    (["--dspark-schema={not json"], ["--dspark-schema", "not valid JSON"]),
    (["--dspark-schema=[1, 2]"], ["--dspark-schema", "a schema must be a JSON object"]),
    (["--dspark-schema=" + "[" * 300 + "]" * 300], ["--dspark-schema", "nested 300 levels deep"]),
    (["--dspark-speculativ-length=4"], ["--dspark-speculativ-length", "did you mean --dspark-speculative-length"]),
    (["--dspark-zzz=1"], ["--dspark-zzz", "allowed: --enable-dspark, --dspark-speculative-length"]),
    (["--enable-dspark=maybe"], ["--enable-dspark", "true|false"]),
    (["--dspark-method"], ["--dspark-method", "the flag needs a value"]),
]


@pytest.mark.parametrize("params, needles", BAD_PARAMS, ids=[p[0][0][:40] for p in BAD_PARAMS])
def test_create_refuses_bad_knobs_and_writes_nothing(stack, params, needles, capsys):
    from gpustack.utils.command import flatten_to_argv

    before = database(stack)  # nothing is written in this module before these run
    message = refused(stack["client"].post("/v2/models", json=spec(stack, "bad-create", ["--enable-dspark", *params])),
                      "DSpark backend parameters", *needles)
    assert database(stack) == before
    # dspark-serve, given the argv GPUStack's worker would run, exits 2 with the same line.
    with pytest.raises(SystemExit) as exit_:
        dspark_serve([stack["folder"], "--print-vllm-args", "--enable-dspark", *flatten_to_argv(params)])
    assert exit_.value.code == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("dspark-serve: error: ") and line.removeprefix("dspark-serve: error: ") in message


def test_the_deploy_form_check_shows_the_message(stack):
    response = stack["client"].post("/v2/model-evaluations", json={
        "cluster_id": stack["cluster_id"],
        "model_specs": [spec(stack, "eval-bad", ["--dspark-warmup-concurrency=999"], replicas=1),
                        spec(stack, "eval-good", GOOD, replicas=1)]})
    assert response.status_code == 200, response.text
    bad, good = response.json()["results"]
    assert bad["compatible"] is False
    assert any("--dspark-warmup-concurrency: '999' is not allowed" in m for m in bad["compatibility_messages"])
    assert not any("DSpark" in m for m in good["compatibility_messages"] or [])


def test_valid_and_non_dspark_models_are_unaffected(stack):
    create(stack, "good-dspark", GOOD)
    # Another backend's parameters are not ours to judge, even if they look like ours.
    create(stack, "plain-custom", ["--dspark-speculative-length=99"], backend="my-backend-custom")


def test_update_refuses_changed_bad_knobs_and_keeps_the_row(stack):
    model = create(stack, "upd", GOOD)
    client = stack["client"]
    before = settled(stack)
    body = {**model, "backend_parameters": ["--enable-dspark", "--dspark-speculative-length=40"]}
    refused(client.put(f"/v2/models/{model['id']}", json=body), "--dspark-speculative-length", "'40'")
    refused(client.put(f"/v2/models/{model['id']}", json={**model, "backend_parameters": [*GOOD, "--dspark-x=1"]}),
            "--dspark-x")
    assert database(stack) == before
    ok = client.put(f"/v2/models/{model['id']}", json={**model, "backend_parameters": GOOD + ["--max-num-seqs=8"]})
    assert ok.status_code == 200, ok.text


def test_whole_object_writes_of_an_existing_model_keep_working(stack):
    """A model stored before this check (bad knob already in the row) is still saved by
    GPUStack's whole-object PUTs; only changed values are judged."""
    model = create(stack, "legacy", GOOD)
    pg = stack["postgres"]
    legacy = json.dumps(["--enable-dspark", "--dspark-speculative-length=99"])
    pg.psql(f"UPDATE models SET backend_parameters = '{legacy}' WHERE id = {model['id']}")
    stored = stack["client"].get(f"/v2/models/{model['id']}").json()
    assert stored["backend_parameters"][1] == "--dspark-speculative-length=99"
    same = stack["client"].put(f"/v2/models/{model['id']}", json={**stored, "description": "renamed by a worker"})
    assert same.status_code == 200, same.text
    refused(stack["client"].put(f"/v2/models/{model['id']}", json={
        **stored, "backend_parameters": stored["backend_parameters"] + ["--dspark-method=nope"]}), "--dspark-method")


def _import(stack, content, dry_run):
    return stack["client"].post("/v2/models/import", json={"content": content, "dry_run": dry_run})


def _document(stack, name, params):
    lines = [f"name: {name}", "source: local_path", f"local_path: {stack['folder']}",
             f"backend: {backend_ids.BACKEND_NAME}", f"backend_version: {CPU}", "replicas: 0",
             "cluster_name: dspark-admission", "backend_parameters:"] + [f"- '{p}'" for p in params]
    return "\n".join(lines) + "\n"


def test_import_refuses_bad_knobs_dry_run_and_real(stack):
    before = settled(stack)
    document = _document(stack, "imp-bad", ["--enable-dspark", "--dspark-drafting=never"])
    plan = _import(stack, document, dry_run=True)
    # GPUStack's dry run answers with its plan; the entry carries the refusal.
    assert plan.status_code == 200, plan.text
    assert plan.json()["valid"] is False
    assert any("--dspark-drafting: 'never' is not allowed" in e for e in plan.json()["entries"][0]["errors"])
    refused(_import(stack, document, dry_run=False), "imp-bad", "--dspark-drafting", "'never'")
    assert database(stack) == before
    good = _import(stack, _document(stack, "imp-good", GOOD), dry_run=False)
    assert good.status_code == 200, good.text


def test_rollback_to_a_revision_with_bad_knobs_is_refused(stack):
    model = create(stack, "rb", GOOD)
    client, pg = stack["client"], stack["postgres"]
    changed = client.put(f"/v2/models/{model['id']}", json={**model, "backend_parameters": GOOD + ["--max-num-seqs=4"]})
    assert changed.status_code == 200, changed.text
    revisions = client.get(f"/v2/models/{model['id']}/revisions").json()["items"]
    first = min(r["revision"] for r in revisions)
    # A revision recorded before the plugin judged knobs: a bad value in its stored spec.
    spec_json = pg.psql(f"SELECT spec::text FROM model_revisions WHERE model_id = {model['id']} AND revision = {first}")
    old = json.loads(spec_json)
    old["backend_parameters"] = ["--enable-dspark", "--dspark-warmup-timeout=-5"]
    pg.psql(f"UPDATE model_revisions SET spec = '{json.dumps(old)}' WHERE model_id = {model['id']} "
            f"AND revision = {first}")
    before = settled(stack)
    refused(client.post(f"/v2/models/{model['id']}/rollback", json={"target_revision": first}),
            "--dspark-warmup-timeout", "'-5'")
    assert database(stack) == before


BOMB = "\n".join(["a: &a [x, x, x, x, x, x, x, x, x]"] + [
    f"{n}: &{n} [" + ", ".join([f"*{p}"] * 9) + "]" for p, n in zip("abcdefg", "bcdefgh")]) + "\n"
HOSTILE_DOCUMENTS = {
    "alias bomb": (BOMB, "expands to more than"),
    "recursive alias": ("x: &a [*a]\n", "recursive alias"),
    "deep nesting": ("a: " + "[" * 200 + "]" * 200 + "\n", "nested deeper than 64"),
}


def peak_rss_mb(server) -> float:
    """The server process's peak resident memory so far (VmHWM)."""
    for line in open(f"/proc/{server.process.pid}/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.parametrize("name", list(HOSTILE_DOCUMENTS))
def test_hostile_import_documents_are_refused_fast(stack, name):
    content, needle = HOSTILE_DOCUMENTS[name]
    before, peak = settled(stack), peak_rss_mb(stack["server"])
    started = time.monotonic()
    for dry_run in (True, False):
        refused(_import(stack, content, dry_run), needle)
    elapsed, grown = time.monotonic() - started, peak_rss_mb(stack["server"]) - peak
    print(f"{name}: both refused in {elapsed:.2f} s, server peak memory +{grown:.0f} MB")
    assert elapsed < 10 and grown < 200
    assert database(stack) == before
    assert stack["client"].get("/v2/models").status_code == 200


def test_oversized_bodies_are_refused_before_gpustack_reads_them(stack):
    client = stack["client"]
    before, peak = settled(stack), peak_rss_mb(stack["server"])
    huge = "x" * (100 * 1024 * 1024)
    started = time.monotonic()
    response = client.post("/v2/models/import", json={"content": huge, "dry_run": True})
    assert response.status_code == 413, response.text[:300]
    assert "at most" in response.json()["message"]
    chunked = client.post("/v2/models", content=iter([b"{" + b" " * (1024 * 1024)] * 12),
                          headers={"content-type": "application/json"})
    assert chunked.status_code == 413
    elapsed, grown = time.monotonic() - started, peak_rss_mb(stack["server"]) - peak
    print(f"100 MB import + 12 MB chunked create: 413 in {elapsed:.2f} s, server peak memory +{grown:.0f} MB")
    assert elapsed < 30
    assert database(stack) == before
    assert grown < 200  # the 100 MB body was never read
    assert client.get("/v2/models").status_code == 200
    del huge
