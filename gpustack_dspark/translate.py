"""DSpark knobs + what the model is -> the exact vLLM argv. Pure: no I/O, no vLLM import.

The worker reads the files (config.json of the model and of a draft) and probes what is
installed; this module only decides. Every decision carries its reason, because operators
read them in the startup line and in `/dspark/info`.
"""

import json
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Collection, Dict, List, Mapping, Optional, Sequence, Tuple

from gpustack_dspark import bounded
from gpustack_dspark.knobs import DSparkKnobs, KnobError

MIDDLEWARE = "gpustack_dspark.worker.middleware.DSparkMiddleware"
DRAFTING_SCHEDULER = "gpustack_dspark.worker.drafting.scheduler.DSparkDraftingScheduler"
# Base drafters whose drafts pass vLLM's scheduler (V1 runner, synchronous scheduling), where
# the drafting layer can put grammar-forced tokens first.
LAYER_METHODS = ("ngram", "suffix", "draft_model")
# Forced runs (`","amount":`) are several tokens long: drafts pay off beyond n-gram's 4.
LAYER_LENGTH = 8
LAYER_THRESHOLD = 0.3

# DeepSeek-V4.1's published DSpark recipe; 5 is the block size its draft stages were trained on.
DSPARK_RECIPE: Dict[str, Any] = {
    "draft_sample_method": "probabilistic",
    "rejection_sample_method": "block",
    "enable_adaptive_verification": True,
}
DEFAULT_LENGTH = {"dspark": 5, "mtp": 1, "suffix": 8, "ngram": 4, "draft_model": 4, "eagle3": 3}
MTP_FAMILIES = ("deepseek_v3", "deepseek_v32", "deepseek_v4")
V41 = "deepseek_v41"
DEEPSEEK_THINKING_FAMILIES = ("deepseek_v3", "deepseek_v32", "deepseek_v4", V41)
GPU_ONLY_METHODS = ("dspark", "mtp", "eagle3")
# n-gram prompt lookup: with only a max set vLLM uses min = max and rarely drafts on short JSON.
NGRAM_LOOKUP = {"prompt_lookup_min": 2, "prompt_lookup_max": 5}
# Bounded whitespace: xgrammar otherwise lets a model emit runaway whitespace until max_tokens.
STRUCTURED_OUTPUTS = {"backend": "xgrammar", "disable_any_whitespace": True}
# With the drafting layer on, vLLM's frontend picks the engine per request ("auto": xgrammar
# where it supports the schema, llguidance otherwise) and the layer's manager honours that
# choice inside the one engine (worker/drafting/engines.py). vLLM allows disable_any_whitespace
# only with one named backend, so there the layer sets it on both engines itself.
GRAMMAR_ENGINES = ("xgrammar", "llguidance")
STRUCTURED_OUTPUTS_DUAL = {"backend": "auto"}


# vLLM's tool-call parser per model family (config.json model_type), with the token the parser
# needs in the tokenizer (vLLM's parser raises at the first tool request without it).
TOOL_PARSERS: Dict[str, Tuple[str, Optional[str]]] = {
    "deepseek_v3": ("deepseek_v3", "<｜tool▁calls▁begin｜>"),
    "deepseek_v31": ("deepseek_v31", "<｜tool▁calls▁begin｜>"),
    "deepseek_v32": ("deepseek_v32", None),
    "deepseek_v4": ("deepseek_v4", None),
    V41: ("deepseek_v41", None),
    "llama": ("llama3_json", "<|python_tag|>"),
    "qwen2": ("hermes", "<tool_call>"),
    "qwen2_moe": ("hermes", "<tool_call>"),
    "qwen3": ("hermes", "<tool_call>"),
    "qwen3_moe": ("hermes", "<tool_call>"),
}
# Needs no special token: works with any tokenizer (and `required`/named tool choices are
# grammar-constrained by vLLM whichever parser is set).
DEFAULT_TOOL_PARSER = "pythonic"
# A chat template that writes this renders tool calls in the Hermes format (Qwen, Hermes, the
# test fixture): vLLM's `hermes` parser reads it, as text (it needs no special token), and has
# structural tags, so strict tools are constrained under `auto` too.
HERMES_MARKER = "<tool_call>"
_V31_NAMES = ("v3.1", "v3_1", "v3-1", "v31", "terminus")


