"""The plugin's `gpustack start` settings: flags, parsing and validation (pure).

Flags are registered on GPUStack's own argparse parser (plugin.py), so a malformed value
fails while `gpustack start` parses its command line, naming the flag. Precedence follows
GPUStack's own options: command line, then environment variable, then `--config-file` key
(same name as the flag's dest, e.g. `dspark_json_label`), then the default.
"""

import argparse
import os
import re
from dataclasses import dataclass, replace
from typing import Callable, Dict, Mapping, Optional, Tuple

from gpustack_dspark import __version__
from gpustack_dspark.labels import parse_label, parse_selector, selector_text
from gpustack_dspark.versions import SUPPORTED_GPUSTACK_VERSION

DEFAULT_JSON_LABEL = "role=json-inference"
DEFAULT_CUDA_IMAGE = f"gpustack-dspark-worker:{__version__}-cuda"
DEFAULT_CPU_IMAGE = f"gpustack-dspark-worker:{__version__}-cpu"
# The GPUStack server image with the plugin (backend_images/server/); only listed for
# `gpustack list-images` / `save-images` (GPUSTACK_DSPARK_SERVER_IMAGE overrides the name).
SERVER_IMAGE_REPOSITORY = "gpustack-dspark/gpustack-dspark-server"
SERVER_IMAGE_TAG = f"{__version__}-gpustack{SUPPORTED_GPUSTACK_VERSION}"
DEFAULT_SERVER_IMAGE = f"{SERVER_IMAGE_REPOSITORY}:{SERVER_IMAGE_TAG}"
SERVER_IMAGE_ENV = "GPUSTACK_DSPARK_SERVER_IMAGE"

# An OCI image reference: [registry[:port]/]path[:tag][@digest], lowercase path; as in
# Docker, a first component is a registry only with a dot, a port, or `localhost`.
_IMAGE_RE = re.compile(
    r"^((localhost|[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+)(:[0-9]+)?/|[A-Za-z0-9-]+:[0-9]+/)?[a-z0-9]+([._-][a-z0-9]+)*(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$"
)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def parse_image(value: str) -> str:
    if not _IMAGE_RE.match(value):
        raise ValueError(
            f"{value!r} is not a container image reference "
            "(like registry.example.com/team/dspark-worker:0.1.0-cuda)"
        )
    return value


def parse_directory(value: str) -> str:
    """A directory path (made absolute). Whether it exists is checked by the feature that
    reads it, so a missing directory turns off that feature, not the server."""
    if not value.strip():
        raise ValueError("the directory path is empty")
    return os.path.abspath(value)


def parse_node_selector(value: str) -> str:
    """A Kubernetes label selector for the node-label sync (normalised text)."""
    return selector_text(parse_selector(value))


def parse_file(value: str) -> str:
    """A file path (made absolute). Whether it is readable is checked by the feature that
    reads it, so a missing file turns off that feature, not the server."""
    if not value.strip():
        raise ValueError("the file path is empty")
    return os.path.abspath(value)


def parse_switch(value: str) -> bool:
    lowered = value.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ValueError(f"{value!r} is not a boolean (one of: true, false, 1, 0, yes, no)")


@dataclass(frozen=True)
class Flag:
    dest: str  # argparse dest, GPUStack Config attribute and --config-file key
    option: str
    env: str
    field: str  # the PluginSettings attribute it sets
    parse: Callable[[str], object]
    default_text: str
    metavar: Optional[str]
    help: str


FLAG_JSON_LABEL = Flag("dspark_json_label", "--dspark-json-label", "GPUSTACK_DSPARK_JSON_LABEL",
                       "json_label", parse_label, DEFAULT_JSON_LABEL, "KEY=VALUE",
                       "worker label KEY=VALUE that marks JSON-inference workers")
FLAG_CUDA_IMAGE = Flag("dspark_cuda_image", "--dspark-cuda-image", "GPUSTACK_DSPARK_CUDA_IMAGE",
                       "cuda_image", parse_image, DEFAULT_CUDA_IMAGE, "IMAGE",
                       "container image of the DSpark worker for CUDA GPUs")
