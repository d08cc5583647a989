"""`gpustack-dspark apply / export / status / delete` against a real GPUStack 2.3 server with
the plugin on a real PostgreSQL (one server for the module). The CLI runs in-process
through its `main()`; GPUStack's own import endpoint checks the round trip."""

import json
import re
import textwrap

import pytest

from gpustack_dspark import backend, knobs
from gpustack_dspark.cli.main import main
from tests.conftest import admin_api, wait_backend_registered, wait_for

pytestmark = pytest.mark.integration

TINY = '{"architectures": ["LlamaForCausalLM"], "model_type": "llama"}'


@pytest.fixture(scope="module")
def stack(start_server, tmp_path_factory):
    server = start_server()
    api = admin_api(server)
    wait_backend_registered(server, api.api_key, 90)
    if not api.items("/v2/clusters"):
        api.ensure_cluster("dspark-test")
    base = tmp_path_factory.mktemp("models")
    (base / "tiny").mkdir()
    (base / "tiny" / "config.json").write_text(TINY)
    try:
        yield server, api, base
    finally:
        api.close()
        server.stop()


def cli(stack, capsys, *argv):
    server, api, _ = stack
    rc = main([*argv, "--server", server.url, "--api-key", api.api_key])
    out = capsys.readouterr()
    return rc, out.out, out.err


def write(base, name, text):
    path = base / name
    path.write_text(textwrap.dedent(text).replace("MODEL_DIR", str(base / "tiny")))
    return str(path)


def model(api, name):
    return next((m for m in api.items("/v2/models") if m["name"] == name), None)


SETTINGS = ("name", "replicas", "backend", "backend_version", "backend_parameters", "env", "worker_selector",
            "cpu_offloading", "local_path", "restart_on_error", "cluster_id")


def snapshot(api):
    """Everything apply could write: the models' settings, and the instances. (Not
    `updated_at`: GPUStack's scheduler writes derived fields onto a new model by itself.)"""
    return (sorted(tuple([m["id"]] + [json.dumps(m.get(k), sort_keys=True) for k in SETTINGS])
                   for m in api.items("/v2/models")),
            sorted(i["id"] for i in api.items("/v2/model-instances")))


DEMO = """\
    name: json-demo
    source: local_path
    local_path: MODEL_DIR
    replicas: 1
    dspark:
      device: cpu
      speculative_length: 4
      grammar: {schema: {type: object, properties: {id: {type: integer}}}}
      warmup: {requests: 2, concurrency: 1}
    backend_parameters: [--max-model-len=1024, --enforce-eager]
"""


def test_apply_creates_the_model_with_gpustack_fields_and_twice_changes_nothing(stack, capsys):
    _, api, base = stack
    path = write(base, "demo.yaml", DEMO)
    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--no-wait")
    assert rc == 0, err
    assert "create json-demo" in out and "1 to create, 0 to update, 0 unchanged" in out
    row = model(api, "json-demo")
    assert (row["backend"], row["backend_version"], row["cpu_offloading"]) == (
        backend.BACKEND_NAME, backend.CPU_VERSION, True)
    assert row["backend_parameters"] == [
        "--enable-dspark", "--dspark-speculative-length=4", "--dspark-grammar-mode=json",
        '--dspark-schema={"type":"object","properties":{"id":{"type":"integer"}}}',
        "--dspark-warmup-requests=2", "--dspark-warmup-concurrency=1", "--max-model-len=1024", "--enforce-eager"]
    # What the worker will parse: the same knob model.
    parsed, rest = knobs.parse_knob_args(row["backend_parameters"])
    assert (parsed.enable, parsed.speculative_length, rest) == (True, 4, ["--max-model-len=1024", "--enforce-eager"])

    before = snapshot(api)
    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--no-wait")
    assert rc == 0, err
    assert "unchanged json-demo" in out and "applied" not in out
    assert snapshot(api) == before


def test_dry_run_prints_the_diff_and_changes_nothing_then_apply_updates_in_place(stack, capsys):
    _, api, base = stack
    path = write(base, "demo2.yaml", DEMO.replace("speculative_length: 4", "speculative_length: 6")
                 .replace("replicas: 1", "replicas: 2"))
    # GPUStack's controller creates the instance after the model, asynchronously (slow under
    # load); only with an instance is the deployment "running" for GPUStack's import.
    wait_for(lambda: [i for i in api.items("/v2/model-instances") if i["model_name"] == "json-demo"], 120,
             "json-demo's instance")
    before = snapshot(api)
    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--dry-run")
    assert rc == 0, err
    assert "update json-demo (running: updated in place)" in out
    assert "  ~ replicas: 1 -> 2" in out
    assert '      - "--dspark-speculative-length=4"' in out and '      + "--dspark-speculative-length=6"' in out
    assert snapshot(api) == before

    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--no-wait")
    assert rc == 0, err
    row = model(api, "json-demo")
    assert row["replicas"] == 2 and "--dspark-speculative-length=6" in row["backend_parameters"]
    # GPUStack re-derives `categories` after an update, asynchronously (slow under load);
    # apply keeps the server's own, so the re-apply is unchanged once they are there.
    wait_for(lambda: (model(api, "json-demo") or {}).get("categories"), 120, "GPUStack's categories")
    rc, out, _ = cli(stack, capsys, "apply", "-f", path, "--dry-run")
    assert "unchanged json-demo" in out, out