@dataclass(frozen=True)
class Environment:
    """What the worker found installed / where it runs."""

    device: str = "cuda"  # cuda | cpu
    suffix_available: bool = False


@dataclass(frozen=True)
class LaunchPlan:
    vllm_argv: List[str]
    enabled: bool
    method: Optional[str] = None
    method_reason: str = ""
    speculative_length: Optional[int] = None
    speculative_config: Optional[Dict[str, Any]] = None
    grammar_mode: str = "off"
    threshold: Dict[str, Any] = field(default_factory=dict)
    drafting: Dict[str, Any] = field(default_factory=dict)
    warnings: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    tool_calls: Dict[str, Any] = field(default_factory=dict)
    # The structured-output engines this replica serves requests with, first = default.
    grammar_engines: Tuple[str, ...] = ()

    @property
    def drafting_layer_on(self) -> bool:
        return self.drafting.get("mode", "off") != "off"

    def startup_line(self) -> str:
        if not self.enabled:
            return "DSpark disabled: plain vLLM (no speculative decoding or JSON default injected)"
        shown = (f"auto(max {self.speculative_length})" if self.drafting.get("budget")
                 else self.speculative_length)
        parts = [f"method={self.method}", f"speculative_length={shown}",
                 f"grammar_mode={self.grammar_mode}",
                 f"drafting={self.drafting.get('mode', 'off')}"]
        threshold = self.threshold
        if threshold.get("value") is not None:
            parts.append(f"accept_threshold={threshold['value']}")
        extras = []
        if (self.speculative_config or {}).get("enable_adaptive_verification"):
            extras.append("adaptive verification")
        if threshold.get("value") is not None and not threshold.get("applied"):
            extras.append("threshold not applied")
        tail = f" ({', '.join(extras)})" if extras else ""
        return "DSpark enabled: " + " ".join(parts) + tail


def model_type(config: Optional[Mapping[str, Any]]) -> str:
    if not config:
        return ""
    text = config.get("text_config") or {}
    return str(config.get("model_type") or text.get("model_type") or "")


def architectures(config: Optional[Mapping[str, Any]]) -> Tuple[str, ...]:
    return tuple((config or {}).get("architectures") or ())


def draft_kind(config: Optional[Mapping[str, Any]]) -> str:
    """eagle3 | dspark | draft_model, read from a draft checkpoint's config.json."""
    if not config:
        return "draft_model"
    arch = " ".join(architectures(config)).lower()
    kind = model_type(config).lower()
    if "eagle3" in arch or "eagle3" in kind or config.get("eagle_config"):
        return "eagle3"
    if "dspark" in arch or "dspark" in kind or "dspark_block_size" in config:
        return "dspark"
    return "draft_model"


def _has_mtp_layers(config: Mapping[str, Any]) -> bool:
    return int(config.get("num_nextn_predict_layers") or 0) > 0


def _flag_value(argv: Sequence[str], flag: str) -> Optional[str]:
    """The value of `flag` in a pass-through argv (last wins), or None if absent."""
    value = None
    for i, token in enumerate(argv):
        name, eq, inline = token.partition("=")
        if name == flag:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
    return value


def _without_flag(argv: Sequence[str], flag: str) -> List[str]:
    out: List[str] = []
    skip = False
    for token in argv:
        if skip:
            skip = False
        elif token == flag:
            skip = True
        elif not token.startswith(flag + "="):
            out.append(token)
    return out


def _has_flag(argv: Sequence[str], flag: str) -> bool:
    return any(t == flag or t.startswith(flag + "=") for t in argv)


