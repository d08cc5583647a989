"""Two structured-output engines in one vLLM engine: xgrammar and llguidance, chosen per request.

vLLM 0.32's V1 engine builds ONE structured-output backend, from the first structured request
(`StructuredOutputManager.grammar_init`), so its frontend's `auto` choice (xgrammar when it
supports the schema, llguidance otherwise) does not really mix engines: a later request
that asked for the other engine is compiled by the first one. Installed by the drafting
layer's scheduler (`install`), the manager here keeps xgrammar as its primary backend (the
batch's token bitmask is allocated by it) and compiles a request with llguidance when
  - vLLM's frontend chose guidance for it (`_backend == "guidance"`: the schema has features
    xgrammar refuses), or
  - the replica's middleware asked for it with the annotation `"x-dspark-engine": "llguidance"`
    at the top of the schema (the second attempt after a withheld reply); the annotation is
    removed before either engine sees the schema.
Both engines use the same bitmask layout (int32 words, bit i of word i//32); llguidance is
used only when its width for this vocabulary equals xgrammar's.

The drafting layer walks whichever engine serves a request: `walker_for(grammar)` gives an
xgrammar or an llguidance walker with the same interface (draft_builder.GrammarWalker), so
grammar-forced drafts work for both.

Both backends are built with compact whitespace (`disable_any_whitespace`, which vLLM's config
accepts only with one named backend, not with "auto").

vLLM internals: what is used is named in the vLLM seam (worker/vllm_seam/names.py) and checked at start.
"""

import json
import logging
import threading
from typing import Any, Optional, Tuple

from gpustack_dspark.worker import vllm_seam

logger = logging.getLogger("vllm.dspark.engines")

MARK = "x-dspark-engine"
XGRAMMAR, LLGUIDANCE = "xgrammar", "llguidance"


def split_mark(spec: Any) -> Tuple[Optional[str], Any]:
    """(engine asked for by the annotation or None, the spec without it). Pure."""
    if not isinstance(spec, str) or MARK not in spec:
        return None, spec
    try:
        schema = json.loads(spec)
    except (ValueError, RecursionError):
        return None, spec
    if not isinstance(schema, dict) or MARK not in schema:
        return None, spec
    engine = schema.pop(MARK)
    return (engine if engine in (XGRAMMAR, LLGUIDANCE) else None), json.dumps(schema)


def choose(frontend_backend: Optional[str], marked: Optional[str]) -> str:
    """Which engine compiles a request. Pure. vLLM's frontend falls back to outlines for
    schemas neither xgrammar nor llguidance takes (patternProperties beside refused keywords);
    the replica's middleware never sends those (it relaxes them for xgrammar), and anything else
    that gets here is refused rather than compiled by an engine that would not enforce it."""
    if marked is not None:
        return marked
    if frontend_backend in (None, "xgrammar", "auto"):
        return XGRAMMAR
    if frontend_backend == "guidance":
        return LLGUIDANCE
    raise ValueError(f"structured-output backend {frontend_backend!r} is not served by this replica "
                     f"(it serves {XGRAMMAR} and {LLGUIDANCE})")


def _manager_class(base):
    class DualEngineManager(base):
        """vLLM's StructuredOutputManager with xgrammar and llguidance side by side."""

        def grammar_init(self, request) -> None:
            if request.structured_output_request is not None and self.backend is None:
                self._dspark_primary()
            # vLLM 0.33 refuses a request whose backend differs from `backend_name` (one backend
            # per engine). This manager serves both engines, chosen per request (_create_grammar),
            # so the name stays unset on purpose: the guard never applies here. 0.32 has no guard.
            self.backend_name = None
            return super().grammar_init(request)

        def _dspark_primary(self):
            self.backend = vllm_seam.resolve("XgrammarBackend")(self.vllm_config, tokenizer=self.tokenizer,
                                           vocab_size=self.vllm_config.model_config.get_vocab_size())
            self.backend.disable_any_whitespace = True  # compact JSON (vLLM allows the flag only per backend)
            return self.backend

        def _dspark_guidance(self):
            with self._dspark_lock:
                if self._dspark_guidance_backend is None and self._dspark_guidance_problem is None:
                    try:
                        backend = vllm_seam.resolve("GuidanceBackend")(self.vllm_config, tokenizer=self.tokenizer,
                                                  vocab_size=self.vllm_config.model_config.get_vocab_size())
                        backend.disable_any_whitespace = True
                        ours = backend.allocate_token_bitmask(1).shape[-1]
                        primary = self.backend.allocate_token_bitmask(1).shape[-1]  # set by grammar_init
                        if ours != primary:
                            raise ValueError(f"bitmask width {ours} words, xgrammar's is {primary}")
                        self._dspark_guidance_backend = backend
                    except Exception as e:
                        self._dspark_guidance_problem = f"{type(e).__name__}: {e}"
                        logger.error("DSpark: llguidance is not usable in this engine: %s",
                                     self._dspark_guidance_problem)
                if self._dspark_guidance_backend is None:
                    raise RuntimeError(f"llguidance is not usable here: {self._dspark_guidance_problem}")
                return self._dspark_guidance_backend

        def _create_grammar(self, request):
            struct_request = request.structured_output_request
            request_type, spec = struct_request.structured_output_key
            marked, spec = split_mark(spec)
            params = request.sampling_params
            frontend = getattr(getattr(params, "structured_outputs", None), "_backend", None)
            try:
                engine = choose(frontend, marked)
            except ValueError:
                logger.exception("Refused grammar for request %s", request.request_id)
                raise
            if engine == XGRAMMAR and marked is None:
                return super()._create_grammar(request)
            try:
                backend = self._dspark_guidance() if engine == LLGUIDANCE else self.backend
                grammar = backend.compile_grammar(
                    request_type, spec, stop_token_ids=params.all_stop_token_ids if params is not None else None)
            except Exception:
                logger.exception("Failed to compile grammar for request %s with %s", request.request_id, engine)
                raise
            return grammar

    DualEngineManager.__qualname__ = DualEngineManager.__name__ = "DualEngineManager"
    return DualEngineManager


