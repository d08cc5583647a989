from gpustack_dspark import backend
from gpustack_dspark.placement.flavour import is_dspark_model, uses_gpu_flavour
from gpustack_dspark.versions import VersionCheck


def test_version_check_reasons():
    assert VersionCheck("GPUStack", "2.3.0", "2.3.0").ok
    bad = VersionCheck("GPUStack", "2.2.1", "2.3.0")
    assert not bad.ok and bad.reason == "GPUStack 2.2.1 is not the supported GPUStack 2.3.0"
    missing = VersionCheck("GPUStack", None, "2.3.0")
    assert not missing.ok and "not installed" in missing.reason


def test_flavour():
    assert is_dspark_model(backend.BACKEND_NAME) and not is_dspark_model("vLLM")
    assert uses_gpu_flavour(backend.BACKEND_NAME, backend.CUDA_VERSION)
    assert uses_gpu_flavour(backend.BACKEND_NAME, None)  # the default version is CUDA
    assert not uses_gpu_flavour(backend.BACKEND_NAME, backend.CPU_VERSION)
    assert not uses_gpu_flavour(backend.BACKEND_NAME, "mine-custom")
    assert not uses_gpu_flavour("vLLM", backend.CUDA_VERSION)