def choose_method(knobs: DSparkKnobs, config: Mapping[str, Any], draft: Optional[Mapping[str, Any]],
                  env: Environment) -> Tuple[str, str]:
    """(method, why). Raises KnobError for a method this model / worker cannot use."""
    family = model_type(config)
    kind = draft_kind(draft) if knobs.draft_model else None
    flag = "--dspark-method"
    requested = knobs.method

    if requested == "auto":
        if kind:
            method, why = kind, f"--dspark-draft-model is a {kind} checkpoint"
        elif family == V41:
            method, why = "dspark", "DeepSeek-V4.1 checkpoints carry DSpark draft stages"
        elif family in MTP_FAMILIES and _has_mtp_layers(config):
            method, why = "mtp", f"{family} carries MTP layers"
        elif env.suffix_available:
            method, why = "suffix", "no model-specific drafter; suffix decoding is installed"
        else:
            method, why = "ngram", "no model-specific drafter; suffix decoding (arctic-inference) is not installed"
        if method in GPU_ONLY_METHODS and env.device != "cuda":
            fallback = "suffix" if env.suffix_available else "ngram"
            return fallback, f"{why}, but {method} runs only on CUDA; this worker is {env.device}"
        return method, why

    if requested in GPU_ONLY_METHODS and env.device != "cuda":
        raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                        f"{requested} runs only on CUDA (vLLM's GPU model runner); this worker is {env.device}")
    if requested == "dspark":
        if family == V41 or kind == "dspark":
            return "dspark", "requested" + ("" if family == V41 else " with a DSpark draft")
        raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                        f"dspark needs a DeepSeek-V4.1 checkpoint or a DSpark draft via --dspark-draft-model; "
                        f"this model is {family or 'of unknown type'}")
    if requested == "mtp":
        if family == V41:
            raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                            "DeepSeek-V4.1 has no classic MTP draft (its mtp.* weights are DSpark stages); use dspark")
        if family in MTP_FAMILIES and _has_mtp_layers(config):
            return "mtp", "requested"
        raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                        f"mtp needs a model with MTP layers (DeepSeek V3/V3.2/V4); this model is {family or 'of unknown type'}")
    if requested == "suffix":
        if not env.suffix_available:
            raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                            "suffix decoding needs the arctic-inference package in the worker image")
        return "suffix", "requested"
    if requested in ("draft_model", "eagle3"):
        if not knobs.draft_model:
            raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                            f"{requested} needs --dspark-draft-model PATH")
        if requested == "eagle3" and kind != "eagle3":
            raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                            f"--dspark-draft-model is a {kind} checkpoint, not an EAGLE-3 head")
        if requested == "draft_model" and kind != "draft_model":
            raise KnobError(flag, requested, _allowed_here(config, draft, knobs, env),
                            f"--dspark-draft-model is a {kind} checkpoint; use --dspark-method={kind} or auto")
        return requested, "requested"
    return "ngram", "requested"


def _allowed_here(config, draft, knobs: DSparkKnobs, env: Environment) -> str:
    """The methods this model could use on this worker, for error messages."""
    family = model_type(config)
    kind = draft_kind(draft) if knobs.draft_model else None
    allowed = ["auto", "ngram"]
    if env.suffix_available:
        allowed.append("suffix")
    if kind == "draft_model":
        allowed.append("draft_model")
    if env.device == "cuda":
        if family == V41 or kind == "dspark":
            allowed.append("dspark")
        if family in MTP_FAMILIES and _has_mtp_layers(config):
            allowed.append("mtp")
        if kind == "eagle3":
            allowed.append("eagle3")
    return "|".join(allowed)


def speculative_config(method: str, length: int, knobs: DSparkKnobs) -> Dict[str, Any]:
    spec: Dict[str, Any] = {"method": method, "num_speculative_tokens": length}
    if method == "dspark":
        spec.update(DSPARK_RECIPE)
        if knobs.draft_model:
            spec["model"] = knobs.draft_model
    elif method in ("draft_model", "eagle3"):
        spec["model"] = knobs.draft_model
    elif method == "ngram":
        spec.update(NGRAM_LOOKUP)
    elif method == "suffix" and knobs.accept_threshold is not None:
        spec["suffix_decoding_min_token_prob"] = knobs.accept_threshold
    return spec


