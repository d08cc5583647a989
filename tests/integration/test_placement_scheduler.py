"""The placement policy inside GPUStack 2.3.0's real scheduler, with GPU inventories.

No GPU runs here, so the GPU workers are inventories in GPUStack's own worker schema
(`Worker` / `GPUDeviceStatus`), handed to GPUStack's real `find_candidate` — its filter
chain, its vLLM resource fit, its scorers — running in this process against the real
PostgreSQL database of a real GPUStack server (which migrated it, seeded the built-in
backends and, through the plugin, registered DSpark-custom). Clusters come from that
database too: per-cluster overrides are looked up by name there.
"""

import asyncio
import json

import pytest

pytest.importorskip("gpustack")

from gpustack.config.config import Config  # noqa: E402
from gpustack.policies.resource_view import ResourceView  # noqa: E402
from gpustack.scheduler import scheduler  # noqa: E402
from gpustack.schemas.models import (  # noqa: E402
    ComputedResourceClaim, Model, ModelInstance, ModelInstanceStateEnum,
)
from gpustack.schemas.workers import (  # noqa: E402
    CPUInfo, GPUDeviceStatus, MemoryInfo, SystemReserved, Worker, WorkerStateEnum, WorkerStatus,
)
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402
from sqlmodel.ext.asyncio.session import AsyncSession  # noqa: E402

from gpustack_dspark import backend, versions  # noqa: E402
from gpustack_dspark.placement import gpustack_patches  # noqa: E402
from gpustack_dspark.placement.policy import parse_policy  # noqa: E402
from tests.conftest import admin_api, wait_backend_registered  # noqa: E402

pytestmark = pytest.mark.integration

GiB = 1 << 30
ROLE = ("role", "json-inference")
JSON_LABELS = {"role": "json-inference"}
# A Llama-3-70B-shaped config: ~140 GB of bf16 weights, more than one 80 GB card holds.
LLAMA_70B = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}
# A Llama-3-8B-shaped chat model: ~16 GB of weights, one card.
LLAMA_8B = {**LLAMA_70B, "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
            "num_hidden_layers": 32}


@pytest.fixture(scope="module")
def database(start_server, postgres):
    """A real GPUStack server on the real database; its clusters `main` and `lab`."""
    server = start_server()
    api = admin_api(server)
    wait_backend_registered(server, api.api_key, 90)
    clusters = {name: api.ensure_cluster(name) for name in ("main", "lab")}
    from gpustack.server import db

    engine = create_async_engine(postgres.url.replace("postgresql://", "postgresql+asyncpg://"), poolclass=NullPool)
    saved, db.engine = db.engine, engine  # GPUStack's backend-framework filter reads through it
    yield clusters
    db.engine = saved
    api.close()
    server.stop()


@pytest.fixture
def config(tmp_path):
    return Config(token="t", data_dir=str(tmp_path), database_url="postgresql://u@127.0.0.1:1/db")


def _model_dir(tmp_path, name, shape, weight_bytes):
    path = tmp_path / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(shape))
    with open(path / "model.safetensors", "wb") as weights:  # sparse: sizes the model, takes no disk
        weights.truncate(weight_bytes)
    return str(path)


@pytest.fixture
def big_dir(tmp_path):
    return _model_dir(tmp_path, "llama-70b", LLAMA_70B, 140 * 10**9)


@pytest.fixture
def chat_dir(tmp_path):
    return _model_dir(tmp_path, "llama-8b", LLAMA_8B, 16 * 10**9)


def gpu_worker(worker_id, name, cluster_id, gpus, gib_each, labels=None) -> Worker:
    """A CUDA worker as GPUStack stores it (the shape of GPUStack's own test fixtures)."""
    devices = [
        GPUDeviceStatus(vendor="nvidia", type="cuda", index=i, device_index=i, uuid=f"GPU-{name}-{i}",
                        name="NVIDIA H100 80GB HBM3" if gib_each == 80 else "NVIDIA L40S",
                        runtime_version="12.8",
                        memory=MemoryInfo(total=gib_each * GiB, used=GiB, utilization_rate=0))
        for i in range(gpus)
    ]
    return Worker(
        id=worker_id, name=name, hostname=name, ip="127.0.0.1", ifname="lo", port=10150,
        cluster_id=cluster_id, labels={"os": "linux", "arch": "amd64", **(labels or {})},
        state=WorkerStateEnum.READY, system_reserved=SystemReserved(ram=0, vram=0),
        status=WorkerStatus(cpu=CPUInfo(total=64, utilization_rate=0),
                            memory=MemoryInfo(total=512 * GiB, used=10 * GiB, utilization_rate=0),
                            gpu_devices=devices),
    )