FLAG_CPU_IMAGE = Flag("dspark_cpu_image", "--dspark-cpu-image", "GPUSTACK_DSPARK_CPU_IMAGE",
                      "cpu_image", parse_image, DEFAULT_CPU_IMAGE, "IMAGE",
                      "container image of the DSpark worker for CPU-only workers")
FLAG_DISABLE = Flag("dspark_disable", "--dspark-disable", "GPUSTACK_DSPARK_DISABLE",
                    "disabled", parse_switch, "off", None,
                    "load the plugin but turn all of its features off")
FLAG_POLICY_DIR = Flag("dspark_policy_dir", "--dspark-policy-dir", "GPUSTACK_DSPARK_POLICY_DIR",
                       "policy_dir", parse_directory, "none: built-in policies", "DIR",
                       "directory of the plugin's policy files (placement.yaml)")
FLAG_NODE_SELECTOR = Flag("dspark_node_label_sync_selector", "--dspark-node-label-sync-selector",
                          "GPUSTACK_DSPARK_NODE_LABEL_SYNC_SELECTOR", "node_label_sync_selector",
                          parse_node_selector, "none: the sync is off", "SELECTOR",
                          "Kubernetes label selector of the nodes whose GPUStack workers get the JSON label "
                          "(turns the node-label sync on), e.g. gpustack-dspark.io/json-inference=true")
FLAG_KUBECONFIG = Flag("dspark_node_label_sync_kubeconfig", "--dspark-node-label-sync-kubeconfig",
                       "GPUSTACK_DSPARK_NODE_LABEL_SYNC_KUBECONFIG", "node_label_sync_kubeconfig",
                       parse_file, "none: in-cluster config", "FILE",
                       "kubeconfig file the node-label sync reads the Kubernetes API with")
FLAGS = (FLAG_JSON_LABEL, FLAG_CUDA_IMAGE, FLAG_CPU_IMAGE, FLAG_DISABLE, FLAG_POLICY_DIR,
         FLAG_NODE_SELECTOR, FLAG_KUBECONFIG)
VALUE_FLAGS = (FLAG_JSON_LABEL, FLAG_CUDA_IMAGE, FLAG_CPU_IMAGE, FLAG_POLICY_DIR, FLAG_NODE_SELECTOR,
               FLAG_KUBECONFIG)


def _argparse_type(flag: Flag, environ: Mapping[str, str]):
    """argparse converts string defaults with `type` too, and only for the command being
    parsed: an environment default is therefore validated by `gpustack start` alone, never
    while other gpustack commands build their parsers."""
    def convert(value: str):
        try:
            return flag.parse(value)
        except ValueError as e:
            source = f" (from {flag.env})" if environ.get(flag.env) == value else ""
            raise argparse.ArgumentTypeError(f"{e}{source}") from e

    convert.__name__ = flag.parse.__name__.removeprefix("parse_")
    return convert


@dataclass(frozen=True)
class PluginSettings:
    json_label: Tuple[str, str] = parse_label(DEFAULT_JSON_LABEL)
    cuda_image: str = DEFAULT_CUDA_IMAGE
    cpu_image: str = DEFAULT_CPU_IMAGE
    disabled: bool = False
    policy_dir: Optional[str] = None
    node_label_sync_selector: Optional[str] = None
    node_label_sync_kubeconfig: Optional[str] = None

    @property
    def json_label_text(self) -> str:
        return f"{self.json_label[0]}={self.json_label[1]}"

    def as_dict(self) -> Dict[str, object]:
        return {"json_label": self.json_label_text, "cuda_image": self.cuda_image,
                "cpu_image": self.cpu_image, "disabled": self.disabled, "policy_dir": self.policy_dir,
                "node_label_sync_selector": self.node_label_sync_selector,
                "node_label_sync_kubeconfig": self.node_label_sync_kubeconfig}