def threshold_semantics(method: str, value: Optional[float], layer_mode: Optional[str] = None) -> Dict[str, Any]:
    """What --dspark-accept-threshold really does for this method (never silently ignored)."""
    if layer_mode:
        used = value if value is not None else LAYER_THRESHOLD
        mechanism = ("DSpark drafting layer: grammar-forced tokens have confidence 1, statistical tokens "
                     "their n-gram/suffix frequency estimate multiplied along the draft; the draft is cut at "
                     "the first token below the threshold")
        if method == "draft_model":
            mechanism += " (draft-model tokens are not cut: vLLM does not pass their probabilities to the scheduler)"
        return {"value": used, "applied": True, "mechanism": mechanism,
                **({} if value is not None else {"default": True})}
    if method == "suffix":
        mechanism = ("suffix decoding's minimum token probability (suffix_decoding_min_token_prob): "
                     "only tokens whose suffix-tree frequency estimate is >= the threshold are drafted")
        return {"value": value, "applied": value is not None, "mechanism": mechanism}
    reasons = {
        "dspark": "vLLM's DSpark has no confidence cut-off field; the confidence head drives adaptive "
                  "verification (enable_adaptive_verification), which sizes each request's verify budget",
        "mtp": "vLLM's MTP drafter has no confidence cut-off",
        "ngram": "n-gram prompt lookup has no confidence estimate in vLLM",
        "draft_model": "vLLM's draft-model proposer has no confidence cut-off",
        "eagle3": "vLLM's EAGLE-3 proposer has no confidence cut-off",
    }
    reason = reasons.get(method, "no confidence mechanism for this method")
    if value is None:
        return {"value": None, "applied": False, "mechanism": f"not set ({reason})"}
    return {"value": value, "applied": False, "mechanism": f"not applied ({reason})"}


def precision_args(precision: str, config: Mapping[str, Any], passthrough: Sequence[str]) -> List[str]:
    if precision == "auto":
        return []
    flag = "--dspark-precision"
    quant = (config.get("quantization_config") or {}).get("quant_method")
    if precision == "bf16":
        if quant:
            raise KnobError(flag, precision, "auto|fp8" if quant == "fp8" else "auto",
                            f"the checkpoint is already quantized ({quant})")
        wanted = [("--dtype", "bfloat16")]
    else:  # fp8
        if quant and quant != "fp8":
            raise KnobError(flag, precision, "auto|bf16" if not quant else "auto",
                            f"the checkpoint is already quantized ({quant})")
        wanted = [("--kv-cache-dtype", "fp8")] if quant == "fp8" else [("--quantization", "fp8"), ("--kv-cache-dtype", "fp8")]
    out: List[str] = []
    for option, value in wanted:
        given = _flag_value(passthrough, option)
        if given is not None and given != value:
            raise KnobError(flag, precision, "auto (to keep your own " + option + ")",
                            f"it sets {option}={value} but the arguments also set {option}={given}")
        if given is None:
            out += [option, value]
    return out