def dspark_model(cluster_id, local_path, **fields):
    return Model(id=1, name="json-extract", source="local_path", local_path=local_path, replicas=1,
                 cluster_id=cluster_id, backend=backend.BACKEND_NAME, backend_version=backend.CUDA_VERSION,
                 **fields)


def chat_model(cluster_id, local_path, **fields):
    return Model(id=2, name="chat", source="local_path", local_path=local_path, replicas=1,
                 cluster_id=cluster_id, backend="vLLM", **fields)


@pytest.fixture
def policy_patch():
    """Apply the plugin's scheduler patches with a given policy; undo them afterwards."""
    def apply(text=""):
        import yaml

        policy = parse_policy(yaml.safe_load(text), ROLE, "placement.yaml")
        assert gpustack_patches.route_gpu_flavour_to_vllm_fit().applied
        result = gpustack_patches.enforce_placement_policy(lambda: policy)
        assert result.applied, result.reason
        return policy

    yield apply
    gpustack_patches.remove_patches()


def running_on(worker: Worker, count: int):
    """Small CPU-side replicas of another model already on `worker`: it is the busier one."""
    return [ModelInstance(id=900 + i, name=f"busy-{i}", model_id=99, model_name="busy", source="local_path",
                          local_path="/models/busy", worker_id=worker.id, worker_name=worker.name,
                          cluster_id=worker.cluster_id, state=ModelInstanceStateEnum.RUNNING,
                          computed_resource_claim=ComputedResourceClaim(ram=GiB, vram={}))
            for i in range(count)]


def place(config, model, workers, instances=()):
    """GPUStack's scheduler entry point (as `_schedule_one` calls it) on a real session."""
    from gpustack.server import db

    async def go():
        async with AsyncSession(db.engine) as session:
            return await scheduler.find_candidate(session, config, model, workers, list(instances),
                                                  resource_view=ResourceView(list(instances)))
    return asyncio.run(go())


def test_dspark_tensor_parallel_model_lands_on_the_four_gpu_json_worker(database, config, policy_patch, big_dir):
    policy_patch()
    main = database["main"]
    json4 = gpu_worker(11, "json-h100x4", main, 4, 80, JSON_LABELS)
    general = gpu_worker(12, "gen-h100x8", main, 8, 80)  # bigger and emptier, but not JSON
    model = dspark_model(main, big_dir, backend_parameters=["--tensor-parallel-size=4"])
    candidate, messages = place(config, model, [general, json4])
    assert candidate is not None, messages
    assert candidate.worker.name == "json-h100x4"
    assert candidate.gpu_indexes == [0, 1, 2, 3]
    assert all(v > 60 * GiB for v in candidate.computed_resource_claim.vram.values())  # vLLM's fit


def test_without_a_json_worker_the_replica_stays_pending_with_the_label_to_set(
        database, config, policy_patch, big_dir):
    policy_patch()
    main = database["main"]
    candidate, messages = place(config, dspark_model(main, big_dir), [gpu_worker(12, "gen-h100x8", main, 8, 80)])
    assert candidate is None
    assert messages[0].startswith("DSpark placement: no worker in this cluster has the label role=json-inference")
    assert "`gpustack-dspark label <worker> role=json-inference`" in messages[0]


def test_json_worker_too_small_says_so_with_gpustacks_own_fit_message(database, config, policy_patch, big_dir):
    policy_patch()
    main = database["main"]
    small_json = gpu_worker(13, "json-l40s", main, 1, 48, JSON_LABELS)
    candidate, messages = place(config, dspark_model(main, big_dir),
                                [small_json, gpu_worker(12, "gen-h100x8", main, 8, 80)])
    assert candidate is None
    assert "only on workers labelled role=json-inference (json-l40s)" in messages[0]
    assert any("requires approximately" in m for m in messages[1:]), messages  # GPUStack's vLLM fit


