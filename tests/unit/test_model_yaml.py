"""Model YAML -> GPUStack fields (pure), the apply plan, the wait, the status rows."""

import io
import json
from pathlib import Path

import pytest

from gpustack_dspark import backend, knobs
from gpustack_dspark.cli import gpustack_fields, plan, status, wait
from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.main import main
from gpustack_dspark.cli.modeldoc import SpecErrors, load_file, parse_text
from gpustack_dspark.devstack import real_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "deploy" / "models"


def parse(text, base=REPO):
    return parse_text(text, "m.yaml", base)


def errors(text, base=REPO):
    with pytest.raises(SpecErrors) as e:
        parse(text, base)
    return [str(err) for err in e.value.errors]


def test_the_issue_example_materializes_into_gpustack_fields(tmp_path):
    (tmp_path / "order.schema.json").write_text('{"type": "object", "required": ["id"]}')
    doc, = parse("""
name: deepseek-v4.1-json
source: huggingface
huggingface_repo_id: deepseek-ai/DeepSeek-V4.1
replicas: 2
gpu_selector: {gpu_count: 4}
dspark:
  speculative_length: 6
  grammar: {schema: ./order.schema.json}
  accept_threshold: 0.7
  warmup: {requests: 32, concurrency: 8}
""", tmp_path)
    assert doc.entry == {
        "name": "deepseek-v4.1-json", "source": "huggingface", "huggingface_repo_id": "deepseek-ai/DeepSeek-V4.1",
        "replicas": 2, "backend": backend.BACKEND_NAME, "backend_version": backend.CUDA_VERSION,
        "backend_parameters": ["--enable-dspark", "--dspark-speculative-length=6", "--dspark-grammar-mode=json",
                               '--dspark-schema={"type":"object","required":["id"]}',
                               "--dspark-accept-threshold=0.7", "--dspark-warmup-requests=32",
                               "--dspark-warmup-concurrency=8", "--tensor-parallel-size=4"],
        "enable_model_route": True}
    # The worker reads them back with the same knob model.
    parsed, rest = knobs.parse_knob_args(doc.entry["backend_parameters"])
    assert (parsed.speculative_length, parsed.accept_threshold, parsed.warmup_requests, rest) == (
        6, 0.7, 32, ["--tensor-parallel-size=4"])


def test_the_flags_form_and_the_section_form_give_the_same_document():
    section, = load_file(str(EXAMPLES / "deepseek-v4.1-4gpu.yaml"))
    flags, = load_file(str(EXAMPLES / "deepseek-v4.1-flags.yaml"))
    assert section.entry == flags.entry and section.knobs == flags.knobs


def test_flags_and_section_say_the_same_thing_about_a_bad_value():
    base = "name: x\nsource: local_path\nlocal_path: /m\n"
    by_section = errors(base + "dspark: {speculative_length: 40}\n")
    by_flag = errors(base + "backend_parameters: ['--dspark-speculative-length=40']\n")
    assert by_section == ["m.yaml: document 1 (x): dspark.speculative_length (line 4): "
                          "40 is not allowed; allowed: auto or an integer 1-16"]
    assert by_flag == ["m.yaml: document 1 (x): backend_parameters[0] (line 4): --dspark-speculative-length: "
                       "'40' is not allowed; allowed: auto or an integer 1-16"]


def test_an_exported_document_is_its_own_canonical_form():
    doc, = load_file(str(EXAMPLES / "deepseek-v4.1-4gpu.yaml"))
    import yaml
    again, = parse(yaml.safe_dump(doc.entry, sort_keys=False))
    assert again.entry == doc.entry