def tool_call_options(model: str, config: Mapping[str, Any], passthrough: Sequence[str],
                      special_tokens: Optional[Collection[str]] = None, chat_template: Optional[str] = None,
                      strict_tools: str = "flagged") -> Tuple[List[str], Dict[str, Any]]:
    """vLLM's tool-call flags for this model (added to the argv) and what /dspark/info says.

    A user's own --tool-call-parser wins (and keeps its --enable-auto-tool-choice or not).
    `special_tokens`: the tokenizer's added tokens, None when unknown (a hub name);
    `chat_template`: the model's template text, None when unknown. `strict_tools` "all" asks
    vLLM to constrain every tool's arguments (--tool-strict-level parameter); whether the
    parser can is for `with_structural_tags`, which knows the installed vLLM."""
    strict_args: List[str] = []
    if strict_tools == "all":
        given_level = _flag_value(passthrough, "--tool-strict-level")
        if given_level is not None and given_level != "parameter":
            raise KnobError("--dspark-strict-tools", strict_tools, "flagged (to keep your own --tool-strict-level)",
                            f"it sets --tool-strict-level=parameter but the arguments also set "
                            f"--tool-strict-level={given_level}")
        if given_level is None:
            strict_args = ["--tool-strict-level", "parameter"]
    strict = {"tools": strict_tools}
    given = _flag_value(passthrough, "--tool-call-parser")
    if given is not None:
        return strict_args, {"parser": given, "auto_tool_choice": _has_flag(passthrough, "--enable-auto-tool-choice"),
                             "source": "given", "reason": "--tool-call-parser given", "strict": strict}
    family = model_type(config)
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    if family == "deepseek_v3" and any(marker in name for marker in _V31_NAMES):
        family = "deepseek_v31"
    parser, needs = TOOL_PARSERS.get(family, (DEFAULT_TOOL_PARSER, None))
    if family in TOOL_PARSERS:
        reason = f"model family {family}"
        if needs and special_tokens is not None and needs not in special_tokens:
            parser, reason = DEFAULT_TOOL_PARSER, (f"model family {family}, but the tokenizer has no {needs!r} "
                                                   f"token, which vLLM's {TOOL_PARSERS[family][0]} parser needs")
    else:
        reason = f"default for model family {family or 'unknown'}"
    if parser == DEFAULT_TOOL_PARSER and chat_template and HERMES_MARKER in chat_template:
        parser, reason = "hermes", f"the chat template writes tool calls as {HERMES_MARKER} (Hermes format)"
    args = ["--tool-call-parser", parser] + strict_args
    if not _has_flag(passthrough, "--enable-auto-tool-choice"):
        args.insert(0, "--enable-auto-tool-choice")
    return args, {"parser": parser, "auto_tool_choice": True, "source": "launcher", "reason": reason,
                  "strict": strict}


def with_structural_tags(plan: "LaunchPlan", structural_tag_format: Optional[str]) -> "LaunchPlan":
    """The plan with what strict tools get from its tool-call parser: `structural_tag_format` is
    the parser's structural-tag format in the installed vLLM (None: it has none). Without one,
    `--dspark-strict-tools all` is an error (it could not be kept); `flagged` tools are then not
    constrained under `auto`, only judged before delivery (the middleware's tool check)."""
    calls = dict(plan.tool_calls)
    if not calls:
        return plan
    strict = dict(calls.get("strict") or {})
    parser = calls.get("parser")
    if structural_tag_format:
        strict.update(under_auto=True, mechanism=f"structural tags ({structural_tag_format} format, xgrammar): "
                                                 "text or calls naming a tool, arguments by its schema")
    else:
        if strict.get("tools") == "all":
            raise KnobError("--dspark-strict-tools", "all", "flagged",
                            f"vLLM's {parser} tool-call parser has no structural tags, so tool arguments "
                            "cannot be constrained under tool_choice auto")
        strict.update(under_auto=False, mechanism=f"not constrained under auto: vLLM's {parser} parser has no "
                                                  "structural tags; calls to strict tools are judged before "
                                                  "delivery and withheld when invalid")
    calls["strict"] = strict
    return replace(plan, tool_calls=calls)


# Verification that keeps the target model's output: greedy replies token for token, sampled
# ones from the model's own distribution (docs/drafting.md). vLLM 0.33's "fly" (entropy-gated
# deferred acceptance) is lossy by design, and "synthetic" accepts by a calibrated coin, not
# the model: either would break that promise, so neither reaches vLLM.
EXACT_REJECTION_METHODS = ("standard", "block")


def refuse_lossy_verification(passthrough: Sequence[str]) -> None:
    """A `rejection_sample_method` that is not exact, in the pass-through speculative config
    (JSON or vLLM's dotted form), raises KnobError with one line."""
    where = "--speculative-config rejection_sample_method"
    values = []
    for flag in ("--speculative-config", "-sc"):
        given = _flag_value(passthrough, flag)
        if given is None:
            continue
        try:
            spec = json.loads(given)
        except ValueError:
            continue  # not JSON: vLLM's own parser words the problem
        if isinstance(spec, dict) and "rejection_sample_method" in spec:
            values.append(spec["rejection_sample_method"])
    dotted = _flag_value(passthrough, "--speculative-config.rejection_sample_method")
    if dotted is not None:
        values.append(dotted)
    for value in values:
        if value not in EXACT_REJECTION_METHODS:
            raise KnobError(where, value, "|".join(EXACT_REJECTION_METHODS),
                            "lossy verification: replies would not be the model's own")