def add_start_flags(parser: argparse.ArgumentParser, environ: Mapping[str, str] = os.environ) -> None:
    """Register the plugin's flags on `gpustack start`; unset flags default to the environment.

    Never raises: GPUStack builds this parser for every `gpustack` command, and a bad
    environment variable must only stop `gpustack start`, with a message naming it.
    An unset flag with no environment variable stays None, so a config-file key can apply.
    """
    group = parser.add_argument_group("DSpark plugin (gpustack-dspark)")
    for flag in VALUE_FLAGS:
        group.add_argument(
            flag.option, dest=flag.dest, metavar=flag.metavar, type=_argparse_type(flag, environ),
            default=environ.get(flag.env),
            help=f"{flag.help} (default {flag.default_text}; env {flag.env})",
        )
    # store_true keeps a string default unconverted: resolve_settings parses it.
    group.add_argument(
        FLAG_DISABLE.option, dest=FLAG_DISABLE.dest, action="store_true",
        default=environ.get(FLAG_DISABLE.env),
        help=f"{FLAG_DISABLE.help} (env {FLAG_DISABLE.env})",
    )


def _parse_raw(flag: Flag, value: object, where: str) -> object:
    """A value not yet through argparse (environment, config file), errors naming `where`."""
    if flag is FLAG_DISABLE and isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r}")
    try:
        return flag.parse(value)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from e


def resolve_settings(command_line: Mapping[str, object], config_file: Mapping[str, object],
                     environment: Optional[Mapping[str, str]] = None) -> PluginSettings:
    """Settings from parsed flags (None = not given), then raw environment variables, then
    config-file keys, then defaults. A bad value raises ValueError naming where it came from.
    (From `gpustack start`, environment defaults already sit in `command_line`.)"""
    environment = environment or {}
    chosen = {}
    for flag in FLAGS:
        given = command_line.get(flag.dest)
        if isinstance(given, str) and flag is FLAG_DISABLE:  # argparse left the env default raw
            chosen[flag.field] = _parse_raw(flag, given, f"environment variable {flag.env}")
        elif given is not None:
            chosen[flag.field] = given  # argparse has converted it already
        elif environment.get(flag.env) is not None:
            chosen[flag.field] = _parse_raw(flag, environment[flag.env], f"environment variable {flag.env}")
        elif config_file.get(flag.dest) is not None:
            chosen[flag.field] = _parse_raw(flag, config_file[flag.dest], f"config file key {flag.dest}")
    return replace(PluginSettings(), **chosen)


def command_line_values(args: argparse.Namespace) -> Dict[str, object]:
    return {flag.dest: getattr(args, flag.dest, None) for flag in FLAGS}


def settings_to_config(settings: PluginSettings) -> dict:
    """The keys the plugin adds to GPUStack's Config (which allows extra keys)."""
    values = settings.as_dict()
    return {flag.dest: values[flag.field] for flag in FLAGS}


def settings_from_config(cfg: object, environ: Mapping[str, str] = os.environ) -> PluginSettings:
    """Read settings back off GPUStack's Config. A server whose Config did not go through
    `gpustack start` (so no contribute_config) gets the environment, then the defaults."""
    on_config = {flag.dest: getattr(cfg, flag.dest, None) for flag in FLAGS}
    for_missing = {flag.env: environ[flag.env] for flag in FLAGS
                   if on_config[flag.dest] is None and flag.env in environ}
    return resolve_settings({}, on_config, environment=for_missing)


def images_from_environment(environ: Mapping[str, str] = os.environ) -> Tuple[str, str]:
    """The worker images for GPUStack's image list (`gpustack list-images` / `save-images`),
    which runs with no server config: from the environment, else the defaults. A malformed
    variable falls back to the default here; `gpustack start` reports it properly."""
    images = []
    for flag in (FLAG_CUDA_IMAGE, FLAG_CPU_IMAGE):
        try:
            images.append(parse_image(environ.get(flag.env) or flag.default_text))
        except ValueError:
            images.append(flag.default_text)
    return images[0], images[1]


def server_image_from_environment(environ: Mapping[str, str] = os.environ) -> str:
    try:
        return parse_image(environ.get(SERVER_IMAGE_ENV) or DEFAULT_SERVER_IMAGE)
    except ValueError:
        return DEFAULT_SERVER_IMAGE