def test_export_imports_into_gpustack_unchanged_and_round_trips(stack, capsys, tmp_path):
    _, api, base = stack
    out_file = tmp_path / "json-demo.yaml"
    rc, _, err = cli(stack, capsys, "export", "json-demo", "-o", str(out_file))
    assert rc == 0, err
    exported = out_file.read_text()
    assert "dspark:" not in exported and "--enable-dspark" in exported

    # GPUStack's own import accepts it as it is: valid, nothing to change.
    plan = api.post("/v2/models/import", {"content": exported, "dry_run": True})
    assert plan["valid"] and [e["action"] for e in plan["entries"]] == ["unchanged"], plan
    rc, out, _ = cli(stack, capsys, "apply", "-f", str(out_file), "--dry-run")
    assert rc == 0 and "unchanged json-demo" in out

    # Delete, import the export with GPUStack's endpoint, export again: the same document.
    rc, out, err = cli(stack, capsys, "delete", "json-demo")
    assert rc == 0 and "deleted json-demo" in out, err
    wait_for(lambda: model(api, "json-demo") is None, 30, "the delete")
    wait_for(lambda: not [i for i in api.items("/v2/model-instances") if i["model_name"] == "json-demo"], 60,
             "the instances to go")
    created = api.post("/v2/models/import", {"content": exported})
    assert [e["action"] for e in created["entries"]] == ["create"]
    rc, again, _ = cli(stack, capsys, "export", "json-demo")
    body = lambda text: [line for line in text.splitlines() if not line.startswith("# Exported from")]
    assert rc == 0 and body(again) == body(exported)


def test_status_json_shape(stack, capsys):
    rc, out, err = cli(stack, capsys, "status", "json-demo", "--json")
    assert rc == 0, err
    rows = json.loads(out)["models"]
    assert [r["name"] for r in rows] == ["json-demo"]
    row = rows[0]
    assert set(row) == {"name", "id", "dspark", "backend", "backend_version", "replicas", "state", "warm",
                        "in_flight", "acceptance_rate", "format_error_rate", "instances"}
    assert row["dspark"] is True and row["replicas"] == 2 and row["warm"] == 0
    assert row["in_flight"] == 0  # the plugin's routing feature answers in-flight counts
    assert row["acceptance_rate"] is None and row["format_error_rate"] is None  # no metrics yet
    assert len(row["instances"]) == 2
    assert set(row["instances"][0]) == {"id", "name", "state", "worker", "warm", "in_flight", "state_message"}
    rc, table, _ = cli(stack, capsys, "status")
    assert table.splitlines()[0].split() == ["MODEL", "DSPARK", "REPLICAS", "WARM", "STATE", "IN-FLIGHT",
                                             "ACCEPTANCE", "FORMAT-ERRORS"]
    assert "json-demo" in table and "0/2" in table


def test_wait_stops_on_timeout_and_on_error_with_the_instance_message(stack, capsys):
    _, api, base = stack
    path = write(base, "wait.yaml", DEMO.replace("json-demo", "json-wait")
                 .replace("replicas: 1", "replicas: 1\n    restart_on_error: false"))
    # No worker: the replica stays pending; the wait gives up with GPUStack's own message.
    rc, _, err = cli(stack, capsys, "apply", "-f", path, "--timeout", "3")
    assert rc == 1
    assert "timed out after 3s waiting for replicas to be RUNNING: json-wait 0/1" in err
    instance = wait_for(lambda: [i for i in api.items("/v2/model-instances") if i["model_name"] == "json-wait"],
                        30, "the instance")[0]
    # An instance in ERROR (as the worker would report a failed start) stops the wait at once.
    instance.update(state="error", state_message="dspark-serve exited: --dspark-schema does not compile")
    assert api.client.put(f"/v2/model-instances/{instance['id']}", json=instance).status_code == 200
    rc, _, err = cli(stack, capsys, "apply", "-f", path, "--timeout", "600")
    assert rc == 1
    assert "json-wait: instance " in err and "is in ERROR: dspark-serve exited: --dspark-schema does not compile" in err
    # RUNNING (what the worker sets once /dspark/ready answers 200): the wait ends, exit 0.
    instance = api.get(f"/v2/model-instances/{instance['id']}")
    instance.update(state="running", state_message="")
    assert api.client.put(f"/v2/model-instances/{instance['id']}", json=instance).status_code == 200
    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--timeout", "600")
    assert rc == 0, err
    assert "unchanged json-wait" in out and "] 1/1 warm  json-wait 1/1 (1 running)" in err
    assert cli(stack, capsys, "delete", "json-wait")[0] == 0


