import copy

from gpustack_dspark import backend, knobs
from gpustack_dspark.backend import CPU_VERSION, CUDA_VERSION, desired_backend, merge_backend
from gpustack_dspark.settings import PluginSettings

SETTINGS = PluginSettings(cuda_image="reg.example.com/dspark:1-cuda", cpu_image="localhost/dspark:1-cpu")


def test_desired_backend_has_both_flavours_and_the_knobs():
    row = desired_backend(SETTINGS)
    assert row["backend_name"].endswith("-custom")
    assert set(row["version_configs"]) == {CUDA_VERSION, CPU_VERSION}
    assert all(v.endswith("-custom") for v in row["version_configs"])
    cuda, cpu = row["version_configs"][CUDA_VERSION], row["version_configs"][CPU_VERSION]
    assert (cuda["custom_framework"], cpu["custom_framework"]) == ("cuda", "cpu")
    assert (cuda["image_name"], cpu["image_name"]) == (SETTINGS.cuda_image, SETTINGS.cpu_image)
    assert "--tensor-parallel-size {{gpu_count}}" in cuda["run_command"]
    assert "tensor-parallel" not in cpu["run_command"]
    for command in (cuda["run_command"], cpu["run_command"]):
        assert command.startswith("{{model_path}}")
        assert "--host {{worker_ip}}" in command and "--port {{port}}" in command
    assert row["health_check_path"] == backend.HEALTH_CHECK_PATH
    assert "--enable-dspark" in row["default_backend_param"]
    assert "--dspark-grammar-mode=json" in row["default_backend_param"]
    for flag in ("--dspark-speculative-length", "--dspark-accept-threshold", "--max-num-seqs"):
        assert flag in row["common_parameters"]


def test_knob_flags_are_unique_and_named_for_dspark():
    flags = knobs.knob_flags()
    assert len(flags) == len(set(flags))
    assert all(f == "--enable-dspark" or f.startswith("--dspark-") for f in flags)
    assert not set(flags) & set(knobs.VLLM_TUNING_FLAGS)


def test_create_when_missing():
    merged, changed = merge_backend(None, desired_backend(SETTINGS))
    assert merged == desired_backend(SETTINGS)
    assert "version_configs" in changed


def test_unchanged_row_needs_no_write():
    row = desired_backend(SETTINGS)
    merged, changed = merge_backend(copy.deepcopy(row), row)
    assert changed == [] and merged == row


def test_user_edits_survive():
    existing = desired_backend(SETTINGS)
    existing["version_configs"]["mine-custom"] = {"image_name": "me/x:1", "custom_framework": "cuda"}
    existing["default_backend_param"] = ["--enable-dspark", "--dspark-speculative-length=8"]
    existing["common_parameters"] = ["--my-flag"] + existing["common_parameters"]
    existing["description"] = "ours"
    existing["default_version"] = "mine-custom"
    existing["version_configs"][CPU_VERSION]["env"] = {"OMP_NUM_THREADS": "2"}
    merged, changed = merge_backend(copy.deepcopy(existing), desired_backend(SETTINGS))
    assert changed == []
    assert merged == existing


def test_new_image_flag_updates_only_that_version():
    existing = desired_backend(SETTINGS)
    existing["version_configs"]["mine-custom"] = {"image_name": "me/x:1"}
    new = PluginSettings(cuda_image=SETTINGS.cuda_image, cpu_image="localhost/dspark:2-cpu")
    merged, changed = merge_backend(copy.deepcopy(existing), desired_backend(new))
    assert changed == [f"version_configs.{CPU_VERSION}"]
    assert merged["version_configs"][CPU_VERSION]["image_name"] == "localhost/dspark:2-cpu"
    assert merged["version_configs"][CUDA_VERSION] == existing["version_configs"][CUDA_VERSION]
    assert merged["version_configs"]["mine-custom"] == {"image_name": "me/x:1"}


def test_owned_fields_are_put_back():
    existing = desired_backend(SETTINGS)
    existing["health_check_path"] = "/v1/models"
    del existing["version_configs"][CUDA_VERSION]
    existing["default_version"] = CUDA_VERSION
    existing["common_parameters"] = ["--max-num-seqs"]
    merged, changed = merge_backend(copy.deepcopy(existing), desired_backend(SETTINGS))
    assert merged["health_check_path"] == backend.HEALTH_CHECK_PATH
    assert merged["version_configs"][CUDA_VERSION] == desired_backend(SETTINGS)["version_configs"][CUDA_VERSION]
    assert merged["common_parameters"][0] == "--max-num-seqs"
    assert set(desired_backend(SETTINGS)["common_parameters"]) <= set(merged["common_parameters"])
    assert set(changed) == {"health_check_path", f"version_configs.{CUDA_VERSION}", "common_parameters"}
