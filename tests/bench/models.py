"""`--model` for the benchmark scripts: the real model (SmolLM2-135M-Instruct), the fixture, the
expanded benchmark model, or any model directory, and the vLLM arguments it needs.

Why: every speed figure used to come from the fixture, whose steps cost framework overhead,
not weights (docs/drafting.md, "The benchmark model"). `--model expanded` builds (or finds in
the cache) the fixture expanded to a ~100 M-parameter model's cost and serves that instead; the
tokens are the fixture's, so the workloads and their acceptance stay comparable.
"""

import argparse
import json
from pathlib import Path
from typing import List, Tuple

from gpustack_dspark.devstack.replica import TARGET_MODEL

KV_TOKENS = 16384  # the KV cache sized in tokens, whatever the model's width and depth
CHOICES = "real, fixture, expanded, or a model directory"


def add_model_argument(parser: argparse.ArgumentParser, default: str = "fixture") -> None:
    parser.add_argument("--model", default=default, metavar="MODEL",
                        help=f"real (SmolLM2-135M-Instruct from PyPI, converted once and cached: "
                             "devstack/real_model.py), fixture (tiny-order-llama), expanded (the fixture expanded "
                             "to hidden 768, 12 layers, intermediate 2048: a ~100 M-parameter model's cost, "
                             f"built once and cached), or a model directory (default {default})")


def kv_cache_bytes(model: Path, tokens: int = KV_TOKENS) -> int:
    """Bytes of KV cache for `tokens` tokens of `model` (fp32), at least the CPU layout's 256 MiB."""
    config = json.loads((model / "config.json").read_text())
    heads = config.get("num_key_value_heads") or config["num_attention_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = 2 * config["num_hidden_layers"] * heads * head_dim * 4
    return max(256 << 20, per_token * tokens)


def resolve(choice: str) -> Tuple[Path, List[str]]:
    """The model directory for `--model` and the vLLM arguments to add for it (its KV cache: the
    CPU layout's fixed 256 MiB holds 32 k tokens of the fixture but under 4 k of the expanded
    model, which would preempt requests at concurrency 8)."""
    if choice == "real":
        from gpustack_dspark.devstack.real_model import MAX_MODEL_LEN, real_model

        path = real_model()
        return path, ["--kv-cache-memory-bytes", str(kv_cache_bytes(path)), "--max-model-len", str(MAX_MODEL_LEN)]
    if choice == "fixture":
        path = TARGET_MODEL
    elif choice == "expanded":
        from gpustack_dspark.devstack.expanded_model import expanded

        path = expanded()
    else:
        path = Path(choice)
        if not (path / "config.json").is_file():
            raise SystemExit(f"--model {choice}: not {CHOICES} (no config.json there)")
    return path, ["--kv-cache-memory-bytes", str(kv_cache_bytes(path))]
