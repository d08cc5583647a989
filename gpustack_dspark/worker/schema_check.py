"""Is a JSON Schema usable, and by which grammar engine? Checked with the real tools:
jsonschema's meta-schema, the xgrammar compiler and llguidance (the two engines vLLM uses), in
bounded time, with the verdicts cached per schema.

A schema no engine can compile must get a clear 400, never unconstrained output.
`plan_engine` picks the engine for a request and `second_plan` the other one for a second
attempt after a withheld reply (rules in docs/worker.md, "Grammar engines").
"""

import collections
import concurrent.futures
import copy
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from gpustack_dspark import bounded, reply_check
from gpustack_dspark.knobs import KnobError
from gpustack_dspark.worker import enum_type, normalize, one_of, request_limits
# The annotation the engine's manager reads (and removes) to pick llguidance for a request.
from gpustack_dspark.worker.drafting.engines import MARK as ENGINE_MARK

COMPILE_TIMEOUT_S = 10.0
# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:NN: ".
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dspark-schema")
VERDICTS_KEPT = 4096  # per engine, least recently used dropped first


class _Verdicts:
    """Verdicts by schema hash, at most VERDICTS_KEPT (callers hold `_lock`)."""

    def __init__(self) -> None:
        self._items: "collections.OrderedDict[str, Optional[str]]" = collections.OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._items

    def __getitem__(self, key: str) -> Optional[str]:
        self._items.move_to_end(key)
        return self._items[key]

    def __setitem__(self, key: str, verdict: Optional[str]) -> None:
        self._items[key] = verdict
        self._items.move_to_end(key)
        while len(self._items) > VERDICTS_KEPT:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


_verdicts = _Verdicts()
_lock = threading.Lock()
# The model's tokenizer: xgrammar can parse some schemas it then fails to compile against a
# vocabulary (vLLM answers those with a 500), so the check compiles like vLLM does.
_tokenizer_source: Dict[str, Any] = {}
_compiler: Any = None
_hf_tokenizer: Any = None
_ll_tokenizer: Any = None
_ll_verdicts = _Verdicts()
LENIENT = {"lenient": True}  # llguidance: compile keywords it cannot enforce instead of refusing


def use_model_tokenizer(model_path: str, vocab_size: Optional[int]) -> None:
    """Compile schemas against this model's vocabulary (as vLLM's backends do)."""
    global _compiler, _hf_tokenizer, _ll_tokenizer
    _tokenizer_source.update(path=model_path, vocab_size=vocab_size)
    _compiler = _hf_tokenizer = _ll_tokenizer = None


def _tokenizer():
    global _hf_tokenizer
    if _hf_tokenizer is None and _tokenizer_source.get("path"):
        try:
            from transformers import AutoTokenizer

            _hf_tokenizer = AutoTokenizer.from_pretrained(_tokenizer_source["path"])
        except Exception:  # no tokenizer in the folder: the grammar parse is the best check left
            _tokenizer_source.clear()
    return _hf_tokenizer


def _grammar_compiler():
    global _compiler
    if _compiler is None and _tokenizer() is not None:
        try:
            import xgrammar

            info = xgrammar.TokenizerInfo.from_huggingface(_tokenizer(), vocab_size=_tokenizer_source.get("vocab_size"))
            _compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        except Exception:
            _tokenizer_source.clear()
    return _compiler


def _llguidance_tokenizer():
    """llguidance's view of the model's tokenizer, built as vLLM's guidance backend builds it."""
    global _ll_tokenizer
    if _ll_tokenizer is None and _tokenizer() is not None:
        import llguidance.hf

        tokenizer = _tokenizer()
        _ll_tokenizer = llguidance.hf.from_tokenizer(
            tokenizer, max(_tokenizer_source.get("vocab_size") or 0, len(tokenizer)))
    return _ll_tokenizer