def plan_launch(model: str, knobs: DSparkKnobs, passthrough: Sequence[str],
                config: Optional[Mapping[str, Any]] = None, draft: Optional[Mapping[str, Any]] = None,
                env: Environment = Environment(),
                special_tokens: Optional[Collection[str]] = None, chat_template: Optional[str] = None) -> LaunchPlan:
    """Decide the vLLM argv. Raises KnobError with a one-line message for bad input."""
    config = config or {}
    refuse_lossy_verification(passthrough)
    base = ["--model", model, *passthrough, "--middleware", MIDDLEWARE]
    if not knobs.enable:
        return LaunchPlan(vllm_argv=base, enabled=False)

    if _has_flag(passthrough, "--speculative-config") or _has_flag(passthrough, "-sc"):
        raise KnobError("--speculative-config", _flag_value(passthrough, "--speculative-config") or "",
                        "leave it out: --enable-dspark writes the speculative config from the --dspark-* knobs",
                        "it cannot be combined with --enable-dspark")
    method, why = choose_method(knobs, config, draft, env)
    warnings: List[str] = []
    notes: List[str] = []
    layer_mode, layer_reason = drafting_mode(knobs, method, passthrough)
    if layer_mode is None and knobs.drafting == "auto":
        notes.append(f"drafting layer off: {layer_reason}")
    default_length = LAYER_LENGTH if layer_mode and method != "draft_model" else _default_length(method, draft)
    budget = knobs.length_auto
    if budget:
        length = knobs.speculative_max
        budget_problem = auto_length_problem(method, layer_mode, layer_reason)
        if budget_problem:
            raise KnobError("--dspark-speculative-length", "auto", "an integer 1-16", budget_problem)
        if method == "dspark":
            budget = False  # vLLM's adaptive verification sizes DSpark's drafts (the recipe turns it on)
            notes.append("speculative_length auto: DSpark's adaptive verification sizes each step's "
                         f"verify budget, up to {length}")
        else:
            notes.append(f"speculative_length auto: the drafting layer's per-step budget, up to {length}")
    else:
        if "speculative_max" in knobs.given:
            raise KnobError("--dspark-speculative-max", knobs.speculative_max,
                            "leave it out, or set --dspark-speculative-length auto",
                            "it bounds only the per-step budget of --dspark-speculative-length auto")
        length = knobs.speculative_length or default_length
    spec = speculative_config(method, length, knobs)
    argv = list(base[:-2]) + ["--speculative-config", json.dumps(spec, separators=(",", ":"))]

    grammar_engines: Tuple[str, ...] = ()
    if knobs.grammar_mode == "json":
        given = _flag_value(passthrough, "--structured-outputs-config")
        if given is None:
            grammar_engines = GRAMMAR_ENGINES if layer_mode else GRAMMAR_ENGINES[:1]
            config_value = STRUCTURED_OUTPUTS_DUAL if layer_mode else STRUCTURED_OUTPUTS
            argv += ["--structured-outputs-config", json.dumps(config_value, separators=(",", ":"))]
        elif "lm-format-enforcer" in given:
            raise KnobError("--structured-outputs-config", given, "xgrammar|guidance|outlines|auto backends",
                            "lm-format-enforcer does not support speculative tokens")
        family = model_type(config)
        if family in DEEPSEEK_THINKING_FAMILIES and not _has_flag(passthrough, "--default-chat-template-kwargs"):
            # The grammar applies only after thinking: JSON replicas answer without it.
            argv += ["--default-chat-template-kwargs", json.dumps({"thinking": False})]
            notes.append("thinking turned off server-wide (JSON grammar applies only after thinking)")

    argv += precision_args(knobs.precision, config, passthrough)
    tool_args, tool_calls = tool_call_options(model, config, passthrough, special_tokens, chat_template,
                                              knobs.strict_tools)
    argv += tool_args
    threshold = threshold_semantics(method, knobs.accept_threshold, layer_mode)
    if layer_mode:
        # The user's own --additional-config is merged into ours (one flag, vLLM keeps one).
        argv = _without_flag(argv, "--additional-config") + drafting_args(layer_mode, threshold["value"], length,
                                                                            passthrough, budget=budget,
                                                                            engines=grammar_engines)
    if not _has_flag(passthrough, "--per-request-spec-decode-metrics"):
        argv += ["--per-request-spec-decode-metrics", "summary"]
    argv += ["--middleware", MIDDLEWARE]

    if knobs.accept_threshold is not None and not threshold["applied"]:
        warnings.append(f"--dspark-accept-threshold={knobs.accept_threshold} is accepted but "
                        f"{threshold['mechanism']}")
    return LaunchPlan(
        vllm_argv=argv, enabled=True, method=method, method_reason=why, speculative_length=length,
        speculative_config=spec, grammar_mode=knobs.grammar_mode, threshold=threshold,
        drafting={"mode": layer_mode or "off", "reason": layer_reason,
                  **({"budget": True, "max_length": length} if budget and layer_mode else {})},
        warnings=tuple(warnings), notes=tuple(notes), tool_calls=tool_calls, grammar_engines=grammar_engines,
    )


