"""The DSpark knobs: the one place that names them, their flags, allowed values and defaults.

Everything else derives from this table: the backend's deploy-form hints (backend.py),
and — as later parts land — the worker launcher, the model YAML and the docs.
This module imports nothing of ours.
"""

from dataclasses import dataclass
from typing import Optional, Tuple

METHODS = ("auto", "dspark", "mtp", "suffix", "ngram", "draft_model", "eagle3")
GRAMMAR_MODES = ("json", "off")
PRECISIONS = ("auto", "bf16", "fp8")


@dataclass(frozen=True)
class Knob:
    name: str
    flag: str
    allowed: str
    help: str
    # Pre-filled in GPUStack's deploy form when the DSpark backend is picked.
    # None: left to the worker (e.g. speculative length defaults per method).
    form_default: Optional[str] = None
    is_switch: bool = False
    choices: Tuple[str, ...] = ()


KNOBS: Tuple[Knob, ...] = (
    Knob("enable", "--enable-dspark", "flag",
         "turn DSpark on; off = plain vLLM, nothing injected",
         form_default="", is_switch=True),
    Knob("speculative_length", "--dspark-speculative-length", "integer 1-16",
         "draft tokens per step (default per method; DeepSeek-V4.1 DSpark: 5)"),
    Knob("grammar_mode", "--dspark-grammar-mode", "json|off",
         "json: every request is JSON unless it asks for something else",
         form_default="json", choices=GRAMMAR_MODES),
    Knob("schema", "--dspark-schema", "a JSON Schema (file path or inline JSON)",
         "the schema `json` means for requests that bring none"),
    Knob("accept_threshold", "--dspark-accept-threshold", "number, 0 < x < 1",
         "minimum draft-token confidence"),
    Knob("method", "--dspark-method", "|".join(METHODS),
         "speculative method; auto picks by model family",
         form_default="auto", choices=METHODS),
    Knob("draft_model", "--dspark-draft-model", "path to a draft checkpoint",
         "draft model / EAGLE-3 head / DSpark draft"),
    Knob("precision", "--dspark-precision", "|".join(PRECISIONS),
         "maps to dtype, quantization and KV-cache dtype", choices=PRECISIONS),
    Knob("warmup_requests", "--dspark-warmup-requests", "integer >= 0",
         "requests sent before the replica reports ready"),
    Knob("warmup_concurrency", "--dspark-warmup-concurrency", "integer >= 1",
         "concurrency of the warmup requests"),
    Knob("warmup_file", "--dspark-warmup-file", "path to a JSONL file of requests",
         "typical requests to warm up with"),
    Knob("warmup_timeout", "--dspark-warmup-timeout", "seconds > 0",
         "warmup budget; past it the replica stays not-ready"),
)

# Plain vLLM arguments people tune together with DSpark. They are not wrapped: they pass
# to vLLM untouched; listing them only makes GPUStack's form suggest them.
VLLM_TUNING_FLAGS: Tuple[str, ...] = (
    "--max-num-seqs",
    "--max-model-len",
    "--max-num-batched-tokens",
    "--enable-chunked-prefill",
    "--block-size",
    "--scheduling-policy",
    "--gpu-memory-utilization",
    "--tensor-parallel-size",
)


def knob_flags() -> Tuple[str, ...]:
    return tuple(k.flag for k in KNOBS)


def form_defaults() -> Tuple[str, ...]:
    """The backend parameters GPUStack's deploy form pre-fills, in `--flag=value` form."""
    out = []
    for knob in KNOBS:
        if knob.form_default is None:
            continue
        out.append(knob.flag if knob.is_switch else f"{knob.flag}={knob.form_default}")
    return tuple(out)
