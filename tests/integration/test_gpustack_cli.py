"""The plugin as GPUStack's own command line sees it (real `gpustack` CLI processes)."""

import subprocess

import pytest

from gpustack_dspark.devstack.processes import loopback_env, venv_bin

pytestmark = pytest.mark.integration


def _gpustack(*argv, env_extra=None):
    env = {**loopback_env(), **(env_extra or {})}
    return subprocess.run([venv_bin("gpustack"), *argv], env=env, capture_output=True, text=True, timeout=180)


def test_start_help_lists_the_plugin_flags():
    done = _gpustack("start", "--help")
    assert done.returncode == 0
    for flag in ("--dspark-json-label", "--dspark-cuda-image", "--dspark-cpu-image", "--dspark-disable"):
        assert flag in done.stdout


def test_malformed_flag_stops_gpustack_start_at_parse_time(tmp_path):
    done = _gpustack("start", "--data-dir", str(tmp_path), "--dspark-json-label", "json-inference")
    assert done.returncode == 2
    assert "error: argument --dspark-json-label: 'json-inference' is not KEY=VALUE" in done.stderr


def test_image_list_names_the_dspark_worker_images():
    done = _gpustack("list-images", env_extra={"GPUSTACK_DSPARK_CPU_IMAGE": "localhost/dspark-worker:cpu-x"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "gpustack-dspark-worker:0.1.0-cuda" in done.stdout
    assert "localhost/dspark-worker:cpu-x" in done.stdout


def test_bad_environment_value_stops_start_only(tmp_path):
    bad = {"GPUSTACK_DSPARK_JSON_LABEL": "json-inference"}
    version = _gpustack("version", env_extra=bad)
    assert version.returncode == 0, version.stderr[-2000:]
    start = _gpustack("start", "--data-dir", str(tmp_path), env_extra=bad)
    assert start.returncode == 2
    assert ("error: argument --dspark-json-label: 'json-inference' is not KEY=VALUE "
            "(for example role=json-inference) (from GPUSTACK_DSPARK_JSON_LABEL)") in start.stderr


def test_bad_config_file_value_stops_start_naming_the_key(tmp_path):
    config = tmp_path / "gpustack.yaml"
    config.write_text("dspark_json_label: json-inference\n")
    done = _gpustack("start", "--config-file", str(config), "--data-dir", str(tmp_path / "data"))
    assert done.returncode != 0
    output = done.stdout + done.stderr
    assert "config file key dspark_json_label: 'json-inference' is not KEY=VALUE" in output
