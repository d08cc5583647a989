"""The DSpark knobs: the one place that names them, their flags, allowed values and defaults.

Everything else derives from this table: the backend's deploy-form hints (backend.py), the
worker launcher (translate.py, worker/), and the model YAML. Flags and YAML share the parsers
here, so a bad value gets the same message wherever it was written.
This module imports only `bounded` (a leaf: bounded JSON) of ours and does no I/O.
"""

import difflib
import json
import math
from dataclasses import dataclass, field, fields, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from gpustack_dspark import bounded

METHODS = ("auto", "dspark", "mtp", "suffix", "ngram", "draft_model", "eagle3")
GRAMMAR_MODES = ("json", "off")
PRECISIONS = ("auto", "bf16", "fp8")
DRAFTING_MODES = ("auto", "forced+statistical", "forced", "statistical", "off")
STRICT_TOOLS = ("flagged", "all")

ENABLE_FLAG = "--enable-dspark"
KNOB_FLAG_PREFIX = "--dspark-"


class KnobError(ValueError):
    """A knob value that is not allowed. str() is the one line users see; `problem` is the
    same line without the `where` (for callers that say where in their own words)."""

    def __init__(self, where: str, value: Any, allowed: str, detail: str = ""):
        self.where, self.value, self.allowed, self.detail = where, value, allowed, detail
        tail = f" ({detail})" if detail else ""
        self.problem = f"{value!r} is not allowed{tail}; allowed: {allowed}"
        super().__init__(f"{where}: {self.problem}")


def _integer(lo: int, hi: Optional[int]) -> Callable[[str, Any], int]:
    def parse(where: str, raw: Any) -> int:
        allowed = f"an integer {lo}-{hi}" if hi is not None else f"an integer >= {lo}"
        if isinstance(raw, bool):
            raise KnobError(where, raw, allowed)
        try:
            value = int(str(raw).strip(), 10) if not isinstance(raw, int) else raw
        except ValueError:
            raise KnobError(where, raw, allowed) from None
        if value < lo or (hi is not None and value > hi):
            raise KnobError(where, raw, allowed)
        return value
    return parse


AUTO_LENGTH = "auto"
DEFAULT_MAX_LENGTH = 8


def _length(where: str, raw: Any):
    """`auto` (the per-step speculation budget) or a fixed length 1-16."""
    if isinstance(raw, str) and raw.strip().lower() == AUTO_LENGTH:
        return AUTO_LENGTH
    try:
        return _integer(1, 16)(where, raw)
    except KnobError:
        raise KnobError(where, raw, "auto or an integer 1-16") from None


def _number(allowed: str, ok: Callable[[float], bool]) -> Callable[[str, Any], float]:
    def parse(where: str, raw: Any) -> float:
        if isinstance(raw, bool):
            raise KnobError(where, raw, allowed)
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise KnobError(where, raw, allowed) from None
        if not math.isfinite(value) or not ok(value):
            raise KnobError(where, raw, allowed)
        return value
    return parse


def _choice(choices: Sequence[str]) -> Callable[[str, Any], str]:
    def parse(where: str, raw: Any) -> str:
        value = str(raw).strip().lower()
        if value not in choices:
            raise KnobError(where, raw, "|".join(choices))
        return value
    return parse