@pytest.mark.parametrize("extra,message", [
    ("dspark: {speculative_length: 4}\nbackend_parameters: [--dspark-speculative-length=5]\n",
     "backend_parameters[0] (line 5): --dspark-speculative-length is also set by dspark.speculative_length; keep one"),
    ("gpu_selector: {gpu_count: 4}\ndspark: {}\nbackend_parameters: [--tensor-parallel-size=2]\n",
     "gpu_selector.gpu_count (line 4): 4 disagrees with --tensor-parallel-size 2 in backend_parameters; keep one"),
    ("gpu_selector: {gpu_count: 4}\n", "gpu_count is a DSpark shorthand"),
    ("dspark: {device: tpu}\n", "dspark.device (line 4): 'tpu' is not allowed; allowed: cuda|cpu"),
    ("dspark: {device: cpu}\nbackend_version: 0.32.0-cuda-custom\n",
     "backend_version (line 5): '0.32.0-cuda-custom' is not allowed with dspark.device cpu"),
    ("dspark: {worker_label: json}\n", "dspark.worker_label (line 4): 'json' is not KEY=VALUE"),
    ("dspark: {enabled: maybe}\n", "dspark.enabled (line 4): 'maybe' is not allowed; allowed: true|false"),
    ("dspark: {grammar: {shema: x.json}}\n", "dspark.grammar.shema (line 4): unknown grammar setting; did you mean schema?"),
    ("dspark: 6\n", "dspark (line 4): 6 is not allowed; allowed: a mapping of DSpark settings"),
    ("dspark: {}\nbackend_parameters: [--enable-dspark, 7]\n", "backend_parameters[1] (line 5): 7 is not allowed"),
    ("dspark: {}\nbackend_parameters: [--dspark-schema]\n", "--dspark-schema needs a value"),
    ("dspark: {}\nid: 3\n", "id (line 5): id is set by GPUStack and cannot be given"),
    ("dspak: {}\n", "dspak (line 4): unknown field; did you mean dspark?"),
])
def test_specific_errors(extra, message):
    found = errors("name: x\nsource: local_path\nlocal_path: /m\n" + extra)
    assert any(message in e for e in found), found


def test_all_documents_are_checked_and_names_are_unique():
    found = errors("name: a\nsource: local_path\nlocal_path: /m\n---\nname: a\nsource: local_path\n"
                   "local_path: /m\n---\n- a list\n---\nsource: local_path\nlocal_path: /m\n")
    assert found == [
        "m.yaml: document 2 (a): name (line 5): 'a' is already used by document 1; names are unique in GPUStack",
        "m.yaml: document 3: line 9: a model document is a mapping of fields (name: ..., backend: ...), not a list; "
            "several models go in separate documents split by '---', not in a list",
        "m.yaml: document 4: line 11: name is missing; every model needs a name",
    ]


def test_a_plain_gpustack_document_passes_through_untouched():
    doc, = parse("name: chat\nsource: local_path\nlocal_path: /m\nbackend: vLLM\nbackend_parameters: [--max-model-len=4096]\n")
    assert doc.knobs is None and doc.entry == {"name": "chat", "source": "local_path", "local_path": "/m",
                                               "backend": "vLLM", "backend_parameters": ["--max-model-len=4096"]}


def test_the_cpu_demo_file_serves_the_real_model_from_its_cache_link():
    doc, = load_file(str(EXAMPLES / "cpu-demo.yaml"))
    assert doc.name == real_model.SERVED_NAME
    # `~` is the home folder of whoever applies it; the link is resolved to the conversion it names
    assert doc.entry["local_path"] == str((Path.home() / ".cache/gpustack-dspark/models/SmolLM2-135M-Instruct").resolve())
    assert (doc.entry["backend_version"], doc.entry["cpu_offloading"], doc.entry["replicas"]) == (
        backend.CPU_VERSION, True, 2)
    assert doc.entry["backend_parameters"][-4:] == ["--enforce-eager", "--dtype=float32", "--max-model-len=2048",
                                                    "--kv-cache-memory-bytes=268435456"]


def test_the_fixture_demo_file():
    doc, = load_file(str(EXAMPLES / "cpu-demo-fixture.yaml"))
    assert doc.name == "tiny-order"  # served as GPUStack's model name (devstack.replica.SERVED_NAME)
    assert doc.entry["local_path"] == str(REPO / "fixtures" / "models" / "tiny-order-llama")
    assert (doc.entry["backend_version"], doc.entry["cpu_offloading"], doc.entry["replicas"]) == (
        backend.CPU_VERSION, True, 2)
    assert doc.entry["backend_parameters"][-4:] == ["--enforce-eager", "--dtype=float32", "--max-model-len=1024",
                                                    "--kv-cache-memory-bytes=268435456"]


def test_every_example_parses():
    names = [load_file(str(p))[0].name for p in sorted(EXAMPLES.glob("*.yaml"))]
    assert len(names) == 7


def test_the_field_list_is_gpustack_2_3s():
    from gpustack.schemas import deployment_document as dd
    from gpustack.schemas.models import GPUSelector, PlacementStrategyEnum, SourceEnum

    assert list(gpustack_fields.ENTRY_FIELDS) == dd.ENTRY_FIELDS
    assert set(gpustack_fields.SERVER_MANAGED) == set(dd.SERVER_MANAGED_FIELDS)
    assert gpustack_fields.ENTRY_FIELDS["source"] == "enum:" + "|".join(e.value for e in SourceEnum)
    assert gpustack_fields.ENTRY_FIELDS["placement_strategy"] == "enum:" + "|".join(e.value for e in PlacementStrategyEnum)
    assert set(gpustack_fields.GPU_SELECTOR_FIELDS) == set(GPUSelector.model_fields)