def test_general_model_never_lands_on_json_workers_even_when_they_are_emptier(
        database, config, policy_patch, chat_dir):
    main = database["main"]
    json4 = gpu_worker(11, "json-h100x4", main, 4, 80, JSON_LABELS)
    general = gpu_worker(14, "gen-h100x2", main, 2, 80)
    busy = running_on(general, 3)
    model = chat_model(main, chat_dir)

    policy_patch("isolation: false")  # control: GPUStack's own choice is the emptier JSON worker
    candidate, messages = place(config, model, [general, json4], busy)
    assert candidate is not None and candidate.worker.name == "json-h100x4", messages

    policy_patch()  # isolation on (the default)
    candidate, messages = place(config, model, [general, json4], busy)
    assert candidate is not None and candidate.worker.name == "gen-h100x2", messages


def test_general_model_that_fits_only_on_json_workers_is_told_isolation_excluded_them(
        database, config, policy_patch, big_dir):
    policy_patch()
    main = database["main"]
    workers = [gpu_worker(14, "gen-l40s", main, 1, 48), gpu_worker(11, "json-h100x4", main, 4, 80, JSON_LABELS)]
    candidate, messages = place(config, chat_model(main, big_dir), workers)
    assert candidate is None
    assert messages[0].startswith("DSpark isolation: this model would fit on json-h100x4, but workers labelled "
                                  "role=json-inference accept only JSON models (backends: DSpark-custom)")


def test_the_models_own_worker_selector_is_honoured(database, config, policy_patch, big_dir):
    policy_patch()
    main = database["main"]
    json_a = gpu_worker(11, "json-a", main, 8, 80, JSON_LABELS)  # emptier
    json_b = gpu_worker(15, "json-b", main, 4, 80, {**JSON_LABELS, "rack": "r2"})
    gen_r2 = gpu_worker(16, "gen-r2", main, 8, 80, {"rack": "r2"})
    candidate, messages = place(config, dspark_model(main, big_dir, worker_selector={"rack": "r2"}),
                                [json_a, json_b, gen_r2])
    assert candidate is not None and candidate.worker.name == "json-b", messages  # both selectors

    # Opt-out: a selector naming the label key itself replaces the JSON label.
    optout = dspark_model(main, big_dir, worker_selector={"role": "general"})
    gen = gpu_worker(17, "gen-general", main, 4, 80, {"role": "general"})
    candidate, messages = place(config, optout, [json_a, gen])
    assert candidate is not None and candidate.worker.name == "gen-general", messages


def test_per_cluster_override_is_found_by_the_clusters_name(database, config, policy_patch, chat_dir):
    policy_patch("clusters:\n  lab:\n    isolation: false\n")
    lab, main = database["lab"], database["main"]
    candidate, messages = place(config, chat_model(lab, chat_dir), [gpu_worker(21, "lab-json", lab, 4, 80, JSON_LABELS)])
    assert candidate is not None and candidate.worker.name == "lab-json", messages
    candidate, messages = place(config, chat_model(main, chat_dir), [gpu_worker(11, "json-h100x4", main, 4, 80, JSON_LABELS)])
    assert candidate is None and messages[0].startswith("DSpark isolation: this model would fit on json-h100x4")


def test_other_gpustack_version_leaves_gpustacks_scheduling_as_it_was(database, config, monkeypatch, chat_dir):
    original = scheduler.find_candidate
    monkeypatch.setattr(versions, "installed_gpustack_version", lambda: "2.4.0")
    result = gpustack_patches.enforce_placement_policy(lambda: None)
    assert not result.applied and result.reason == "GPUStack 2.4.0 is not the supported GPUStack 2.3.0"
    assert scheduler.find_candidate is original
    main = database["main"]
    general = gpu_worker(14, "gen-h100x2", main, 2, 80)
    candidate, _ = place(config, chat_model(main, chat_dir),
                         [general, gpu_worker(11, "json-h100x4", main, 4, 80, JSON_LABELS)], running_on(general, 3))
    assert candidate is not None and candidate.worker.name == "json-h100x4"  # no isolation: GPUStack's choice


def test_a_changed_find_candidate_is_left_alone(monkeypatch):
    async def find_candidate(session, config, model, workers):  # a GPUStack that changed shape
        return None, []

    monkeypatch.setattr(scheduler, "find_candidate", find_candidate)
    result = gpustack_patches.enforce_placement_policy(lambda: None)
    assert not result.applied and "find_candidate takes ['session', 'config', 'model', 'workers']" in result.reason
    assert scheduler.find_candidate is find_candidate