def load_schema_knob(source: str) -> Dict[str, Any]:
    """--dspark-schema: inline JSON or a file path -> the schema, or KnobError."""
    flag, allowed = "--dspark-schema", "a JSON Schema: inline JSON object or a readable file"
    try:
        if source.lstrip().startswith(("{", "[")):
            schema = bounded.loads_json(source, bounded.SCHEMA)
        else:
            schema = bounded.read_json(source, bounded.SCHEMA)
    except bounded.BoundedError as e:
        raise KnobError(flag, source, allowed, str(e)) from None
    if not isinstance(schema, dict):
        raise KnobError(flag, source, allowed, "a schema must be a JSON object")
    problem = check_schema(schema)
    if problem:
        raise KnobError(flag, source, allowed, problem)
    return schema


def check_schema(schema: Any, timeout_s: float = COMPILE_TIMEOUT_S) -> Optional[str]:
    """None if the schema is valid and compiles; else the reason (one line)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            return f"the schema is not valid JSON: {e.msg}"
        except RecursionError:
            return f"the schema is nested more than {request_limits.MAX_SCHEMA_DEPTH} levels deep"
    problem = _shape_problem(schema)
    if problem:
        return problem
    return _bounded_verdict(_verdicts, json.dumps(schema, sort_keys=True), "xgrammar", _grammar_compiler,
                            _compile_problem, timeout_s,
                            first=lambda: _meta_schema_problem(schema) or xgrammar_unsupported(schema))


def _bounded_verdict(cache: "_Verdicts", text: str, engine: str, load: Callable[[], Any],
                     compile_problem: Callable[[str], Optional[str]], timeout_s: float,
                     first: Optional[Callable[[], Optional[str]]] = None) -> Optional[str]:
    """The cached verdict on `text`; else `first()` (cheap checks), then the engine's compile
    bounded by `timeout_s`. A timeout is not cached: a later request may find it less busy."""
    key = hashlib.sha256(text.encode()).hexdigest()
    with _lock:
        if key in cache:
            return cache[key]
    verdict = first() if first else None
    if verdict is None:
        # Loading the tokenizer and compiler happens once and is not the schema's cost: the
        # bound below covers the compile only (on a busy 2-core machine the load alone took >10 s).
        _pool.submit(load).result()
        future = _pool.submit(compile_problem, text)
        try:
            verdict = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            return f"the grammar engine ({engine}) did not compile the schema within {timeout_s:g} s"
    with _lock:
        cache[key] = verdict
    return verdict


def _shape_problem(schema: Any) -> Optional[str]:
    if not isinstance(schema, (dict, bool)):
        return "a JSON Schema must be an object"
    try:  # before any library that recurses or loops on them
        request_limits.check_schema(schema)
    except request_limits.LimitExceeded as e:
        return str(e)
    return None


def structural_problem(schema: Any) -> Optional[str]:
    """What makes `schema` unusable by any engine (not JSON Schema, over the limits), or None."""
    return _shape_problem(schema) or _meta_schema_problem(schema)


def _meta_schema_problem(schema: Any) -> Optional[str]:
    try:
        import jsonschema
    except ImportError:  # the grammar compiler still checks it
        return None
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        return f"not a valid JSON Schema at {where}: {e.message[:200]}"
    except Exception as e:  # e.g. an unknown $schema draft
        return f"not a valid JSON Schema: {type(e).__name__}: {str(e)[:200]}"
    return None


def _compile_problem(text: str) -> Optional[str]:
    try:
        import xgrammar
    except ImportError:
        return None
    try:
        compiler = _grammar_compiler()
        if compiler is not None:
            compiler.compile_json_schema(text, any_whitespace=False)
        else:
            xgrammar.Grammar.from_json_schema(text, any_whitespace=False)
    except Exception as e:
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        message = _CPP_PREFIX.sub("", message)
        return f"the grammar engine (xgrammar) cannot compile this schema: {message[:300]}"
    return None


# vLLM 0.32 refuses these with one sentence that names nothing ("The provided JSON schema
# contains features not supported by xgrammar"; vllm/v1/structured_output/backend_xgrammar.py,
# has_xgrammar_unsupported_json_features). The same rules, naming the keyword and where.
XGRAMMAR_STRING_FORMATS = ("email", "date", "time", "date-time", "duration", "ipv4", "ipv6", "hostname", "uuid",
                           "uri", "uri-reference", "uri-template", "json-pointer", "relative-json-pointer")


def _types(node: Dict[str, Any]) -> set:
    value = node.get("type")
    if isinstance(value, str):
        return {value}
    return {t for t in value if isinstance(t, str)} if isinstance(value, list) else set()


def _pattern_and_length(node: Any) -> bool:
    return isinstance(node, dict) and ("pattern" in node or "format" in node) and (
        "minLength" in node or "maxLength" in node)


def _unsupported_here(node: Dict[str, Any]) -> Optional[str]:
    types = _types(node)
    if types & {"integer", "number"} and "multipleOf" in node:
        return "multipleOf on a number"
    if "array" in types:
        for key in ("uniqueItems", "contains", "minContains", "maxContains"):
            if key in node:
                return f"{key} on an array"
    if "string" in types and "format" in node and node["format"] not in XGRAMMAR_STRING_FORMATS:
        return f"format {node['format']!r} (supported: {', '.join(XGRAMMAR_STRING_FORMATS)})"
    if "string" in types and _pattern_and_length(node):
        return "pattern or format together with minLength/maxLength on a string"
    if "object" in types and "propertyNames" in node:
        if _pattern_and_length(node.get("propertyNames")):
            return "propertyNames with a pattern/format and a length bound"
        for key in ("patternProperties", "properties"):
            if key in node:
                return f"propertyNames together with {key}"
        if node.get("unevaluatedProperties", True) is not True:
            return "propertyNames together with unevaluatedProperties"
    if "object" in types and isinstance(node.get("patternProperties"), dict):
        if "properties" in node:
            return "patternProperties together with properties"
        if len(node["patternProperties"]) > 1:
            return "more than one patternProperties entry"
    if isinstance(node.get("allOf"), list) and len(node["allOf"]) >= 2:
        return "allOf with more than one branch"
    return None


def _first_node(schema: Any, finds: Callable[[Dict[str, Any]], Optional[str]]) -> Optional[Tuple[str, str]]:
    """(where, what) for the first node, depth first in document order, of which `finds` says
    something; None if none."""
    stack = [((), schema)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, dict):
            found = finds(node)
            if found:
                return ("/" + "/".join(str(p) for p in path) if path else "(root)"), found
            stack.extend(((*path, k), v) for k, v in reversed(list(node.items())) if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in reversed(list(enumerate(node))) if isinstance(v, dict))
    return None


def xgrammar_unsupported(schema: Any) -> Optional[str]:
    """The first keyword vLLM's xgrammar backend refuses, with its location; None if none."""
    first = _first_node(schema, _unsupported_here)
    if first is None:
        return None
    where, problem = first
    return f"the grammar engine (xgrammar, as vLLM 0.32 uses it) does not support {problem}, at {where}"