def drafting_mode(knobs: DSparkKnobs, method: str, passthrough: Sequence[str]) -> Tuple[Optional[str], str]:
    """(layer mode or None, why). An explicitly requested mode that cannot work is an error."""
    requested = knobs.drafting
    flag = "--dspark-drafting"
    if requested == "off":
        return None, "turned off (--dspark-drafting=off)"
    problem = None
    if knobs.grammar_mode != "json":
        problem = "grammar-forced drafting needs --dspark-grammar-mode=json"
    elif method not in LAYER_METHODS:
        problem = (f"{method} drafts inside vLLM's GPU model runner with asynchronous scheduling, so its "
                   "drafts never pass the scheduler where the grammar lives")
    else:
        for own in ("--scheduler-cls", "--async-scheduling"):
            if _has_flag(passthrough, own):
                problem = f"the arguments set {own}, which the drafting layer replaces"
    if problem:
        if requested != "auto":
            raise KnobError(flag, requested, "auto|off", problem)
        return None, problem
    mode = "forced+statistical" if requested == "auto" else requested
    return mode, f"grammar json with vLLM's {method} drafter as the base"


def auto_length_problem(method: str, layer_mode: Optional[str], layer_reason: str) -> Optional[str]:
    """Why `--dspark-speculative-length auto` cannot work here, or None."""
    if layer_mode or method == "dspark":
        return None
    return ("auto needs the drafting layer (or method dspark, whose adaptive verification sizes its drafts); "
            f"here the layer is off: {layer_reason}")


