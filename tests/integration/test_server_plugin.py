"""The plugin inside a real GPUStack 2.3.0 server on a real PostgreSQL."""

import httpx
import psutil
import pytest

from gpustack_dspark import backend, knobs
from tests.conftest import admin_api, dspark_status, wait_for, wait_backend_registered

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(start_server):
    server = start_server()
    api = admin_api(server)
    key = api.api_key
    wait_backend_registered(server, key, 60)
    yield server, api, key
    api.close()


def _dspark_row(api):
    rows = [b for b in api.items("/v2/inference-backends") if b["backend_name"] == backend.BACKEND_NAME]
    assert len(rows) == 1, f"expected exactly one {backend.BACKEND_NAME} row, got {len(rows)}"
    return api.get(f"/v2/inference-backends/{rows[0]['id']}")


def test_gpustack_log_shows_the_plugin_loaded(stack):
    server, _, _ = stack
    log = server.log_path.read_text()
    assert "Loaded extension plugin: dspark" in log
    assert "gpustack-dspark 0.1.0 loaded: JSON worker label role=json-inference" in log


def test_status_needs_gpustack_authentication(stack):
    server, _, key = stack
    url = f"{server.url}/v2/dspark/status"
    assert httpx.get(url).status_code == 401
    assert httpx.get(url, headers={"Authorization": "Bearer gpustack_nope_nope"}).status_code == 401
    assert httpx.get(url, headers={"Authorization": f"Bearer {key}"}).status_code == 200


def test_status_reports_versions_backend_and_features(stack):
    server, api, key = stack
    status = dspark_status(server, key)
    assert status["plugin"] == {"name": "gpustack-dspark", "version": "0.1.0"}
    assert status["gpustack"] == {"version": "2.3.0", "supported_version": "2.3.0", "supported": True}
    assert status["backend"]["name"] == backend.BACKEND_NAME
    assert status["backend"]["id"] == _dspark_row(api)["id"]
    assert set(status["backend"]["versions"]) == {backend.CUDA_VERSION, backend.CPU_VERSION}
    assert status["features"]["status_api"]["state"] == "enabled"
    assert status["features"]["backend_registration"]["state"] == "enabled"
    assert status["features"]["vllm_resource_fit"]["state"] == "enabled"


def test_backend_row_carries_versions_knobs_and_the_warmup_gate(stack):
    _, api, _ = stack
    row = _dspark_row(api)
    assert row["health_check_path"] == "/dspark/ready"
    assert row["backend_source"] == "custom" and row["is_built_in"] is False
    configs = row["version_configs"]
    assert configs[backend.CUDA_VERSION]["custom_framework"] == "cuda"
    assert configs[backend.CPU_VERSION]["custom_framework"] == "cpu"
    assert configs[backend.CPU_VERSION]["image_name"] == "gpustack-dspark-worker:0.1.0-cpu"
    assert configs[backend.CPU_VERSION]["entrypoint"] == "dspark-serve"
    assert row["default_backend_param"] == list(knobs.form_defaults())
    assert set(knobs.knob_flags()) <= set(row["common_parameters"])

    # What GPUStack's deploy form reads.
    listed = {b["backend_name"]: b for b in api.get("/v2/inference-backends/list")["items"]}
    form = listed[backend.BACKEND_NAME]
    assert {v["version"] for v in form["versions"]} >= {backend.CUDA_VERSION, backend.CPU_VERSION}
    assert "--enable-dspark" in form["default_backend_param"]
    assert "--dspark-accept-threshold" in form["common_parameters"]


def test_gpustack_client_sees_the_backend(stack):
    server, api, key = stack
    from gpustack.client import ClientSet

    client = ClientSet(base_url=server.url, api_key=key)
    names = [b.backend_name for b in client.inference_backends.list(params={"page": 1, "perPage": 100}).items]
    assert names.count(backend.BACKEND_NAME) == 1


def _listening_addresses(pid):
    root = psutil.Process(pid)
    addresses = set()
    for proc in [root, *root.children(recursive=True)]:
        try:
            for conn in proc.net_connections(kind="inet"):
                if conn.status == psutil.CONN_LISTEN:
                    addresses.add((proc.pid, conn.laddr.ip, conn.laddr.port))
        except psutil.NoSuchProcess:
            pass
    return addresses


