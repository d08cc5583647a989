"""The placement policy in a real GPUStack 2.3.0 server with real CPU workers, on a real
PostgreSQL; models created through GPUStack's API; labels set with `gpustack-dspark label`."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from gpustack_dspark import backend, knobs
from gpustack_dspark.devstack.worker import join_cpu_worker
from tests.conftest import admin_api, dspark_status, wait_for, wait_backend_registered

pytestmark = pytest.mark.integration

POLICY = "isolation: true\nclusters:\n  open:\n    isolation: false\n"
TINY = ('{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,'
        ' "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 4,'
        ' "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 1024}')


def _cli(server, key, *argv):
    env = {**os.environ, "GPUSTACK_API_KEY": key}
    env.pop("GPUSTACK_SERVER_URL", None)
    return subprocess.run([sys.executable, "-m", "gpustack_dspark.cli.main", *argv, "--server", server.url],
                          env=env, capture_output=True, text=True, timeout=60)


def _model_dir(base, name):
    path = base / name
    path.mkdir()
    (path / "config.json").write_text(TINY)
    return str(path)


def _plain_backend(api):
    """A general (non-JSON) backend that can run on CPU workers."""
    api.post("/v2/inference-backends", {
        "backend_name": "Plain-custom", "health_check_path": "/health",
        "version_configs": {"v1-custom": {"image_name": "localhost/plain:1", "custom_framework": "cpu"}},
    })


def _create(api, base, name, cluster_id, backend_name, version, replicas=1, **extra):
    return api.post("/v2/models", {
        "name": name, "source": "local_path", "local_path": _model_dir(base, name),
        "backend": backend_name, "backend_version": version, "cpu_offloading": True,
        "replicas": replicas, "cluster_id": cluster_id, **extra,
    })


def _instances(api, model):
    return [i for i in api.items("/v2/model-instances") if i["model_id"] == model["id"]]


def _ready(api, *workers):
    """Waits until GPUStack holds every worker READY: its syncer marks a worker UNREACHABLE
    for a while when a health check times out on a loaded 2-core machine (seen in CI)."""
    for worker in workers:
        api.wait_worker_ready(worker.name, 180)


def _placed(api, model, count=1, timeout_s=400):
    # GPUStack schedules an instance when it is created and then every 180 s (its scheduler's
    # check interval): a worker marked UNREACHABLE at creation leaves the instance pending until
    # the first pass after it is READY again, up to two intervals later (a clean-clone CI run
    # placed it 200.5 s after creation, 3 s after a 200 s wait gave up).
    return wait_for(lambda: (found := [i for i in _instances(api, model) if i["worker_id"]])
                    and len(found) >= count and found, timeout_s, f"{model['name']} to be placed")


@pytest.fixture(scope="module")
def stack(start_server, tmp_path_factory):
    policies = tmp_path_factory.mktemp("policies")
    (policies / "placement.yaml").write_text(POLICY)
    server = start_server(extra_args=["--dspark-policy-dir", str(policies)])
    api = admin_api(server)
    wait_backend_registered(server, api.api_key, 90)
    base = tmp_path_factory.mktemp("workers")
    workers = {}
    try:
        # Both join at once (a join is mostly the worker's own start-up, waited on), into the
        # cluster made first, so that the two joins do not both create it.
        api.ensure_cluster("dspark-local")
        with ThreadPoolExecutor(2) as pool:
            joining = {"json": pool.submit(join_cpu_worker, api, server.url, "json-cpu", base / "json-cpu",
                                           labels={"role": "json-inference"}),
                       "gen": pool.submit(join_cpu_worker, api, server.url, "gen-cpu", base / "gen-cpu")}
            failures = []
            for role, future in joining.items():
                try:
                    workers[role] = future.result()
                except Exception as e:  # the other worker is still stopped below
                    failures.append(e)
        if failures:
            raise failures[0]
        _plain_backend(api)
        yield server, api, workers, tmp_path_factory.mktemp("models")
    finally:
        for worker in workers.values():
            worker.stop()
        api.close()
        server.stop()


def test_status_reports_the_policy_file(stack):
    server, api, _, _ = stack
    feature = dspark_status(server, api.api_key)["features"]["placement_policy"]
    assert feature["state"] == "enabled"
    detail = feature["detail"]
    assert detail["source"].endswith("placement.yaml")
    assert (detail["json_label"], detail["isolation"], detail["json_backends"]) == (
        "role=json-inference", True, [backend.BACKEND_NAME])
    assert detail["clusters"] == {"open": {"json_label": "role=json-inference", "isolation": False,
                                           "json_backends": [backend.BACKEND_NAME]}}


def test_dspark_model_goes_to_the_json_worker_and_a_general_model_never_does(stack):
    _, api, workers, models = stack
    cluster_id = api.get(f"/v2/workers/{workers['json'].id}")["cluster_id"]
    _ready(api, workers["json"], workers["gen"])
    dspark = _create(api, models, "tiny-json", cluster_id, backend.BACKEND_NAME, backend.CPU_VERSION,
                     backend_parameters=list(knobs.form_defaults()))
    general = _create(api, models, "tiny-chat", cluster_id, "Plain-custom", "v1-custom", replicas=2)
    assert [i["worker_id"] for i in _placed(api, dspark)] == [workers["json"].id]
    # Two replicas with GPUStack's spread placement: without isolation one would take the
    # idle JSON worker.
    assert [i["worker_id"] for i in _placed(api, general, count=2)] == [workers["gen"].id] * 2
    for model in (dspark, general):
        api.client.delete(f"/v2/models/{model['id']}")


def test_label_cli_round_trip_and_the_pending_message(stack):
    server, api, workers, models = stack
    key = api.api_key
    json_id = workers["json"].id

    removed = _cli(server, key, "label", "json-cpu", "--remove", "role")
    assert removed.returncode == 0, removed.stderr
    assert "role" not in api.get(f"/v2/workers/{json_id}")["labels"]
    assert removed.stdout.startswith(f"json-cpu (id {json_id}): ")

    cluster_id = api.get(f"/v2/workers/{json_id}")["cluster_id"]
    model = _create(api, models, "tiny-json-2", cluster_id, backend.BACKEND_NAME, backend.CPU_VERSION)
    pending = wait_for(lambda: (i := _instances(api, model)) and "DSpark placement" in (i[0]["state_message"] or "")
                       and i[0], 90, "the pending message")
    assert pending["state"] == "pending" and pending["worker_id"] is None
    assert "no worker in this cluster has the label role=json-inference" in pending["state_message"]
    assert "gpustack-dspark label <worker> role=json-inference" in pending["state_message"]
    api.client.delete(f"/v2/models/{model['id']}")

    added = _cli(server, key, "label", str(json_id), "role=json-inference", "tier=a")
    assert added.returncode == 0, added.stderr
    labels = api.get(f"/v2/workers/{json_id}")["labels"]
    assert labels["role"] == "json-inference" and labels["tier"] == "a"
    both = _cli(server, key, "label", "json-cpu", "tier=b", "--remove", "tier2")
    assert both.returncode == 0 and "tier=b" in both.stdout

    unknown = _cli(server, key, "label", "nope", "role=json-inference")
    assert unknown.returncode == 1
    assert f"no worker named or numbered 'nope'; known workers: " in unknown.stderr
    assert f"json-cpu (id {json_id})" in unknown.stderr and "gen-cpu (id" in unknown.stderr
    malformed = _cli(server, key, "label", "json-cpu", "role")
    assert malformed.returncode == 1 and "'role' is not KEY=VALUE" in malformed.stderr
    denied = _cli(server, "gpustack_nope_nope", "label", "json-cpu", "role=x")
    assert denied.returncode == 1 and "rejected the API key (401)" in denied.stderr


def test_bad_policy_file_turns_off_placement_only(stack, start_server, tmp_path):
    stack[0].stop()  # the next server resets the shared database
    (tmp_path / "placement.yaml").write_text("isolation: maybe\n")
    server = start_server(extra_args=["--dspark-policy-dir", str(tmp_path)])
    api = admin_api(server)
    features = wait_for(lambda: (f := dspark_status(server, api.api_key)["features"])
                        ["backend_registration"]["state"] == "enabled" and f, 90, "the backend registration")
    placement = features["placement_policy"]
    assert placement["state"] == "disabled"
    assert f"{tmp_path}/placement.yaml: key 'isolation': Input should be a valid boolean (got 'maybe')" \
        == placement["reason"]
    assert features["vllm_resource_fit"]["state"] == "enabled"
    assert httpx.get(f"{server.url}/healthz", timeout=5).status_code == 200
    server.stop()


def test_other_gpustack_version_disables_placement_and_gpustack_still_schedules(start_server, tmp_path):
    server = start_server(fault="gpustack-version")
    api = admin_api(server)
    placement = dspark_status(server, api.api_key)["features"]["placement_policy"]
    assert placement == {"state": "disabled", "reason": "GPUStack 2.2.0 is not the supported GPUStack 2.3.0"}
    worker = join_cpu_worker(api, server.url, "json-only", tmp_path / "w", labels={"role": "json-inference"})
    try:
        _plain_backend(api)
        _ready(api, worker)
        model = _create(api, tmp_path, "chat", api.get(f"/v2/workers/{worker.id}")["cluster_id"],
                        "Plain-custom", "v1-custom")
        assert [i["worker_id"] for i in _placed(api, model)] == [worker.id]  # no isolation without the plugin
    finally:
        worker.stop()
        server.stop()