def length_bounded_string(schema: Any) -> Optional[str]:
    """Where the first string with minLength/maxLength (and neither pattern nor format) is, or None.

    Why: xgrammar 0.2 (vLLM 0.32's) compiles such a string to a bounded repetition of a
    character class that admits raw control characters (U+0000-U+001F), which JSON forbids
    inside a string, and leaves the escapes out (xgrammar issue #800; a plain string is right).
    Sampling (temperature > 0) then writes a raw tab or newline now and then, and the reply check
    withholds the reply. llguidance enforces both the bound and JSON's string syntax, so where
    a replica has it such a schema is served by llguidance (`plan_engine`); else by xgrammar,
    the reply check catching what it lets through."""
    first = _first_node(schema, lambda node: "a length-bounded string" if (
        "string" in _types(node) and ("minLength" in node or "maxLength" in node)
        and not _pattern_and_length(node)) else None)
    return first[0] if first else None


def relax_for_xgrammar(schema: Any) -> Tuple[Any, List[str]]:
    """A copy of `schema` without the keywords vLLM's xgrammar backend refuses, and what was
    dropped ("multipleOf at /properties/n", ...). The grammar then enforces the rest; the
    replica's reply check still validates every finished reply against the original schema,
    so a reply the relaxed grammar allowed but the schema forbids is withheld, never delivered.

    Rules: multipleOf, uniqueItems/contains/minContains/maxContains, an unsupported string
    format and propertyNames are dropped; a pattern/format keeps its pattern and loses its
    length bounds; patternProperties beside properties (or more than one) are dropped (with
    `additionalProperties: false` that only narrows what the grammar allows); allOf with
    several object-like branches is merged into the schema (properties, required, the rest
    first-come); draft-04's boolean exclusiveMinimum/exclusiveMaximum are written as numbers
    (same meaning; the draft-04 `$schema` then goes) — OpenAPI 3.0 documents use them."""
    dropped: List[str] = []
    if not isinstance(schema, dict) or xgrammar_unsupported(schema) is None:
        return schema, dropped
    root = copy.deepcopy(schema)
    stack: List[Tuple[Tuple[Any, ...], Any]] = [((), root)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, list):
            stack.extend(((*path, i), v) for i, v in enumerate(node) if isinstance(v, dict))
            continue
        if not isinstance(node, dict):
            continue
        where = "/" + "/".join(str(p) for p in path) if path else "(root)"
        for _ in range(8):  # a merge can bring a keyword that needs relaxing in turn
            if not _relax_node(node, where, dropped):
                break
        stack.extend(((*path, k), v) for k, v in node.items() if isinstance(v, (dict, list)))
    if any("as a draft-04 boolean" in d for d in dropped) and "draft-04" in str(root.get("$schema", "")):
        root.pop("$schema")  # the bounds are now written as later drafts write them
    return root, dropped


