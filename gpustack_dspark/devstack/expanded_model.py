"""The benchmark model: the fixture `tiny-order-llama` expanded, function-preservingly, to the
cost of a real model.

Why: the fixture (hidden 256, 4 layers, 3.1 M parameters) answers the way the tests need, but
its steps cost framework overhead, not weights, and speculative decoding is a trade of verify
cost against steps saved. Widened and deepened here so that every matmul costs what a
~100 M-parameter model's does, while the new parts add nothing to the residual stream: the
tokens stay the fixture's (docs/drafting.md, "The benchmark model"; the arithmetic is
shared/notes/realistic-benchmark-model.md):

- embeddings `[V, D]`: old columns copied, new columns 0 (the tied LM head then sees the old
  logits, since the residual's new dimensions stay 0);
- RMSNorm: every weight times sqrt(d/D), `rms_norm_eps` times d/D (the mean over D of a
  zero-padded x is d/D times the mean over d);
- attention keeps head_dim (the softmax scale and RoPE are unchanged) and gains heads; old heads'
  q/k/v rows copied; `o_proj` columns of new heads and rows of new hidden dims 0;
- MLP: gate/up rows of new units any; `down_proj` columns of new units and rows of new dims 0;
- new layers (appended): everything random except `o_proj` and `down_proj`, which are 0: the
  layer computes for real and adds nothing;
- "random" is seeded, of the fixture's scale per tensor role, so nothing is sparse or special.

Float summation order changes with the wider matmuls, so greedy outputs can differ at rare
near-ties: tests/bench/expanded_check.py measures the agreement, a CI test requires identity on
its prompts. The build takes seconds and is cached outside the checkout (never committed):

    python -m gpustack_dspark.devstack.expanded_model [--hidden 768 --layers 12 --intermediate 2048]

prints the model directory. numpy and safetensors' numpy API only (no torch), so it runs in
either venv.
"""

import argparse
import hashlib
import json
import math
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import safetensors.numpy

from gpustack_dspark.devstack.model_cache import build_once, cache_root

REPO_ROOT = Path(__file__).resolve().parents[2]
FIXTURE = REPO_ROOT / "fixtures" / "models" / "tiny-order-llama"
# Bump when the arithmetic changes: it is part of the cache key.
VERSION = 1
DEFAULT_SIZE = (768, 12, 2048)  # hidden, layers, intermediate: GPT-2-small class, ~86 M parameters
COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json",
                "special_tokens_map.json")

Tensors = Dict[str, np.ndarray]


class ExpansionError(ValueError):
    """A size or model the expansion cannot take; the message is one line naming the field."""


@dataclass(frozen=True)
class Expansion:
    hidden: int
    layers: int
    intermediate: int
    seed: int = 0

    @property
    def label(self) -> str:
        return f"h{self.hidden}-l{self.layers}-i{self.intermediate}-s{self.seed}"


# ---------------------------------------------------------------------------------------- pure


def expand_config(config: dict, size: Expansion) -> dict:
    """config.json of the expanded model; raises ExpansionError naming the field."""
    if config.get("model_type") != "llama":
        raise ExpansionError(f"model_type {config.get('model_type')!r}: only 'llama' can be expanded")
    for field in ("attention_bias", "mlp_bias"):
        if config.get(field):
            raise ExpansionError(f"{field} {config[field]!r}: only models without biases can be expanded")
    d, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or d // heads
    if head_dim * heads != d:
        raise ExpansionError(f"head_dim {head_dim}: only models with hidden_size = heads x head_dim can be expanded")
    wanted = (("hidden", size.hidden, d), ("layers", size.layers, config["num_hidden_layers"]),
              ("intermediate", size.intermediate, config["intermediate_size"]))
    for name, new, old in wanted:
        if new < old:
            raise ExpansionError(f"{name} {new}: must be at least the model's {old}")
    if size.hidden % head_dim:
        raise ExpansionError(f"hidden {size.hidden}: must be a multiple of head_dim {head_dim}")
    new_heads = size.hidden // head_dim
    group = heads // kv_heads
    if new_heads % group:
        raise ExpansionError(f"hidden {size.hidden}: {new_heads} heads do not divide into KV groups of {group}")
    out = dict(config)
    out.update(hidden_size=size.hidden, num_hidden_layers=size.layers, intermediate_size=size.intermediate,
               num_attention_heads=new_heads, num_key_value_heads=new_heads // group, head_dim=head_dim,
               rms_norm_eps=config["rms_norm_eps"] * d / size.hidden)
    return out


def _pad(old: np.ndarray, fill: np.ndarray) -> np.ndarray:
    """`fill` with `old` written into its leading corner (old rows and columns keep their index)."""
    out = fill.astype(old.dtype, copy=True)
    out[tuple(slice(0, n) for n in old.shape)] = old
    return out


