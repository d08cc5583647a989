"""The scheduler patch, against GPUStack 2.3.0's real `build_candidate_selector`, and a
DSpark CUDA model sized by GPUStack's real vLLM resource fit on a 4-GPU worker (a GPU
inventory described in GPUStack's own schema: no GPU can run here)."""

import asyncio
import json

import pytest

pytest.importorskip("gpustack")

from gpustack.config.config import Config  # noqa: E402
from gpustack.policies.candidate_selectors import VLLMResourceFitSelector  # noqa: E402
from gpustack.policies.candidate_selectors.custom_backend_resource_fit_selector import (  # noqa: E402
    CustomBackendResourceFitSelector,
)
from gpustack.policies.resource_view import ResourceView  # noqa: E402
from gpustack.scheduler import scheduler  # noqa: E402
from gpustack.schemas.inference_backend import InferenceBackend, VersionConfigDict  # noqa: E402
from gpustack.schemas.models import Model  # noqa: E402
from gpustack.schemas.workers import (  # noqa: E402
    CPUInfo, GPUDeviceStatus, MemoryInfo, SystemReserved, Worker, WorkerStateEnum, WorkerStatus,
)

from gpustack_dspark import backend, versions  # noqa: E402
from gpustack_dspark.settings import PluginSettings  # noqa: E402
from gpustack_dspark.placement import gpustack_patches  # noqa: E402


@pytest.fixture
def patched():
    result = gpustack_patches.route_gpu_flavour_to_vllm_fit()
    yield result
    gpustack_patches.remove_patches()


@pytest.fixture
def config(tmp_path):
    return Config(token="t", data_dir=str(tmp_path), database_url="postgresql://u@127.0.0.1:1/db")


def _model(**fields):
    base = dict(name="m", source="local_path", local_path="/models/m", replicas=1)
    return Model(**{**base, **fields})


def _selector(config, model):
    return scheduler.build_candidate_selector(config, model, [], resource_view=ResourceView([]))


def test_dspark_cuda_models_get_vllm_fit_cpu_models_keep_custom_fit(patched, config):
    assert patched.applied, patched.reason
    tp4 = ["--tensor-parallel-size=4"]
    cuda = _model(backend=backend.BACKEND_NAME, backend_version=backend.CUDA_VERSION, backend_parameters=tp4)
    default = _model(backend=backend.BACKEND_NAME, backend_parameters=tp4)
    cpu = _model(backend=backend.BACKEND_NAME, backend_version=backend.CPU_VERSION, cpu_offloading=True)
    other = _model(backend="Other-custom", backend_version="v1-custom")
    assert type(_selector(config, cuda)) is VLLMResourceFitSelector
    assert type(_selector(config, default)) is VLLMResourceFitSelector
    assert type(_selector(config, cpu)) is CustomBackendResourceFitSelector
    assert type(_selector(config, other)) is CustomBackendResourceFitSelector
    # vLLM's fit reads the world size from the DSpark model's own parameters.
    assert VLLMResourceFitSelector.get_world_size_from_backend_parameters(cuda)[0] == 4


def test_without_the_patch_gpustack_uses_custom_fit(config):
    gpustack_patches.remove_patches()
    cuda = _model(backend=backend.BACKEND_NAME, backend_version=backend.CUDA_VERSION)
    assert type(_selector(config, cuda)) is CustomBackendResourceFitSelector


def test_patch_is_idempotent(patched):
    first = scheduler.build_candidate_selector
    assert gpustack_patches.route_gpu_flavour_to_vllm_fit().applied
    assert scheduler.build_candidate_selector is first
    assert gpustack_patches.remove_patches() == ["build_candidate_selector"]
    assert not getattr(scheduler.build_candidate_selector, "_dspark_patched", False)


def test_unexpected_signature_applies_nothing(monkeypatch):
    def build_candidate_selector(config, model):  # a GPUStack that changed shape
        return None

    monkeypatch.setattr(scheduler, "build_candidate_selector", build_candidate_selector)
    result = gpustack_patches.route_gpu_flavour_to_vllm_fit()
    assert not result.applied and "expected" in result.reason
    assert scheduler.build_candidate_selector is build_candidate_selector


def test_other_gpustack_version_applies_nothing(monkeypatch):
    original = scheduler.build_candidate_selector
    monkeypatch.setattr(versions, "installed_gpustack_version", lambda: "2.4.0")
    result = gpustack_patches.route_gpu_flavour_to_vllm_fit()
    assert not result.applied and result.reason == "GPUStack 2.4.0 is not the supported GPUStack 2.3.0"
    assert scheduler.build_candidate_selector is original