def _relax_node(node: Dict[str, Any], where: str, dropped: List[str]) -> bool:
    def drop(key: str) -> None:
        node.pop(key, None)
        dropped.append(f"{key} at {where}")

    types = _types(node)
    changed = False
    for key, bound in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if isinstance(node.get(key), bool):  # draft-04's form; xgrammar reads only a number here
            if node[key] and bound in node:
                node[key] = node.pop(bound)
            else:
                node.pop(key)
            dropped.append(f"{key} as a draft-04 boolean at {where} (written as a number)")
            changed = True
    if types & {"integer", "number"} and "multipleOf" in node:
        drop("multipleOf")
        changed = True
    if "array" in types:
        for key in ("uniqueItems", "contains", "minContains", "maxContains"):
            if key in node:
                drop(key)
                changed = True
    if "string" in types and "format" in node and node["format"] not in XGRAMMAR_STRING_FORMATS:
        drop("format")
        changed = True
    if "string" in types and _pattern_and_length(node):
        for key in ("minLength", "maxLength"):
            if key in node:
                drop(key)
        changed = True
    if "object" in types and "propertyNames" in node and (
            _pattern_and_length(node.get("propertyNames")) or "patternProperties" in node or "properties" in node
            or node.get("unevaluatedProperties", True) is not True):
        drop("propertyNames")
        changed = True
    if "object" in types and isinstance(node.get("patternProperties"), dict) and (
            "properties" in node or len(node["patternProperties"]) > 1):
        drop("patternProperties")
        changed = True
    branches = node.get("allOf")
    if isinstance(branches, list) and len(branches) >= 2:
        node.pop("allOf")
        dropped.append(f"allOf at {where} (merged)")
        for branch in branches:
            if not isinstance(branch, dict):
                continue
            for key, value in branch.items():
                if key == "properties" and isinstance(value, dict):
                    node.setdefault("properties", {})
                    if isinstance(node["properties"], dict):
                        for name, sub in value.items():
                            node["properties"].setdefault(name, sub)
                elif key == "required" and isinstance(value, list):
                    existing = node.setdefault("required", [])
                    if isinstance(existing, list):
                        existing.extend(v for v in value if v not in existing)
                else:
                    node.setdefault(key, value)
        changed = True
    return changed