def expand_tensors(tensors: Tensors, config: dict, size: Expansion) -> Tensors:
    """The expanded weights (names as in the fixture's safetensors). Pure: seeded from `size.seed`."""
    new_config = expand_config(config, size)
    rng = np.random.default_rng(size.seed)
    d, D = config["hidden_size"], size.hidden
    layers = config["num_hidden_layers"]
    head_dim = new_config["head_dim"]
    kv_old = (config.get("num_key_value_heads") or config["num_attention_heads"]) * head_dim
    kv_new = new_config["num_key_value_heads"] * head_dim
    q_new = new_config["num_attention_heads"] * head_dim
    I = size.intermediate
    norm_scale = math.sqrt(d / D)

    def scale_of(role: str) -> float:  # the fixture's own scale for a tensor role, all layers
        values = [t for name, t in tensors.items() if name.endswith(role)]
        return float(np.sqrt(np.mean([np.mean(np.square(t, dtype=np.float64)) for t in values])))

    def random(shape, role: str, dtype) -> np.ndarray:
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale_of(role))).astype(dtype)

    def zeros(shape, dtype) -> np.ndarray:
        return np.zeros(shape, dtype=dtype)

    shapes = {"self_attn.q_proj.weight": (q_new, D), "self_attn.k_proj.weight": (kv_new, D),
              "self_attn.v_proj.weight": (kv_new, D), "self_attn.o_proj.weight": (D, q_new),
              "mlp.gate_proj.weight": (I, D), "mlp.up_proj.weight": (I, D), "mlp.down_proj.weight": (D, I),
              "input_layernorm.weight": (D,), "post_attention_layernorm.weight": (D,)}
    zero_filled = ("self_attn.o_proj.weight", "mlp.down_proj.weight")
    known = set(shapes) | {"model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"}

    out: Tensors = {}
    for name, t in tensors.items():
        role = name.split(".", 3)[-1] if name.startswith("model.layers.") else name
        if role not in known:
            raise ExpansionError(f"tensor {name}: not a Llama weight this expansion knows")
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            out[name] = _pad(t, zeros((t.shape[0], D), t.dtype))
        elif name == "model.norm.weight" or role.endswith("layernorm.weight"):
            out[name] = _pad((t.astype(np.float64) * norm_scale).astype(t.dtype),
                             np.full((D,), norm_scale, dtype=t.dtype))
        else:
            shape = shapes[role]
            fill = zeros(shape, t.dtype) if role in zero_filled else random(shape, role, t.dtype)
            out[name] = _pad(t, fill)
    dtype = tensors["model.embed_tokens.weight"].dtype
    for layer in range(layers, size.layers):
        for role, shape in shapes.items():
            name = f"model.layers.{layer}.{role}"
            if role in zero_filled:
                out[name] = zeros(shape, dtype)
            elif role.endswith("layernorm.weight"):
                out[name] = np.full(shape, norm_scale, dtype=dtype)
            else:
                out[name] = random(shape, role, dtype)
    return out


# --------------------------------------------------------------------- safetensors, files, cache

def read_safetensors(path: Path) -> Tensors:
    return dict(safetensors.numpy.load_file(str(path)))


def write_safetensors(path: Path, tensors: Tensors) -> None:
    # metadata "pt": vLLM's and transformers' loaders read the file as a PyTorch checkpoint.
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path),
                                metadata={"format": "pt"})


def cache_key(source: Path, size: Expansion) -> str:
    digest = hashlib.sha256(json.dumps({**asdict(size), "version": VERSION}).encode())
    for name in ("config.json", "model.safetensors"):
        digest.update((source / name).read_bytes())
    return digest.hexdigest()[:12]


def build(source: Path, size: Expansion, dest: Path) -> Path:
    """Writes the expanded model of `source` into `dest` (created; must not exist)."""
    config = json.loads((source / "config.json").read_text())
    new_config = expand_config(config, size)
    tensors = expand_tensors(read_safetensors(source / "model.safetensors"), config, size)
    dest.mkdir(parents=True)
    write_safetensors(dest / "model.safetensors", tensors)
    (dest / "config.json").write_text(json.dumps(new_config, indent=2) + "\n")
    for name in COPIED_FILES:
        if (source / name).exists():
            shutil.copy2(source / name, dest / name)
    params = sum(t.size for name, t in tensors.items() if name != "lm_head.weight")
    (dest / "build-info.json").write_text(json.dumps(
        {"expanded_from": source.name, **asdict(size), "params": params, "version": VERSION}, indent=2) + "\n")
    return dest


def expanded(size: Expansion = Expansion(*DEFAULT_SIZE), source: Path = FIXTURE,
             root: Optional[Path] = None) -> Path:
    """The cached expanded model's directory, built first if missing (atomically: a half-written
    build is never found)."""
    root = root or cache_root()
    dest = root / f"{source.name}-{size.label}-{cache_key(source, size)}"
    return build_once(dest, lambda scratch: build(source, size, scratch), lambda path: (path / "config.json").exists())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=DEFAULT_SIZE[0])
    parser.add_argument("--layers", type=int, default=DEFAULT_SIZE[1])
    parser.add_argument("--intermediate", type=int, default=DEFAULT_SIZE[2])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=FIXTURE, help="model to expand (default: the fixture)")
    parser.add_argument("--cache", type=Path, default=None, help=f"cache folder (default {cache_root()})")
    args = parser.parse_args(argv)
    for needed in ("config.json", "model.safetensors"):
        if not (args.source / needed).is_file():
            print(f"expanded_model: --source {args.source}: no {needed} (the fixture is in a checkout's "
                  "fixtures/models/)", file=sys.stderr)
            return 2
    try:
        path = expanded(Expansion(args.hidden, args.layers, args.intermediate, args.seed), args.source, args.cache)
    except ExpansionError as e:
        print(f"expanded_model: {e}", file=sys.stderr)
        return 2
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
