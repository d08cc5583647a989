"""The scheduler patch, against GPUStack 2.3.0's real `build_candidate_selector`."""

import pytest

pytest.importorskip("gpustack")

from gpustack.config.config import Config  # noqa: E402
from gpustack.policies.candidate_selectors import VLLMResourceFitSelector  # noqa: E402
from gpustack.policies.candidate_selectors.custom_backend_resource_fit_selector import (  # noqa: E402
    CustomBackendResourceFitSelector,
)
from gpustack.policies.resource_view import ResourceView  # noqa: E402
from gpustack.scheduler import scheduler  # noqa: E402
from gpustack.schemas.models import Model  # noqa: E402

from gpustack_dspark import backend, versions  # noqa: E402
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