# --- llguidance, and which engine serves a request -------------------------------------------

def _llguidance_problem_now(text: str) -> Optional[str]:
    try:
        import llguidance
    except ImportError:
        return "llguidance is not installed"
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults={"whitespace_flexible": False})
        tokenizer = _llguidance_tokenizer()
        error = llguidance.LLMatcher.validate_grammar(grammar, tokenizer)
        if not error and tokenizer is not None:
            matcher = llguidance.LLMatcher(tokenizer, grammar)
            error = matcher.get_error() if matcher.is_error() else ""
    except Exception as e:
        error = str(e) or type(e).__name__
    if not error:
        return None
    first = error.strip().splitlines()[0] if error.strip() else "error"
    return f"the grammar engine (llguidance) cannot compile this schema: {first[:300]}"


def guidance_options(lenient: bool = False, coerce_one_of: bool = False) -> Dict[str, Any]:
    """The `x-guidance` entry for llguidance's JSON options ({} for none): `lenient` ignores
    keywords it cannot enforce; `coerce_one_of` compiles `oneOf` as `anyOf` (it refuses `oneOf`
    whose branches it cannot prove exclusive), so exclusivity is left to the reply check."""
    options = {**(LENIENT if lenient else {}), **({"coerce_one_of": True} if coerce_one_of else {})}
    return {"x-guidance": options} if options else {}


def llguidance_problem(schema: Any, lenient: bool = False, timeout_s: float = COMPILE_TIMEOUT_S,
                       coerce_one_of: bool = False) -> Optional[str]:
    """None if llguidance compiles the schema (with the options of `guidance_options`)."""
    if isinstance(schema, dict):
        schema = {**schema, **guidance_options(lenient, coerce_one_of)}
    return _bounded_verdict(_ll_verdicts, json.dumps(schema, sort_keys=True), "llguidance", _llguidance_tokenizer,
                            _llguidance_problem_now, timeout_s)


def _has_pattern_properties(schema: Any) -> bool:
    # vLLM's frontend sends such schemas to outlines, not llguidance
    # (has_guidance_unsupported_json_features), so llguidance cannot be chosen for them.
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            if "patternProperties" in node:
                return True
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return False


_ANY_KEY = {".*", "^.*$", "^.*", ".*$", ".+", "^.+$", "^.+", ""}


def _without_pattern_properties(schema: Any) -> Any:
    """`schema` with every `patternProperties` taken out: a pattern that matches any key becomes
    `additionalProperties` (where that is not set), the others are dropped (their keys are then
    free: a relaxation the reply check makes up for)."""
    if isinstance(schema, list):
        return [_without_pattern_properties(v) for v in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _without_pattern_properties(v) for k, v in schema.items() if k != "patternProperties"}
    patterns = schema.get("patternProperties")
    if isinstance(patterns, dict):
        anything = [v for k, v in patterns.items() if k in _ANY_KEY]
        if len(anything) == 1 and len(patterns) == 1 and "additionalProperties" not in schema:
            out["additionalProperties"] = _without_pattern_properties(anything[0])
        elif schema.get("additionalProperties") is False:
            out.pop("additionalProperties")  # keys the patterns allowed must stay possible
    return out


