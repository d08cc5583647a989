"""Is a JSON Schema usable? Checked with the real tools: jsonschema's meta-schema and the
xgrammar compiler vLLM uses, in bounded time, with the verdict cached per schema.

A schema xgrammar cannot compile must get a clear 400, never unconstrained output.
"""

import concurrent.futures
import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any, Dict, Optional

from gpustack_dspark.knobs import KnobError
from gpustack_dspark.worker import request_limits

COMPILE_TIMEOUT_S = 10.0
# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:NN: ".
_CPP_PREFIX = re.compile(r"^\[[0-9:]+\] \S+:\d+: ")
_pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="dspark-schema")
_verdicts: Dict[str, Optional[str]] = {}
_lock = threading.Lock()
# The model's tokenizer: xgrammar can parse some schemas it then fails to compile against a
# vocabulary (vLLM answers those with a 500), so the check compiles like vLLM does.
_tokenizer_source: Dict[str, Any] = {}
_compiler: Any = None


def use_model_tokenizer(model_path: str, vocab_size: Optional[int]) -> None:
    """Compile schemas against this model's vocabulary (as vLLM's xgrammar backend does)."""
    global _compiler
    _tokenizer_source.update(path=model_path, vocab_size=vocab_size)
    _compiler = None


def _grammar_compiler():
    global _compiler
    if _compiler is None and _tokenizer_source.get("path"):
        try:
            import xgrammar
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(_tokenizer_source["path"])
            info = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=_tokenizer_source.get("vocab_size"))
            _compiler = xgrammar.GrammarCompiler(info, max_threads=1)
        except Exception:  # no tokenizer in the folder: the grammar parse is the best check left
            _tokenizer_source.clear()
    return _compiler


def load_schema_knob(source: str) -> Dict[str, Any]:
    """--dspark-schema: inline JSON or a file path -> the schema, or KnobError."""
    flag, allowed = "--dspark-schema", "a JSON Schema: inline JSON object or a readable file"
    text = source
    if not source.lstrip().startswith(("{", "[")):
        try:
            text = Path(source).read_text()
        except OSError as e:
            raise KnobError(flag, source, allowed, f"cannot read the file: {e.strerror}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as e:
        raise KnobError(flag, source, allowed, f"not valid JSON: {e.msg} at line {e.lineno}") from None
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
    if not isinstance(schema, (dict, bool)):
        return "a JSON Schema must be an object"
    try:  # before any library that recurses or loops on them
        request_limits.check_schema(schema)
    except request_limits.LimitExceeded as e:
        return str(e)
    text = json.dumps(schema, sort_keys=True)
    key = hashlib.sha256(text.encode()).hexdigest()
    with _lock:
        if key in _verdicts:
            return _verdicts[key]
    verdict = _meta_schema_problem(schema)
    if verdict is None:
        future = _pool.submit(_compile_problem, text)
        try:
            verdict = future.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:
            # Not cached: a later request may find the compiler less busy.
            return f"the grammar engine (xgrammar) did not compile the schema within {timeout_s:g} s"
    with _lock:
        _verdicts[key] = verdict
    return verdict


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