MALFORMED = [
    ("name: x\nsource: local_path\nlocal_path: /m\nreplica: 2\n", "replica (line 4): unknown field; did you mean replicas?"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark: {speculative_lenght: 6}\n",
     "dspark.speculative_lenght (line 4): unknown DSpark setting; did you mean speculative_length?"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark:\n  speculative_length: 40\n",
     "dspark.speculative_length (line 5): 40 is not allowed; allowed: auto or an integer 1-16"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark: {accept_threshold: 1.5}\n",
     "dspark.accept_threshold (line 4): 1.5 is not allowed; allowed: a number, 0 < x < 1"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark: {grammar: xml}\n",
     "dspark.grammar (line 4): 'xml' is not allowed; allowed: json|off"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark: {grammar: {schema: ./missing.json}}\n",
     "dspark.grammar.schema (line 4): cannot read the schema file"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark:\n  warmup: {requests: -1}\n",
     "dspark.warmup.requests (line 5): -1 is not allowed; allowed: an integer 0-10000"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark:\n  warmup: {concurency: 2}\n",
     "dspark.warmup.concurency (line 5): unknown warmup setting; did you mean concurrency?"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark: {method: medusa}\n",
     "dspark.method (line 4): 'medusa' is not allowed; allowed: auto|dspark|mtp|suffix|ngram|draft_model|eagle3"),
    ("name: x\nsource: local_path\nlocal_path: /m\nbackend_parameters:\n  - --enable-dspark\n"
     "  - --dspark-speculative-length=0\n",
     "backend_parameters[1] (line 6): --dspark-speculative-length: '0' is not allowed; allowed: auto or an integer 1-16"),
    ("name: x\nsource: local_path\nlocal_path: /m\nbackend_parameters: [--dspark-specultive-length=3]\n",
     "backend_parameters[0] (line 4): --dspark-specultive-length is not a DSpark flag; "
     "did you mean --dspark-speculative-length?"),
    ("name: x\nsource: local_path\nlocal_path: /m\nbackend: vLLM\ndspark: {speculative_length: 4}\n",
     "backend (line 4): 'vLLM' is not allowed with a dspark section; allowed: DSpark-custom"),
    ("name: x\nsource: huggingface\nreplicas: 1\n", "source (line 2): source huggingface needs huggingface_repo_id"),
    ("name: x\nsource: s3\nlocal_path: /m\n", "source (line 2): 's3' is not allowed; allowed: huggingface|model_scope|local_path"),
    ("name: x\nsource: local_path\nlocal_path: /m\nreplicas: two\n", "replicas (line 4): 'two' is not allowed; allowed: an integer >= 0"),
    ("name: x\nsource: local_path\nlocal_path: /m\ncluster_id: 1\n",
     "cluster_id (line 4): cluster_id is set by GPUStack and cannot be given; name the cluster with cluster_name"),
    ("name: x\nsource: local_path\nlocal_path: /m\nenv: {OMP_NUM_THREADS: 4}\n",
     "env.OMP_NUM_THREADS (line 4): 4 is not allowed; allowed: text (quote numbers and booleans)"),
    ("name: x\nsource: local_path\nlocal_path: /m\nreplicas: 1\nreplicas: 2\n",
     "replicas (line 5): given twice (first on line 4); keep one"),
    ("name: x\nsource: local_path\nlocal_path: /m\ngpu_selector: {gpu_cnt: 4}\n",
     "gpu_selector.gpu_cnt (line 4): unknown field; did you mean gpu_count?"),
    ("name: x\nsource: local_path\nlocal_path: /m\ndspark:\n  device: cpu\ncpu_offloading: false\n",
     "cpu_offloading (line 6): false is not allowed with 0.32.0-cpu-custom; allowed: true"),
    ("name: x\nsource: [local_path\n", "not valid YAML"),
]


GOOD = "name: would-be-created\nsource: local_path\nlocal_path: /m\ndspark: {}\n---\n"


@pytest.mark.parametrize("text,message", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_malformed_documents_exit_2_with_their_error_and_leave_gpustack_unchanged(stack, capsys, text, message):
    _, api, base = stack
    # Each bad document follows a valid one: the file is applied whole or not at all.
    path = write(base, "bad.yaml", GOOD + text)
    before = snapshot(api)
    rc, out, err = cli(stack, capsys, "apply", "-f", path, "--no-wait")
    assert rc == 2, (out, err)
    # Lines count in the file: the valid document before takes 5.
    message = re.sub(r"line (\d+)", lambda m: f"line {int(m.group(1)) + len(GOOD.splitlines())}", message)
    assert message in err, err
    assert "document 2" in err or "not valid YAML" in err
    assert snapshot(api) == before


def test_gpustack_refusal_is_bad_input_and_applies_nothing(stack, capsys):
    _, api, base = stack
    path = write(base, "refused.yaml", """\
        name: fine-one
        source: local_path
        local_path: MODEL_DIR
        dspark: {device: cpu}
        ---
        name: elsewhere
        cluster_name: no-such-cluster
        source: local_path
        local_path: MODEL_DIR
        dspark: {device: cpu}
    """)
    before = snapshot(api)
    rc, _, err = cli(stack, capsys, "apply", "-f", path, "--no-wait")
    assert rc == 2
    assert "document 2 (elsewhere): GPUStack: cluster 'no-such-cluster' not found" in err
    assert snapshot(api) == before