def test_bad_input_exits_2_without_contacting_the_server(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nsource: local_path\nlocal_path: /m\nreplica: 2\n")
    closed = ["--server", "http://127.0.0.1:9", "--api-key", "k"]
    assert main(["apply", "-f", str(bad), *closed]) == 2
    assert "replica (line 4): unknown field; did you mean replicas?" in capsys.readouterr().err
    assert main(["apply", "-f", str(tmp_path / "missing.yaml"), *closed]) == 2
    assert "missing.yaml: cannot read the file" in capsys.readouterr().err
    # A valid file does contact the server (here: nobody listens), even for --dry-run.
    bad.write_text("name: x\nsource: local_path\nlocal_path: /m\n")
    assert main(["apply", "-f", str(bad), "--dry-run", *closed]) == 1
    assert "cannot reach GPUStack at http://127.0.0.1:9" in capsys.readouterr().err


# --- the plan ---------------------------------------------------------------------------------

def test_the_plan_reads_gpustacks_dry_run_and_renders_a_diff():
    steps = plan.read_plan({"entries": [
        {"index": 0, "name": "a", "action": "create", "errors": []},
        {"index": 1, "name": "b", "action": "update", "errors": [
            "already exists and is running (replicas=2); stop it before overwriting"],
         "changes": [{"field": "replicas", "current": 2, "desired": 3},
                     {"field": "backend_parameters", "current": ["--x=1", "--y"], "desired": ["--x=2", "--y"]},
                     {"field": "env", "current": None, "desired": {"A": "1"}}]},
        {"index": 2, "name": "c", "action": "unchanged", "errors": ["cluster 'z' not found"]},
    ]})
    assert [(s.index, s.action, s.running, s.errors) for s in steps] == [
        (1, "create", False, []), (2, "update", True, []), (3, "unchanged", False, ["cluster 'z' not found"])]
    assert plan.render_plan(steps) == "\n".join([
        "create a", "update b (running: updated in place)", "  ~ replicas: 2 -> 3", "  ~ backend_parameters:",
        '      - "--x=1"', '      + "--x=2"', "  ~ env:", '      A: (unset) -> "1"', "unchanged c",
        "1 to create, 1 to update, 1 unchanged"])
    assert plan.sparse_update(steps[1].changes) == {"replicas": 3, "backend_parameters": ["--x=2", "--y"],
                                                    "env": {"A": "1"}}
    assert plan.sparse_update(steps[1].changes, desired=False)["replicas"] == 2


def test_categories_gpustack_derived_are_no_change_unless_the_document_sets_them():
    # Seen in CI: the second apply right after a create read GPUStack's freshly derived ["llm"]
    # as a change to undo.
    derived = {"field": "categories", "current": ["llm"], "desired": []}
    steps = plan.read_plan({"entries": [
        {"index": 0, "name": "a", "action": "update", "changes": [derived]},
        {"index": 1, "name": "b", "action": "update", "changes": [derived, {"field": "replicas", "current": 1,
                                                                             "desired": 2}]},
        {"index": 2, "name": "c", "action": "update", "changes": [derived]}]})
    kept = plan.without_derived(steps, {"a": {"name"}, "b": {"name"}, "c": {"name", "categories"}})
    assert [(s.action, [c["field"] for c in s.changes]) for s in kept] == [
        ("unchanged", []), ("update", ["replicas"]), ("update", ["categories"])]


# --- the wait -------------------------------------------------------------------------------

def test_progress_counts_running_and_stops_on_error():
    p = wait.progress({"m": 2}, {"m": [{"state": "running"}, {"state": "starting"}]})
    assert (p.ready, p.wanted, p.detail, p.failure) == (1, 2, "m 1/2 (1 running, 1 starting)", None)
    assert wait.bar(p, width=4) == "[##..] 1/2 warm  m 1/2 (1 running, 1 starting)"
    p = wait.progress({"m": 1}, {"m": [{"name": "m-1", "state": "error", "state_message": "OOM"}]})
    assert p.failure == "m: instance m-1 is in ERROR: OOM"


def test_wait_returns_once_running_and_raises_on_error():
    states = iter([[], [{"state": "starting"}], [{"state": "running"}]])
    out = io.StringIO()
    wait.wait_running(lambda: {"m": next(states)}, {"m": 1}, 60, out=out, interval_s=0)
    assert out.getvalue().splitlines()[-1].startswith("[########################] 1/1 warm")
    with pytest.raises(CLIError, match="is in ERROR: bad schema"):
        wait.wait_running(lambda: {"m": [{"name": "m-1", "state": "error", "state_message": "bad schema"}]},
                          {"m": 1}, 60, out=io.StringIO(), interval_s=0)
    with pytest.raises(CLIError, match="timed out after 0s .* m-1: No suitable workers"):
        wait.wait_running(lambda: {"m": [{"name": "m-1", "state": "pending", "state_message": "No suitable workers"}]},
                          {"m": 1}, 0, out=io.StringIO(), interval_s=0, pending_hint=wait.instance_messages)


# --- status ---------------------------------------------------------------------------------

MODELS = [{"id": 1, "name": "json", "backend": "DSpark-custom", "backend_version": "v", "replicas": 2, "state": "running"},
          {"id": 2, "name": "chat", "backend": "vLLM", "replicas": 1, "state": None}]
INSTANCES = [{"id": 10, "model_id": 1, "name": "json-a", "state": "running", "worker_name": "w"},
             {"id": 11, "model_id": 1, "name": "json-b", "state": "starting", "worker_name": "w"}]


def test_status_without_the_plugins_figures_shows_dashes():
    rows = status.summarize(MODELS, INSTANCES, None)
    assert [(r["name"], r["warm"], r["in_flight"], r["acceptance_rate"], r["state"]) for r in rows] == [
        ("chat", 0, None, None, "no instances"), ("json", 1, None, None, "running")]
    lines = status.table(rows).splitlines()
    assert lines[1].split() == ["chat", "no", "1", "0/1", "no", "instances", "–", "–", "–"]


def test_status_with_in_flight_and_metrics():
    dspark = {"routing": {"in_flight": {"10": 3}},
              "models": {"json": {"acceptance_rate": 0.81, "format_error_rate": 0.0}}}
    row = [r for r in status.summarize(MODELS, INSTANCES, dspark) if r["name"] == "json"][0]
    assert (row["in_flight"], row["acceptance_rate"], row["format_error_rate"]) == (3, 0.81, 0.0)
    assert [i["in_flight"] for i in row["instances"]] == [3, 0]
    assert "81.0%" in status.table([row]) and json.dumps(row)


def test_a_failed_write_rolls_back_the_in_place_updates():
    from gpustack_dspark.cli import apply

    class FakeAPI:
        def __init__(self):
            self.calls = []
            self.row = {"id": 7, "name": "b", "source": "local_path", "local_path": "/m", "backend": "DSpark-custom",
                        "distributed_inference_across_workers": False, "replicas": 2}

        def model(self, name):
            return self.row

        def request(self, method, path, json=None):
            self.calls.append((method, path, json))
            return self.row

        def import_documents(self, content, dry_run, overwrite=()):
            raise CLIError("POST /v2/models/import -> 500: boom")

    docs = parse("name: a\nsource: local_path\nlocal_path: /m\n---\nname: b\nsource: local_path\nlocal_path: /m\n")
    steps = [plan.Step(1, "a", "create"),
             plan.Step(2, "b", "update", [{"field": "replicas", "current": 2, "desired": 3}], running=True)]
    api = FakeAPI()
    with pytest.raises(CLIError) as e:
        apply.write(api, docs, steps)
    assert str(e.value) == "POST /v2/models/import -> 500: boom\nnothing was applied (rolled back: b)"
    puts = [(path, body["replicas"]) for method, path, body in api.calls if method == "PUT"]
    assert puts == [("/v2/models/7", 3), ("/v2/models/7", 2)]  # applied, then put back
    body = [body for method, _, body in api.calls if method == "PUT"][0]
    assert body == {"name": "b", "source": "local_path", "backend": "DSpark-custom",
                    "distributed_inference_across_workers": False, "local_path": "/m", "replicas": 3}


def test_grammar_off_survives_yamls_booleans():
    doc, = parse("name: x\nsource: local_path\nlocal_path: /m\ndspark: {grammar: off}\n")
    assert "--dspark-grammar-mode=off" in doc.entry["backend_parameters"]


def test_every_knob_can_be_written_in_the_dspark_section():
    from gpustack_dspark.cli import modeldoc

    reachable = {v for v in modeldoc._SECTION.values() if v} | set(modeldoc._WARMUP.values()) | {"grammar_mode", "schema"}
    assert reachable == set(knobs.KNOBS_BY_NAME)