def test_cpu_worker_joins_and_a_dspark_cpu_model_schedules_on_it(stack, cpu_worker_factory, tmp_path):
    server, api, _ = stack
    worker = cpu_worker_factory(api, server, "json-cpu-1", labels={"role": "json-inference"})
    row = api.get(f"/v2/workers/{worker.id}")
    assert row["labels"]["role"] == "json-inference"
    assert not (row.get("status") or {}).get("gpu_devices")  # a CPU-only worker

    # Nothing of the stack listens beyond loopback.
    for proc in (server.process, worker.process):
        addresses = _listening_addresses(proc.pid)
        assert addresses, "expected listening sockets"
        assert {ip for _, ip, _ in addresses} <= {"127.0.0.1", "::1"}, addresses

    model_dir = tmp_path / "tiny-json"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(
        '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,'
        ' "intermediate_size": 512, "num_attention_heads": 4, "num_hidden_layers": 4,'
        ' "num_key_value_heads": 4, "vocab_size": 2048, "max_position_embeddings": 1024}')
    model = api.post("/v2/models", {
        "name": "tiny-json", "source": "local_path", "local_path": str(model_dir),
        "backend": backend.BACKEND_NAME, "backend_version": backend.CPU_VERSION,
        "cpu_offloading": True, "replicas": 1, "cluster_id": row["cluster_id"],
        "worker_selector": {"role": "json-inference"},
        "backend_parameters": list(knobs.form_defaults()),
    })

    def placed():
        instances = [i for i in api.items("/v2/model-instances") if i["model_id"] == model["id"]]
        return instances and instances[0]["worker_id"] == worker.id and instances[0]

    instance = wait_for(placed, 90, "the DSpark CPU replica to be placed")
    assert instance["state"] != "pending"
    api.client.delete(f"/v2/models/{model['id']}")


def test_restarts_neither_duplicate_nor_clobber(stack, start_server):
    server, api, key = stack
    before = _dspark_row(api)

    other = api.post("/v2/inference-backends", {
        "backend_name": "Other-custom", "health_check_path": "/health",
        "default_backend_param": ["--x=1"],
        "version_configs": {"v1-custom": {"image_name": "example.com/other:1", "custom_framework": "cpu"}},
    })
    edited_versions = dict(before["version_configs"])
    edited_versions["mine-custom"] = {"image_name": "example.com/mine:1", "custom_framework": "cuda"}
    user_params = ["--enable-dspark", "--dspark-speculative-length=8"]
    response = api.client.put(f"/v2/inference-backends/{before['id']}", json={
        **{k: before[k] for k in ("backend_name", "health_check_path", "default_version",
                                  "common_parameters", "parameter_format", "description")},
        "version_configs": edited_versions, "default_backend_param": user_params,
    })
    assert response.status_code == 200, response.text
    edited = _dspark_row(api)
    other_before = api.get(f"/v2/inference-backends/{other['id']}")

    # Restart with the same settings: nothing is written.
    server.stop()
    server.start()
    api2 = admin_api(server)
    wait_backend_registered(server, key, 60, "the backend registration after restart")
    assert dspark_status(server, key)["backend"]["last_registration"] == "unchanged"
    after = _dspark_row(api2)
    assert after["id"] == before["id"]
    assert after["updated_at"] == edited["updated_at"]
    assert after["default_backend_param"] == user_params
    assert after["version_configs"]["mine-custom"]["image_name"] == "example.com/mine:1"
    assert api2.get(f"/v2/inference-backends/{other['id']}") == other_before

    # Restart with a new CPU image: only that version changes.
    server.stop()
    server.extra_args = ["--dspark-cpu-image", "localhost/dspark-worker:cpu-test"]
    server.start()
    api3 = admin_api(server)
    wait_for(lambda: dspark_status(server, key)["backend"].get("last_registration") == "updated",
             60, "the backend update after restart")
    changed = _dspark_row(api3)
    assert changed["id"] == before["id"]
    assert changed["version_configs"][backend.CPU_VERSION]["image_name"] == "localhost/dspark-worker:cpu-test"
    assert changed["version_configs"][backend.CUDA_VERSION] == after["version_configs"][backend.CUDA_VERSION]
    assert changed["version_configs"]["mine-custom"] == after["version_configs"]["mine-custom"]
    assert changed["default_backend_param"] == user_params
    assert api3.get(f"/v2/inference-backends/{other['id']}") == other_before
    api2.close()
    api3.close()