_classes: dict = {}


def install(manager) -> None:
    """Turn vLLM's manager into the dual-engine one (in place: the engine core holds it)."""
    base = type(manager)
    if base.__name__ == "DualEngineManager":
        return
    cls = _classes.get(base)
    if cls is None:
        cls = _classes[base] = _manager_class(base)
    manager._dspark_lock = threading.Lock()
    manager._dspark_guidance_backend = None
    manager._dspark_guidance_problem = None
    manager.__class__ = cls


class XgrammarWalker:
    """draft_builder.GrammarWalker over an xgrammar matcher."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size

    def accept_token(self, token: int) -> bool:
        return bool(self.matcher.accept_token(token))

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def find_jump_forward_string(self) -> str:
        # xgrammar refuses (raises) once the stop token is in.
        return "" if self.matcher.is_terminated() else self.matcher.find_jump_forward_string()

    def is_completed(self) -> bool:
        return self.matcher.is_completed() and not self.matcher.is_terminated()

    def is_terminated(self) -> bool:
        return self.matcher.is_terminated()

    def only_allowed_token(self) -> Optional[int]:
        import numpy as np
        import xgrammar

        bitmask = xgrammar.allocate_token_bitmask(1, self.vocab_size)
        self.matcher.fill_next_token_bitmask(bitmask)
        return _single_bit(np.unpackbits(bitmask.numpy().view(np.uint8), bitorder="little")[: self.vocab_size])


class LLGuidanceWalker:
    """draft_builder.GrammarWalker over an llguidance matcher. Tokens are tried with
    `try_consume_tokens` (a refused token leaves the matcher as it was, like xgrammar's
    accept_token; `consume_token` would put it into an error state)."""

    def __init__(self, matcher, vocab_size: int) -> None:
        self.matcher, self.vocab_size = matcher, vocab_size

    def accept_token(self, token: int) -> bool:
        return not self.matcher.is_stopped() and self.matcher.try_consume_tokens([token]) == 1

    def rollback(self, num_tokens: int) -> None:
        if num_tokens:
            self.matcher.rollback(num_tokens)

    def find_jump_forward_string(self) -> str:
        if self.matcher.is_stopped():
            return ""
        # The forced bytes can end inside a multi-byte character: only whole characters count.
        return self.matcher.compute_ff_bytes().decode("utf-8", errors="ignore")

    def is_completed(self) -> bool:
        return self.matcher.is_accepting() and not self.matcher.is_stopped()

    def is_terminated(self) -> bool:
        return self.matcher.is_stopped()

    def only_allowed_token(self) -> Optional[int]:
        import numpy as np

        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        return _single_bit(bits[: self.vocab_size])


def _single_bit(bits) -> Optional[int]:
    import numpy as np

    allowed = np.flatnonzero(bits)
    return int(allowed[0]) if len(allowed) == 1 else None


def walker_for(grammar, vocab_size: int):
    """The walker for a compiled grammar of either engine, or None (another engine's grammar)."""
    matcher = getattr(grammar, "matcher", None)
    if matcher is not None:
        return XgrammarWalker(matcher, vocab_size)
    ll_matcher = getattr(grammar, "ll_matcher", None)
    if ll_matcher is not None:
        return LLGuidanceWalker(ll_matcher, vocab_size)
    return None