def _switch(where: str, raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    value = str(raw).strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise KnobError(where, raw, "true|false (or the bare flag)")


def _text(allowed: str) -> Callable[[str, Any], str]:
    def parse(where: str, raw: Any) -> str:
        value = str(raw).strip() if raw is not None else ""
        if not value:
            raise KnobError(where, raw, allowed)
        return value
    return parse


def _schema_source(where: str, raw: Any) -> str:
    """A schema given inline (JSON text or, from YAML, a mapping) or as a file path.

    Inline JSON is checked here; a path is read and checked by the worker, which has the file.
    """
    if isinstance(raw, dict):
        return json.dumps(raw)
    value = _text("a JSON Schema: inline JSON object or a file path")(where, raw)
    if value.startswith(("{", "[")):
        try:
            parsed = bounded.loads_json(value, bounded.SCHEMA)
        except bounded.BoundedError as e:
            raise KnobError(where, _short(value), "a JSON Schema: inline JSON object or a file path",
                            e.problem) from None
        if not isinstance(parsed, dict):
            raise KnobError(where, _short(value), "a JSON Schema: inline JSON object or a file path",
                            "a schema must be a JSON object")
    return value


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Knob:
    name: str
    flag: str
    allowed: str
    help: str
    parse: Callable[[str, Any], Any]
    # Pre-filled in GPUStack's deploy form when the DSpark backend is picked.
    # None: left to the worker (e.g. speculative length defaults per method).
    form_default: Optional[str] = None
    is_switch: bool = False
    choices: Tuple[str, ...] = ()


KNOBS: Tuple[Knob, ...] = (
    Knob("enable", ENABLE_FLAG, "flag",
         "turn DSpark on; off = plain vLLM, nothing injected",
         _switch, form_default="", is_switch=True),
    Knob("speculative_length", "--dspark-speculative-length", "auto or an integer 1-16",
         "draft tokens per step (default per method; DeepSeek-V4.1 DSpark: 5); auto: the drafting "
         "layer decides per step and request, up to --dspark-speculative-max (docs/drafting.md)", _length),
    Knob("speculative_max", "--dspark-speculative-max", "an integer 1-16",
         "the most draft tokens per request per step with --dspark-speculative-length auto",
         _integer(1, 16)),
    Knob("grammar_mode", "--dspark-grammar-mode", "json|off",
         "json: every request is JSON unless it asks for something else",
         _choice(GRAMMAR_MODES), form_default="json", choices=GRAMMAR_MODES),
    Knob("schema", "--dspark-schema", "a JSON Schema: inline JSON object or a file path",
         "the schema `json` means for requests that bring none", _schema_source),
    Knob("accept_threshold", "--dspark-accept-threshold", "a number, 0 < x < 1",
         "minimum draft-token confidence (what it does per method: docs/worker.md)",
         _number("a number, 0 < x < 1", lambda v: 0.0 < v < 1.0)),
    Knob("method", "--dspark-method", "|".join(METHODS),
         "speculative method; auto picks by model family",
         _choice(METHODS), form_default="auto", choices=METHODS),
    Knob("drafting", "--dspark-drafting", "|".join(DRAFTING_MODES),
         "the DSpark drafting layer on JSON replicas: grammar-forced tokens, statistical tokens, "
         "both (auto), or off (vLLM's drafter alone)",
         _choice(DRAFTING_MODES), choices=DRAFTING_MODES),
    Knob("strict_tools", "--dspark-strict-tools", "|".join(STRICT_TOOLS),
         "tool-call arguments constrained to the tool's parameters under every tool_choice, auto "
         "included: flagged = tools marked strict: true; all = every tool (vLLM's --tool-strict-level "
         "parameter). Needs a tool-call parser with structural tags (docs/worker.md, \"Tool calls\")",
         _choice(STRICT_TOOLS), choices=STRICT_TOOLS),
    Knob("draft_model", "--dspark-draft-model", "a path to a draft checkpoint",
         "draft model / EAGLE-3 head / DSpark draft (kind read from its config.json)",
         _text("a path to a draft checkpoint")),
    Knob("precision", "--dspark-precision", "|".join(PRECISIONS),
         "maps to dtype, quantization and KV-cache dtype", _choice(PRECISIONS), choices=PRECISIONS),
    Knob("warmup_requests", "--dspark-warmup-requests", "an integer 0-10000",
         "requests sent before the replica reports ready", _integer(0, 10000)),
    Knob("warmup_concurrency", "--dspark-warmup-concurrency", "an integer 1-256",
         "concurrency of the warmup requests", _integer(1, 256)),
    Knob("warmup_file", "--dspark-warmup-file", "a path to a JSONL file of chat requests",
         "typical requests to warm up with", _text("a path to a JSONL file of chat requests")),
    Knob("warmup_timeout", "--dspark-warmup-timeout", "seconds, 0 < x <= 86400",
         "warmup budget; past it the replica stays not-ready",
         _number("seconds, 0 < x <= 86400", lambda v: 0.0 < v <= 86400.0)),
)

KNOBS_BY_FLAG: Dict[str, Knob] = {k.flag: k for k in KNOBS}
KNOBS_BY_NAME: Dict[str, Knob] = {k.name: k for k in KNOBS}


@dataclass(frozen=True)
class DSparkKnobs:
    """The knobs as given (None = not given: the worker picks the default per method)."""

    enable: bool = False
    speculative_length: Optional[Union[int, str]] = None  # an int, "auto" or None (per method)
    speculative_max: int = DEFAULT_MAX_LENGTH
    grammar_mode: str = "json"
    schema: Optional[str] = None
    accept_threshold: Optional[float] = None
    method: str = "auto"
    drafting: str = "auto"
    strict_tools: str = "flagged"
    draft_model: Optional[str] = None
    precision: str = "auto"
    warmup_requests: int = 8
    warmup_concurrency: int = 4
    warmup_file: Optional[str] = None
    warmup_timeout: float = 600.0
    # Which knobs were given explicitly (flag or YAML), for messages and /dspark/info.
    given: Tuple[str, ...] = field(default=(), compare=False)

    @property
    def length_auto(self) -> bool:
        """`--dspark-speculative-length auto`: the per-step speculation budget decides."""
        return self.speculative_length == AUTO_LENGTH

    def as_dict(self) -> Dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "given"}


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