GiB = 1 << 30
# A Llama-3-70B-shaped config: ~140 GB of bf16 weights, more than one 80 GB card holds.
LLAMA_70B_SHAPE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
    "intermediate_size": 28672, "num_attention_heads": 64, "num_hidden_layers": 80,
    "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
    "torch_dtype": "bfloat16",
}


def _gpu_worker(gpus: int, gib_each: int) -> Worker:
    devices = [
        GPUDeviceStatus(vendor="nvidia", type="cuda", index=i, device_index=i, uuid=f"GPU-{i}",
                        name="NVIDIA H100 80GB HBM3",
                        memory=MemoryInfo(total=gib_each * GiB, used=GiB, utilization_rate=0))
        for i in range(gpus)
    ]
    return Worker(
        id=1, name=f"json-gpu-{gpus}", hostname="gpu-host", ip="127.0.0.1", ifname="lo", port=10150,
        cluster_id=1, labels={"role": "json-inference"}, state=WorkerStateEnum.READY,
        system_reserved=SystemReserved(ram=0, vram=0),
        status=WorkerStatus(cpu=CPUInfo(total=64, utilization_rate=0),
                            memory=MemoryInfo(total=512 * GiB, used=10 * GiB, utilization_rate=0),
                            gpu_devices=devices),
    )


@pytest.fixture
def big_model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_70B_SHAPE))
    # GPUStack sizes local models by their weight files; a sparse file takes no disk.
    with open(tmp_path / "model.safetensors", "wb") as weights:
        weights.truncate(140 * 10**9)
    return str(tmp_path)


def _candidates(config, model, worker):
    selector = _selector(config, model)
    return selector, asyncio.run(selector.select_candidates([worker]))


def test_tensor_parallel_dspark_model_gets_four_gpus_with_vram_claims(patched, config, big_model_dir):
    model = _model(id=1, local_path=big_model_dir, cluster_id=1, backend=backend.BACKEND_NAME,
                   backend_version=backend.CUDA_VERSION, backend_parameters=["--tensor-parallel-size=4"])
    selector, candidates = _candidates(config, model, _gpu_worker(4, 80))
    assert type(selector) is VLLMResourceFitSelector
    assert [c.gpu_indexes for c in candidates] == [[0, 1, 2, 3]]
    claims = candidates[0].computed_resource_claim.vram
    assert sorted(claims) == [0, 1, 2, 3] and all(v > 60 * GiB for v in claims.values())


def test_vram_fit_picks_the_gpu_count_for_a_dspark_model(patched, config, big_model_dir):
    model = _model(id=1, local_path=big_model_dir, cluster_id=1, backend=backend.BACKEND_NAME,
                   backend_version=backend.CUDA_VERSION)
    _, candidates = _candidates(config, model, _gpu_worker(4, 80))
    # ~156 GiB of weights * 1.2 + overhead needs more than two 80 GiB cards, and vLLM's
    # tensor parallelism must divide the 64 attention heads: four.
    assert [c.gpu_indexes for c in candidates] == [[0, 1, 2, 3]]


def test_vram_fit_refuses_a_worker_too_small(patched, config, big_model_dir):
    model = _model(id=1, local_path=big_model_dir, cluster_id=1, backend=backend.BACKEND_NAME,
                   backend_version=backend.CUDA_VERSION)
    selector, candidates = _candidates(config, model, _gpu_worker(1, 24))
    assert candidates == []
    assert any("The model requires approximately" in m and "GiB of VRAM" in m for m in selector.get_messages())


def test_worker_side_command_carries_the_tensor_parallel_size():
    row = backend.desired_backend(PluginSettings())
    gpustack_row = InferenceBackend(**{**row, "version_configs": VersionConfigDict.model_validate(row["version_configs"])})
    command = gpustack_row.replace_command_param(
        version=backend.CUDA_VERSION, model_path="/models/m", port=40000, worker_ip="10.0.0.5",
        model_name="big-json", gpu_count=4, gpu_ids=[0, 1, 2, 3])
    assert command == ("/models/m --host 10.0.0.5 --port 40000 --served-model-name big-json "
                       "--tensor-parallel-size 4")
    assert gpustack_row.get_container_entrypoint(backend.CUDA_VERSION) == ["dspark-serve"]
    assert gpustack_row.get_image_name(backend.CPU_VERSION) == (
        PluginSettings().cpu_image, backend.CPU_VERSION)

