import argparse

import pytest

from gpustack_dspark import settings
from gpustack_dspark.settings import (
    PluginSettings, add_start_flags, command_line_values, parse_image, parse_label, parse_switch,
    resolve_settings, settings_from_config, settings_to_config,
)


def settings_from_namespace(args, config_file=None):
    return resolve_settings(command_line_values(args), config_file or {})


@pytest.mark.parametrize("text,expected", [
    ("role=json-inference", ("role", "json-inference")),
    ("example.com/pool=json.a_1", ("example.com/pool", "json.a_1")),
])
def test_parse_label_accepts_kubernetes_style_labels(text, expected):
    assert parse_label(text) == expected


@pytest.mark.parametrize("text,fragment", [
    ("role", "is not KEY=VALUE"),
    ("=json", "label key ''"),
    ("role=", "label value ''"),
    ("ro le=json", "label key 'ro le'"),
    ("role=json inference", "label value 'json inference'"),
    ("role=" + "x" * 64, "at most 63"),
])
def test_parse_label_rejects_with_the_bad_part_named(text, fragment):
    with pytest.raises(ValueError) as e:
        parse_label(text)
    assert fragment in str(e.value)


@pytest.mark.parametrize("image", [
    "gpustack-dspark-worker:0.1.0-cpu",
    "localhost/gpustack-dspark-worker:cpu-0123abcd",
    "registry.example.com:5000/team/dspark:1.0",
])
def test_parse_image_accepts_references(image):
    assert parse_image(image) == image


@pytest.mark.parametrize("image", ["", "Has Space:1", "UPPER/case:1", "img:tag with space"])
def test_parse_image_rejects(image):
    with pytest.raises(ValueError, match="is not a container image reference"):
        parse_image(image)


def test_parse_switch():
    assert parse_switch("Yes") is True and parse_switch("0") is False
    with pytest.raises(ValueError, match="is not a boolean"):
        parse_switch("maybe")


def _parser(environ=None):
    parser = argparse.ArgumentParser(prog="gpustack start")
    add_start_flags(parser, environ=environ or {})
    return parser


def test_flags_default_and_round_trip_through_config():
    args = _parser().parse_args([])
    parsed = settings_from_namespace(args)
    assert parsed == PluginSettings()
    config = settings_to_config(parsed)
    assert config["dspark_json_label"] == "role=json-inference"

    class Cfg:  # GPUStack's Config carries extra keys as attributes
        pass

    cfg = Cfg()
    for key, value in config.items():
        setattr(cfg, key, value)
    assert settings_from_config(cfg, environ={}) == parsed


def test_flags_parse_given_values():
    args = _parser().parse_args(["--dspark-json-label", "pool=json", "--dspark-cpu-image",
                                 "localhost/w:cpu", "--dspark-disable"])
    parsed = settings_from_namespace(args)
    assert parsed.json_label == ("pool", "json")
    assert parsed.cpu_image == "localhost/w:cpu"
    assert parsed.disabled is True


@pytest.mark.parametrize("argv,flag", [
    (["--dspark-json-label", "nolabel"], "--dspark-json-label"),
    (["--dspark-cuda-image", "Bad Image"], "--dspark-cuda-image"),
])
def test_malformed_flag_fails_at_parse_time_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert flag in err and argv[1] in err


def test_environment_supplies_defaults():
    args = _parser({"GPUSTACK_DSPARK_JSON_LABEL": "tier=json", "GPUSTACK_DSPARK_DISABLE": "yes"}).parse_args([])
    parsed = settings_from_namespace(args)
    assert parsed.json_label == ("tier", "json") and parsed.disabled is True
    # the command line wins over the environment
    args = _parser({"GPUSTACK_DSPARK_JSON_LABEL": "tier=json"}).parse_args(["--dspark-json-label", "a=b"])
    assert settings_from_namespace(args).json_label == ("a", "b")


def test_bad_environment_fails_only_when_parsing_and_names_the_variable(capsys):
    parser = _parser({"GPUSTACK_DSPARK_JSON_LABEL": "nolabel"})  # building the parser is fine
    with pytest.raises(SystemExit):
        parser.parse_args([])
    err = capsys.readouterr().err
    assert "argument --dspark-json-label: 'nolabel' is not KEY=VALUE" in err
    assert "(from GPUSTACK_DSPARK_JSON_LABEL)" in err
    args = _parser({"GPUSTACK_DSPARK_DISABLE": "perhaps"}).parse_args([])
    with pytest.raises(ValueError, match="environment variable GPUSTACK_DSPARK_DISABLE: 'perhaps' is not a boolean"):
        settings_from_namespace(args)


def test_config_file_keys_apply_under_flags_and_environment():
    config_file = {"dspark_json_label": "pool=json", "dspark_cpu_image": "localhost/a:1", "dspark_disable": True}
    assert settings_from_namespace(_parser().parse_args([]), config_file) == PluginSettings(
        json_label=("pool", "json"), cpu_image="localhost/a:1", disabled=True)
    args = _parser({"GPUSTACK_DSPARK_CPU_IMAGE": "localhost/env:1"}).parse_args(["--dspark-json-label", "x=y"])
    merged = settings_from_namespace(args, config_file)
    assert (merged.json_label, merged.cpu_image) == (("x", "y"), "localhost/env:1")


@pytest.mark.parametrize("config_file,message", [
    ({"dspark_json_label": "nolabel"}, "config file key dspark_json_label: 'nolabel' is not KEY=VALUE"),
    ({"dspark_cuda_image": 42}, "config file key dspark_cuda_image: expected a string, got 42"),
    ({"dspark_disable": "perhaps"}, "config file key dspark_disable: 'perhaps' is not a boolean"),
])
def test_bad_config_file_values_name_the_key(config_file, message):
    with pytest.raises(ValueError) as e:
        settings_from_namespace(_parser().parse_args([]), config_file)
    assert message in str(e.value)


def test_config_without_plugin_keys_falls_back_to_environment():
    parsed = settings_from_config(object(), environ={settings.FLAG_CPU_IMAGE.env: "localhost/x:1"})
    assert parsed.cpu_image == "localhost/x:1"
    assert parsed.json_label == ("role", "json-inference")


def test_image_list_follows_the_environment_and_survives_bad_values():
    from gpustack_dspark.settings import DEFAULT_CUDA_IMAGE, images_from_environment

    assert images_from_environment({settings.FLAG_CPU_IMAGE.env: "localhost/w:cpu"}) == (
        DEFAULT_CUDA_IMAGE, "localhost/w:cpu")
    assert images_from_environment({settings.FLAG_CUDA_IMAGE.env: "Not An Image"})[0] == DEFAULT_CUDA_IMAGE