def nearest(name: str, candidates: Sequence[str]) -> Optional[str]:
    match = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return match[0] if match else None


def unknown_flag_error(flag: str) -> KnobError:
    hint = nearest(flag, knob_flags())
    detail = f"did you mean {hint}?" if hint else "unknown DSpark flag"
    return KnobError(flag, flag, ", ".join(knob_flags()), detail)


def split_knob_args(argv: Sequence[str]) -> Tuple[Dict[str, Any], List[str]]:
    """Separate DSpark flags from everything else (which passes to vLLM untouched).

    Accepts `--flag=value` and `--flag value`; the last occurrence wins, as with argparse.
    Returns raw values keyed by knob name, and the pass-through argv in order.
    """
    raw: Dict[str, Any] = {}
    tokens = scan_knob_tokens(argv, check_values=False)
    for token in tokens:
        if token.error is not None:
            raise token.error
        raw[token.key] = token.raw
    return raw, rest_of(argv, tokens)


@dataclass(frozen=True)
class KnobToken:
    """One DSpark flag found in an argv: `key` is the knob name (or the flag itself when it is
    not a DSpark flag we know), `raw` the value as written, `error` what is wrong with it,
    `index` where the flag stands and `width` how many argv items it took (1 or 2)."""
    key: str
    flag: str
    raw: Optional[str]
    error: Optional[KnobError]
    index: int = 0
    width: int = 1


def scan_knob_tokens(argv: Sequence[str], check_values: bool = True) -> List[KnobToken]:
    """Every DSpark flag of `argv` with its own verdict, as `dspark-serve` judges it (the same
    parsers and messages; `check_values=False`: only unknown flags and missing values); other
    arguments are skipped. Accepts `--flag=value` and `--flag value`. Never raises."""
    found: List[KnobToken] = []
    i = 0
    while i < len(argv):
        start = i
        name, eq, inline = str(argv[i]).partition("=")
        i += 1
        if name != ENABLE_FLAG and not name.startswith(KNOB_FLAG_PREFIX):
            continue
        knob = KNOBS_BY_FLAG.get(name)
        if knob is None:
            found.append(KnobToken(name, name, inline if eq else None, unknown_flag_error(name), start))
            continue
        if eq:
            raw: Optional[str] = inline
        elif knob.is_switch:
            raw = ""
        elif i < len(argv):
            raw = str(argv[i])
            i += 1
        else:
            found.append(KnobToken(knob.name, name, None, KnobError(knob.flag, "", knob.allowed,
                                                                   "the flag needs a value"), start))
            continue
        error = None
        if check_values:
            try:
                knob.parse(knob.flag, raw)
            except KnobError as e:
                error = e
        found.append(KnobToken(knob.name, name, raw, error, start, i - start))
    return found


def rest_of(argv: Sequence[str], tokens: Sequence[KnobToken]) -> List[str]:
    """The arguments of `argv` that are not DSpark flags (they pass to vLLM), in order."""
    taken = {t.index + k for t in tokens for k in range(t.width)}
    return [str(a) for n, a in enumerate(argv) if n not in taken]


def build_knobs(raw: Dict[str, Any], where: Callable[[Knob], str] = lambda k: k.flag) -> DSparkKnobs:
    """Validate raw values (from flags or YAML) into DSparkKnobs; `where` names the source."""
    values: Dict[str, Any] = {}
    for name, value in raw.items():
        knob = KNOBS_BY_NAME.get(name)
        if knob is None:
            hint = nearest(name, list(KNOBS_BY_NAME))
            raise KnobError(name, value, ", ".join(KNOBS_BY_NAME),
                            f"unknown knob; did you mean {hint}?" if hint else "unknown knob")
        values[name] = knob.parse(where(knob), value)
    return replace(DSparkKnobs(), **values, given=tuple(sorted(values)))


def parse_knob_args(argv: Sequence[str]) -> Tuple[DSparkKnobs, List[str]]:
    raw, rest = split_knob_args(argv)
    return build_knobs(raw), rest


def knob_table_markdown() -> str:
    """The knob table for the docs, generated from KNOBS so it cannot drift."""
    lines = ["| flag | allowed | default | what it does |", "|---|---|---|---|"]
    defaults = DSparkKnobs()
    for knob in KNOBS:
        default = getattr(defaults, knob.name)
        shown = "per method" if knob.name == "speculative_length" else (
            "off" if knob.is_switch else ("—" if default is None else str(default)))
        cells = [f"`{knob.flag}`", knob.allowed, shown, knob.help]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


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