def _frontend_takes_xgrammar(schema: Dict[str, Any]) -> bool:
    """vLLM's frontend ("auto") keeps a schema on xgrammar when xgrammar parses it without a
    vocabulary (validate_xgrammar_grammar); else it goes to llguidance, or to outlines when it
    has patternProperties."""
    if xgrammar_unsupported(schema) is not None:
        return False
    try:
        import xgrammar

        xgrammar.Grammar.from_json_schema(json.dumps(schema))
    except Exception:  # not installed, or xgrammar cannot parse it
        return False
    return True


@dataclass
class EnginePlan:
    """How one request's schema is served: `grammar_schema` goes to vLLM (the reply check
    always uses the original), `engine` is who compiles it, `dropped` what the grammar does not
    enforce (relaxed keywords; "lenient" for llguidance's lenient mode), `problem` a 400."""
    engine: str = "xgrammar"
    grammar_schema: Any = None
    dropped: List[str] = field(default_factory=list)
    problem: Optional[str] = None
    # Where the schema was said again in an equivalent form (`normalize`): exact all the same.
    normalized: List[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return not self.dropped


def _llguidance_plan(schema: Any, marked: bool, allow_lenient: bool) -> Optional[EnginePlan]:
    # Unmarked, vLLM's frontend would hand a schema with patternProperties to outlines; marked,
    # the engine's manager uses llguidance whatever the frontend chose (llguidance 1.7 compiles
    # patternProperties).
    if not isinstance(schema, dict) or (_has_pattern_properties(schema) and not (
            marked and _frontend_takes_xgrammar(schema))):
        return None
    mark = {ENGINE_MARK: "llguidance"} if marked else {}
    exact = llguidance_problem(schema)
    if exact is None:
        return EnginePlan("llguidance", {**schema, **mark}, [])
    if not allow_lenient:
        return None
    # Not exact: the reply check judges what the grammar lets through (middleware.py).
    coerce = "oneOf" in exact  # "oneOf constraints are not supported. Enable 'coerce_one_of' ..."
    tries = ([(False, True, ["oneOf as anyOf"])] if coerce else []) + [(True, coerce, ["lenient"] + (
        ["oneOf as anyOf"] if coerce else []))]
    for lenient, coerce_one_of, dropped in tries:
        if llguidance_problem(schema, lenient=lenient, coerce_one_of=coerce_one_of) is None:
            return EnginePlan("llguidance", {**schema, **guidance_options(lenient, coerce_one_of), **mark}, dropped)
    return None


def plan_engine(schema: Any, engines: Sequence[str], relax: bool = True) -> EnginePlan:
    """The first attempt. A 400 when a `oneOf` leaves no document valid, and a `oneOf` with an
    always-true branch planned as the negation of the others (`one_of`); a 400 when a node every
    document reaches admits no value of its `enum` (`enum_type`). Then xgrammar when it
    supports and compiles the schema exactly (where an `enum` has values its `type` excludes,
    which xgrammar ignores: llguidance, else xgrammar on `enum_type.narrowed`; where a string has
    a length bound, which xgrammar serves with raw control characters: llguidance when it
    compiles the schema exactly, `length_bounded_string`); else
    llguidance when it compiles it exactly; else llguidance lenient, then xgrammar relaxed, then
    llguidance with patternProperties taken out (`_without_pattern_properties`)
    (every reply, streamed or not, is checked before its end is delivered: middleware.py,
    stream_check.py); else a 400 naming the first engine's reason."""
    dual = "llguidance" in engines
    problem = check_schema(schema)  # cached per schema; a shape problem (limits) comes first
    if problem is not None and structural_problem(schema):  # no engine helps
        return EnginePlan(problem=problem)
    if isinstance(schema, dict):  # within the request limits: the walks below are bounded
        impossible = one_of.unsatisfiable(schema) or enum_type.unsatisfiable(schema)
        if impossible:
            return EnginePlan(problem=impossible)
        rewritten, notes = one_of.rewrite(schema)
        if notes:  # a oneOf with an always-true branch: the negation of the others
            plan = plan_engine(rewritten, engines, relax)
            if not plan.problem:
                return replace(plan, dropped=list(plan.dropped) + notes)
        said, rewrites = normalize.normalized(schema)
        if rewrites:  # the same schema in forms the engines read as JSON Schema does
            plan = plan_engine(said, engines, relax)
            if not plan.problem:
                return replace(plan, normalized=list(plan.normalized) + rewrites)
    if problem is None:
        found = enum_type.conflict(schema) if isinstance(schema, dict) else None
        if found:
            return _enum_type_plan(schema, dual, found)
        if dual and length_bounded_string(schema) is not None:  # xgrammar admits control characters there
            plan = _llguidance_plan(schema, marked=True, allow_lenient=False)
            if plan is not None:
                return plan
        return EnginePlan("xgrammar", schema, [])
    unsupported = xgrammar_unsupported(schema)
    if dual:
        # xgrammar refused it (vLLM's frontend then picks llguidance itself) or cannot compile
        # it (the annotation makes the engine use llguidance).
        plan = _llguidance_plan(schema, marked=unsupported is None, allow_lenient=relax)
        if plan is not None:
            return plan
    if relax and unsupported is not None:
        plan = _relaxed_plan(schema)
        if plan is not None:
            return plan
    if dual and relax and _has_pattern_properties(schema):
        # Last: the grammar without patternProperties, which vLLM's frontend lets reach
        # llguidance (with them it goes to outlines); the reply is checked against the original.
        plan = _llguidance_plan(_without_pattern_properties(schema), marked=True, allow_lenient=True)
        if plan is not None:
            return replace(plan, dropped=list(plan.dropped) + ["patternProperties as additionalProperties"])
    if dual and isinstance(schema, dict):
        other = llguidance_problem(schema)
        if other:
            problem = f"{problem}; and {other}"
    return EnginePlan(problem=problem)


def _enum_type_plan(schema: Dict[str, Any], dual: bool, found: str) -> EnginePlan:
    """xgrammar ignores `type` beside `enum`/`const` (enum_type.py; `found`: the first such
    node): llguidance, which reads them as JSON Schema does, where the replica has it; else
    xgrammar on the narrowed form (exact unless a node is left with no value its type admits)."""
    if dual:
        plan = _llguidance_plan(schema, marked=True, allow_lenient=False)
        if plan is not None:
            return plan
    narrowed, notes = enum_type.narrowed(schema)
    if notes and check_schema(narrowed) is None:
        left = enum_type.conflict(narrowed)
        return EnginePlan("xgrammar", narrowed, [left] if left else [])
    return EnginePlan("xgrammar", schema, [found])


def second_plan(schema: Any, first: EnginePlan, engines: Sequence[str]) -> Optional[EnginePlan]:
    """The other engine for one more attempt after the first reply failed the check, or None."""
    if first.engine == "xgrammar" and "llguidance" in engines:
        return _llguidance_plan(schema, marked=True, allow_lenient=True)
    if first.engine == "llguidance":
        if check_schema(schema) is None:
            return EnginePlan("xgrammar", enum_type.narrowed(schema)[0], [])
        return _relaxed_plan(schema)
    return None


def narrowed_plan(schema: Any, content: str, engines: Sequence[str]) -> Optional[EnginePlan]:
    """One more attempt after a reply broke a `oneOf` by satisfying several of its branches (a
    `oneOf` served as `anyOf`, or an engine that cannot prove branches exclusive): the plan for
    `narrowed_schema`. The reply is still checked against the original schema. None when there
    is nothing to narrow or the narrowed schema has no engine."""
    narrowed = narrowed_schema(schema, content)
    if narrowed is None:
        return None
    plan = plan_engine(narrowed, engines)
    if plan.problem:
        return None
    return replace(plan, dropped=list(plan.dropped) + ["oneOf narrowed to the branch the first reply matched"])


def narrowed_schema(schema: Any, content: str) -> Optional[Any]:
    """`schema` with each `oneOf` the reply `content` broke (it satisfied several branches)
    replaced by what says "this branch and no other" (`_one_branch_only`): every document it
    admits satisfies exactly one branch there. None when there is nothing to narrow (or a
    `$ref` on the way)."""
    overlaps = reply_check.one_of_overlaps(content, schema)
    if not overlaps:
        return None
    narrowed = copy.deepcopy(schema)
    for path, matched in overlaps:
        node = narrowed
        for step in path[:-1]:
            if step == "$ref" or not isinstance(node, (dict, list)):
                return None
            try:
                node = node[step]
            except (KeyError, IndexError, TypeError):
                return None
        if not isinstance(node, dict) or not isinstance(node.get(path[-1]), list):
            return None
        branches = node.pop(path[-1])
        node["allOf"] = list(node.get("allOf") or []) + _one_branch_only(branches, matched)
    return narrowed


def _one_branch_only(branches: List[Any], matched: List[int]) -> List[Any]:
    """What the narrowed `oneOf` asserts instead (an `allOf` to add): a matched branch closed to
    its own properties where that rules out every other matched branch (`_exclusive_branch`);
    else a matched branch beside one failing form of each other branch it does not exclude by
    construction (`one_of.exclusive`, `one_of.failing_beside`), so that exactly it holds; else
    the first matched branch closed."""
    chosen = _exclusive_branch([branches[i] for i in matched])
    if _rules_out(_closed(chosen), [branches[i] for i in matched if branches[i] is not chosen]):
        return [_closed(chosen)]
    for i in matched:
        failing = [one_of.failing_beside(other, branches[i]) for j, other in enumerate(branches)
                   if j != i and not one_of.exclusive(branches[i], other)]
        if all(f is not None for f in failing):
            return [branches[i], *failing]
    return [_closed(chosen)]


def _rules_out(closed: Any, others: List[Any]) -> bool:
    """`closed` (additionalProperties false) leaves out a key each of `others` requires."""
    if not isinstance(closed, dict) or closed.get("additionalProperties") is not False:
        return False
    declared = set(closed.get("properties") or {})
    return all(isinstance(o, dict) and set(o.get("required") or []) - declared for o in others)


def _closed(branch: Any) -> Any:
    """An object branch closed to its own properties, with its discriminating properties (a
    `const` or an `enum`) required: what tells it from its sibling branches must be written."""
    if not isinstance(branch, dict) or not isinstance(branch.get("properties"), dict):
        return branch
    out = dict(branch)
    if not any(key in branch for key in ("additionalProperties", "patternProperties", "unevaluatedProperties")):
        out["additionalProperties"] = False
    tags = [name for name, sub in branch["properties"].items() if isinstance(sub, dict) and ("const" in sub or "enum" in sub)]
    required = list(branch.get("required") or [])
    if tags and isinstance(branch.get("required", []), list):
        out["required"] = required + [name for name in tags if name not in required]
    return out


def _exclusive_branch(branches: List[Any]) -> Any:
    """The first branch whose declared properties leave out a key every other branch requires."""
    def declared(branch):
        return set(branch.get("properties") or {}) if isinstance(branch, dict) else set()

    def required(branch):
        return set(branch.get("required") or []) if isinstance(branch, dict) else set()

    for i, branch in enumerate(branches):
        if all(required(other) - declared(branch) for j, other in enumerate(branches) if j != i):
            return branch
    return branches[0]


def _relaxed_plan(schema: Any) -> Optional[EnginePlan]:
    """xgrammar with what vLLM's xgrammar backend refuses dropped, when that compiles."""
    relaxed, dropped = relax_for_xgrammar(schema)
    if not dropped:
        return None
    relaxed = enum_type.narrowed(relaxed)[0]  # and what xgrammar reads otherwise than JSON Schema
    return EnginePlan("xgrammar", relaxed, dropped) if check_schema(relaxed) is None else None