@dataclass(frozen=True)
class DraftingConfig:
    """The drafting layer's settings, the one contract between the launcher and the engine:
    written here into vLLM's `--additional-config` under `KEY` (`as_json`), read in the engine
    process by the layer's scheduler (`from_vllm`). Only what differs from the read side's
    defaults is written, so the argv stays as short as it was."""

    KEY: ClassVar[str] = "dspark_drafting"

    mode: str = "forced+statistical"
    """Which tokens the layer drafts: "forced", "statistical" or "forced+statistical"."""
    threshold: float = 0.0
    """The cut on cumulative draft confidence (statistical tokens only)."""
    length: int = 0
    """The most draft tokens a step (0 when read: the speculative config's num_speculative_tokens)."""
    budget: bool = False
    """The per-step speculation budget (`--dspark-speculative-length auto`)."""
    engines: Tuple[str, ...] = ()
    """Both grammar engines in one manager (worker/drafting/engines.py) when two are named."""
    base_method: Optional[str] = None
    """The speculative method under the layer (read side: the speculative config's method)."""
    shared_history: int = 256
    """Recent outputs the n-gram index keeps across requests."""
    sampled_drafts: bool = True
    """At temperature > 0, draw statistical tokens from their counts and verify them against
    that distribution (draft_builder.Sampler, drafting/draft_probs.py); False: the most
    frequent continuation, verified one-hot. A diagnostic, set through vLLM's
    `--additional-config '{"dspark_drafting": {"sampled_drafts": false}}'`."""
    verifier_rows: bool = True
    """Draw those tokens from the verifier's own distributions seen after the same tokens
    (worker/drafting/verifier_rows.py), the counts filling in where it has seen none; False:
    from the counts only. A diagnostic, like `sampled_drafts`."""
    prompt_copy: bool = True
    """Copy a value from the prompt by its text (worker/drafting/prompt_copy.py); False: the
    token-id indexes only. A diagnostic, like `sampled_drafts`."""

    def as_json(self) -> Dict[str, Any]:
        return {"mode": self.mode, "threshold": self.threshold, "length": self.length,
                **({"budget": True} if self.budget else {}),
                # both engines in the one manager, with compact whitespace
                **({"engines": list(self.engines)} if len(self.engines) > 1 else {})}

    @classmethod
    def from_vllm(cls, additional_config: Optional[Mapping[str, Any]], speculative_config: Any) -> "DraftingConfig":
        given = dict((additional_config or {}).get(cls.KEY) or {})
        spec = speculative_config
        return cls(mode=given.get("mode", cls.mode), threshold=float(given.get("threshold", cls.threshold)),
                   length=int(given.get("length", spec.num_speculative_tokens if spec else 0)),
                   budget=bool(given.get("budget", False)), engines=tuple(given.get("engines", ())),
                   base_method=given.get("base_method", spec.method if spec else None),
                   shared_history=int(given.get("shared_history", cls.shared_history)),
                   sampled_drafts=bool(given.get("sampled_drafts", cls.sampled_drafts)),
                   verifier_rows=bool(given.get("verifier_rows", cls.verifier_rows)),
                   prompt_copy=bool(given.get("prompt_copy", cls.prompt_copy)))


DRAFTING_CONFIG_KEY = DraftingConfig.KEY
# The layer's settings that pass through `--additional-config` as they are (diagnostics).
DIAGNOSTICS = ("sampled_drafts", "verifier_rows", "shared_history", "prompt_copy")


def drafting_args(mode: str, threshold: float, length: int, passthrough: Sequence[str],
                  budget: bool = False, engines: Sequence[str] = ()) -> List[str]:
    """The vLLM arguments that load the layer: our scheduler class, synchronous scheduling (the
    only path where drafts pass the scheduler), and the layer's settings in additional_config."""
    given = _flag_value(passthrough, "--additional-config")
    extra: Dict[str, Any] = {}
    if given is not None:
        try:
            extra = bounded.loads_json(given, bounded.SERVER_CONFIG)
        except bounded.BoundedError as e:
            raise KnobError("--additional-config", given, "a JSON object", e.problem) from None
        if not isinstance(extra, dict):
            raise KnobError("--additional-config", given, "a JSON object")
    given_layer = extra.get(DraftingConfig.KEY)
    diagnostics = {k: v for k, v in given_layer.items() if k in DIAGNOSTICS} \
        if isinstance(given_layer, dict) else {}
    extra[DraftingConfig.KEY] = {**DraftingConfig(mode=mode, threshold=threshold, length=length, budget=budget,
                                                  engines=tuple(engines)).as_json(), **diagnostics}
    return ["--scheduler-cls", DRAFTING_SCHEDULER, "--no-async-scheduling",
            "--additional-config", json.dumps(extra, separators=(",", ":"))]


# vLLM 0.32 re-reads the method from a draft path that contains one of these (SpeculativeConfig's
# auto-detection runs even for method draft_model): "/models/gpustack-dspark/draft" would load
# as a DSpark draft.
PATH_METHOD_MARKERS = ("eagle-", "eagle3", "dflash", "dspark")


def path_method_marker(path: str) -> Optional[str]:
    lowered = path.lower()
    return next((m for m in PATH_METHOD_MARKERS if m in lowered), None)


def _default_length(method: str, draft: Optional[Mapping[str, Any]]) -> int:
    if method == "dspark" and draft:
        block = draft.get("dspark_block_size") or draft.get("block_size")
        if isinstance(block, int) and 1 <= block <= 16:
            return block
    return DEFAULT_LENGTH[method]
