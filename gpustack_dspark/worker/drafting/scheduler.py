"""vLLM glue: the engine-core scheduler class that builds DSpark drafts (`--scheduler-cls`).

vLLM (V1 engine, synchronous scheduling) hands the drafter's tokens to
`Scheduler.update_draft_token_ids` after each step, in the engine-core process, where every
request's grammar matcher lives. Here, for requests with a grammar, the draft is rebuilt by
`draft_builder`: grammar-forced tokens first, statistical tokens after them. vLLM then
verifies the draft with the target model as usual, so the output is what the target model
produces without speculation. Requests without a grammar keep vLLM's own drafts.

These are vLLM internals (not a public interface), named in the vLLM seam
(`worker/vllm_seam/names.py`): `check_vllm_internals` lists what is missing and the class
refuses to start when anything is.
"""

import dataclasses
import functools
import logging
import os
import random
import time
from collections import OrderedDict
from typing import Any, Dict, Hashable, List, Optional, Sequence

from gpustack_dspark.translate import DraftingConfig
from gpustack_dspark.worker import vllm_seam
from gpustack_dspark.worker.drafting import budget_step, draft_builder, draft_probs, engines, prompt_copy, verifier_rows
from gpustack_dspark.worker.drafting.ngram_index import (HISTORY, PROMPT, REPLY, RequestHistory, SharedHistory,
                                                        interpolated, predict, source, tail)
from gpustack_dspark.worker.drafting.stats import STATS_FILE_ENV, DraftingCounters, StatsWriter

# Under vLLM's logger tree: the engine-core process configures only vLLM's loggers.
logger = logging.getLogger("vllm.dspark.drafting")

MAX_N = 4
NGRAM_KINDS = (draft_builder.STATISTICAL, draft_builder.SAMPLED)  # the kinds whose tokens have a source
SAMPLING_EPS = 1e-5  # vLLM's: a temperature below it is greedy
ENCODE_CACHE_SIZE = 4096
GRAMMARS_REMEMBERED = 1024  # structured-output keys counted as compiled (about xgrammar's cache)


def check_vllm_internals() -> List[str]:
    """Everything missing, as readable lines; empty when this vLLM is a supported series with
    every internal the layer uses (the vLLM seam's table, worker/vllm_seam/names.py)."""
    return vllm_seam.problems()


def layer_config(vllm_config) -> DraftingConfig:
    return DraftingConfig.from_vllm(getattr(vllm_config, "additional_config", None), vllm_config.speculative_config)


def _scheduler_base():
    return vllm_seam.resolve("Scheduler")


class DraftingLayer:
    """Per-engine state of the layer: histories, counters, the tokenizer cache."""

    def __init__(self, config: DraftingConfig, tokenizer, vocab_size: int) -> None:
        mode = config.mode
        self.policy = draft_builder.DraftPolicy(
            length=config.length, threshold=config.threshold,
            forced="forced" in mode, statistical="statistical" in mode)
        self.base_method = config.base_method
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self.counters = DraftingCounters()
        self.writer = StatsWriter(os.environ.get(STATS_FILE_ENV))
        self.shared = SharedHistory(MAX_N, config.shared_history)
        self.histories: Dict[str, RequestHistory] = {}
        self.kinds: Dict[str, List[str]] = {}
        self.sources: Dict[str, List[str]] = {}  # request id -> its last draft's tokens' sources
        self.confs: Dict[str, List[float]] = {}
        self.budget = budget_step.BudgetGlue(config.length) if config.budget else None
        self.clock = StepClock(self.counters)
        self.seen: Dict[str, bool] = {}
        self.over_llguidance: set = set()
        self._encode_cache: "OrderedDict[str, Sequence[int]]" = OrderedDict()
        self._grammars: "OrderedDict[Hashable, None]" = OrderedDict()  # structured-output keys seen
        self._texts: Dict[int, str] = {}
        self._spellings: Optional[draft_builder.Spellings] = None
        # Sampled drafts (temperature > 0): on where the runner takes their distributions.
        self.sampled_drafts = config.sampled_drafts and draft_probs.available()
        self.rngs: Dict[str, random.Random] = {}
        self.calibration = draft_builder.Calibration()
        self.scales: Dict[str, float] = {}  # request id -> the calibration its last draft used
        self._rng = random.Random()
        self.dists: Dict[str, Any] = {}  # request id -> (draft tokens, per-token distribution or None)
        # The verifier's distributions at sampled positions, per sampling setting (verifier_rows.py).
        self.verifier = verifier_rows.Tables() if self.sampled_drafts and config.verifier_rows else None
        self.copies = config.prompt_copy
        self.value_ends = prompt_copy.ValueEnds()  # where copied values end, learned from the replies

    def spellings(self) -> draft_builder.Spellings:
        """The vocabulary's token texts, indexed once (a few ms per 10k tokens)."""
        if self._spellings is None:
            try:
                size = min(self.vocab_size, len(self.tokenizer))
            except TypeError:
                size = self.vocab_size
            self._spellings = draft_builder.Spellings((token, self.token_text(token)) for token in range(size))
        return self._spellings

    def encode(self, text: str) -> Sequence[int]:
        cached = self._encode_cache.get(text)
        if cached is None:
            cached = tuple(self.tokenizer.encode(text, add_special_tokens=False))
            self._encode_cache[text] = cached
            if len(self._encode_cache) > ENCODE_CACHE_SIZE:
                self._encode_cache.popitem(last=False)
        return cached

    def token_text(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tokenizer.decode([token])
        return text

    def note_request(self, request_id: str, has_grammar: bool, over_llguidance: bool = False,
                     request: Any = None) -> None:
        """Counts a request once, on its first sight (called every step it is scheduled); its
        grammar key is read from the vLLM `request` only then."""
        if over_llguidance and request_id not in self.over_llguidance:
            self.over_llguidance.add(request_id)
            self.counters.requests_drafted_over_llguidance += 1
        if request_id in self.seen:
            return
        self.seen[request_id] = has_grammar
        if has_grammar:
            self.counters.requests_with_grammar += 1
            grammar_key = _grammar_key(request)  # None without one (or without a request)
            if grammar_key is not None:
                # A grammar new to this replica was compiled for it; a known one came from the
                # compiler's cache (xgrammar and llguidance keep them): what affinity routing saves.
                if grammar_key in self._grammars:
                    self._grammars.move_to_end(grammar_key)
                    self.counters.grammar_reuses += 1
                else:
                    self._grammars[grammar_key] = None
                    self.counters.grammar_compiles += 1
                    if len(self._grammars) > GRAMMARS_REMEMBERED:
                        self._grammars.popitem(last=False)
        else:
            self.counters.requests_without_grammar += 1
            logger.info("DSpark drafting off for request %s: it has no grammar (vLLM's %s drafts used as they are)",
                        request_id, self.base_method)

    def draft_for(self, request, walker, base_draft: Sequence[int],
                  length: Optional[int] = None) -> draft_builder.Draft:
        history = self.histories.get(request.request_id)
        if history is None:
            history = self.histories[request.request_id] = RequestHistory(MAX_N, request.num_prompt_tokens)
        tokens = request.all_token_ids
        history.update(tokens)
        indexes = (history.prompt, history.reply, self.shared.index)
        copy = self.copier(history, tokens) if self.copies else None
        copied: Dict[int, int] = {}  # draft position -> the token copied from the prompt's text there

        def copied_token(draft_so_far: List[int]):
            if copy is None:
                return None
            guess = copy.proposal([self.token_text(t) for t in draft_so_far], self.encode)
            if guess is not None:
                copied[len(draft_so_far)] = guess[0]
            return guess

        def next_token(draft_so_far: List[int]):
            return copied_token(draft_so_far) or predict(tail(tokens, draft_so_far, MAX_N), indexes)

        sampler = None
        if self.sampled_drafts and _samples(request):
            scale = self.scales[request.request_id] = self.calibration.ratio()
            table = (self.verifier.get(verifier_rows.setting_of(request.sampling_params))
                     if self.verifier is not None else None)

            def propose(draft_so_far: List[int]):
                context = tail(tokens, draft_so_far, MAX_N)
                if table is None:
                    counted = interpolated(context, indexes)
                else:
                    counted = table.proposal(context, lambda: interpolated(context, indexes))
                return prompt_copy.mixed(copied_token(draft_so_far), counted)

            sampler = draft_builder.Sampler(propose, self.rng_for(request), scale=scale)
        policy = self.policy if length is None else dataclasses.replace(self.policy, length=length)
        draft = draft_builder.build_draft(walker, self.encode, next_token, policy, self.token_text, self.spellings(),
                                          sampler)
        self.counters.drafts += 1
        self.counters.drafts_cut_by_threshold += int(draft.cut_by_threshold)
        # A draft-model base drafts from this very position: its tokens beat n-gram guesses
        # when the grammar forces nothing here.
        if (self.base_method == "draft_model" and base_draft
                and (not draft.kinds or draft.kinds[0] != draft_builder.FORCED)):
            return draft_builder.Draft(list(base_draft)[:policy.length], ["base"] * len(base_draft[:policy.length]))
        named = ((PROMPT, history.prompt), (REPLY, history.reply), (HISTORY, self.shared.index))
        self.sources[request.request_id] = [
            (kind if kind not in NGRAM_KINDS else PROMPT if copied.get(position) == token
             else source(tail(tokens, draft.tokens[:position], MAX_N), token, named))
            for position, (token, kind) in enumerate(zip(draft.tokens, draft.kinds))]
        return draft

    def copier(self, history: RequestHistory, tokens: Sequence[int]) -> prompt_copy.PromptCopy:
        """The request's text copier (prompt_copy.py), fed the reply's tokens since its last draft."""
        copy = history.copy
        if copy is None:
            copy = history.copy = prompt_copy.PromptCopy(
                "".join(self.token_text(t) for t in tokens[:history.prompt_len]), self.value_ends)
        start = history.prompt_len + copy.fed
        if len(tokens) > start:
            copy.feed([(t, self.token_text(t)) for t in tokens[start:]])
        return copy

    def rng_for(self, request) -> random.Random:
        """The request's own draw stream when it has a seed (the same seed and the same
        histories give the same drafts), else the layer's."""
        seed = getattr(getattr(request, "sampling_params", None), "seed", None)
        if seed is None:
            return self._rng
        rng = self.rngs.get(request.request_id)
        if rng is None:
            rng = self.rngs[request.request_id] = random.Random(seed)
        return rng

    def record_verified(self, request_id: str, num_scheduled: int, num_generated: int) -> None:
        kinds = self.kinds.pop(request_id, None)
        sources = self.sources.pop(request_id, None) or []
        confs = self.confs.pop(request_id, None) or []
        if num_generated > 0:
            self.counters.target_forward_passes += 1
            self.counters.output_tokens += num_generated
        if not kinds or not num_scheduled:
            return
        accepted = max(num_generated - 1, 0)
        if self.budget is not None and num_generated > 0:
            self.budget.budget.acceptance.observe(kinds, confs, num_scheduled, accepted)
        counters = self.counters
        scale = self.scales.get(request_id) or 1.0
        for position, kind in enumerate(kinds[:num_scheduled]):
            if kind == draft_builder.SAMPLED and position <= accepted and position < len(confs):
                self.calibration.observe(confs[position] / scale, position < accepted)
            names = [kind]
            if kind in NGRAM_KINDS and position < len(sources):
                names.append(sources[position])  # prompt, reply, history or learned
            for name in names:
                _bump(counters, f"{name}_proposed")
                if position < accepted:
                    _bump(counters, f"{name}_accepted")
                elif position == accepted:
                    _bump(counters, f"{name}_rejected")

    def learn(self, request, draft: Sequence[int], rows: Dict[int, verifier_rows.Row]) -> None:
        """The verifier's rows at `request`'s sampled positions of the step just verified (its
        tokens not yet extended by the step), each after the draft's tokens before it."""
        if self.verifier is None or request is None:
            return
        table = self.verifier.get(verifier_rows.setting_of(request.sampling_params))
        tokens = request.all_token_ids
        for position, row in sorted(rows.items()):
            table.add(tail(tokens, list(draft[:position]), MAX_N), row)
            self.counters.verifier_rows += 1

    def finish(self, request) -> None:
        rid = request.request_id
        self.histories.pop(rid, None)
        self.rngs.pop(rid, None)
        self.scales.pop(rid, None)
        self.dists.pop(rid, None)
        self.kinds.pop(rid, None)
        self.sources.pop(rid, None)
        self.confs.pop(rid, None)
        self.over_llguidance.discard(rid)
        if self.seen.pop(rid, False):
            self.shared.add_output(list(request.output_token_ids))


def _samples(request) -> bool:
    params = getattr(request, "sampling_params", None)
    return params is not None and (params.temperature or 0.0) >= SAMPLING_EPS


def _bump(counters: DraftingCounters, name: str) -> None:
    setattr(counters, name, getattr(counters, name) + 1)


def _grammar_key(request) -> Optional[Hashable]:
    """The request's structured-output key (kind, spec): what vLLM compiles a grammar from."""
    try:
        key = request.structured_output_request.structured_output_key
        hash(key)
        return key
    except Exception:  # no structured output, or a vLLM without the key: not counted
        return None


def _us(seconds: float) -> int:
    return int(seconds * 1e6)


class StepClock:
    """Where one engine step's time goes (DraftingCounters.profile_* / *_us): opened at
    schedule(), closed once its drafts are built; a step without drafts is not counted."""

    def __init__(self, counters: DraftingCounters) -> None:
        self.counters = counters
        self.started: Optional[float] = None

    def open(self, now: float) -> None:
        self.started = now

    def add(self, field: str, seconds: float) -> None:
        setattr(self.counters, field, getattr(self.counters, field) + _us(seconds))

    def close(self, now: float) -> None:
        if self.started is None:
            return
        self.counters.step_us += _us(now - self.started)
        self.counters.profile_steps += 1
        self.started = None


@functools.lru_cache(maxsize=None)
def _scheduler_class():
    Scheduler = _scheduler_base()

    class DSparkDraftingScheduler(Scheduler):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            problems = check_vllm_internals()
            if problems:
                raise RuntimeError("DSpark drafting layer: this vLLM lacks what it relies on: "
                                   + "; ".join(problems))
            config = layer_config(self.vllm_config)
            spec = self.vllm_config.speculative_config
            sample_method = getattr(spec, "draft_sample_method", "greedy") if spec is not None else "greedy"
            if sample_method != "greedy":
                # vLLM would judge the layer's tokens with the draft model's probabilities of others.
                raise RuntimeError(f"DSpark drafting layer: speculative_config draft_sample_method="
                                   f"{sample_method!r} is not exact with the layer's drafts (allowed: greedy)")
            tokenizer = getattr(self.structured_output_manager, "tokenizer", None)
            vocab_size = self.vllm_config.model_config.get_vocab_size()
            self.dspark = DraftingLayer(config, tokenizer, vocab_size)
            if engines.LLGUIDANCE in config.engines and self.structured_output_manager is not None:
                # vLLM's frontend picks per request; this makes the engine honour it (engines.py).
                engines.install(self.structured_output_manager)
            if self.dspark.budget is not None:
                problems = budget_step.check_scheduler(self)
                if problems:
                    raise RuntimeError("DSpark speculation budget: this vLLM lacks what it relies on: "
                                       + "; ".join(problems))
            logger.info("DSpark drafting layer on: mode=%s length=%d threshold=%s base=%s budget=%s",
                        config.mode, self.dspark.policy.length, self.dspark.policy.threshold,
                        self.dspark.base_method, "auto" if self.dspark.budget else "fixed")

        def schedule(self, *args, **kwargs):
            glue, clock = self.dspark.budget, self.dspark.clock
            t0 = time.perf_counter()
            clock.open(t0)
            if glue is not None:
                try:
                    glue.before_schedule(self, self.dspark.confs, self.dspark.kinds)
                except Exception:
                    # Drafts stay as built this step; the engine never stops for the budget.
                    self.dspark.counters.layer_errors += 1
                    if self.dspark.counters.layer_errors == 1:
                        logger.exception("DSpark speculation budget failed; drafts kept as built for this step")
            t1 = time.perf_counter()
            output = super().schedule(*args, **kwargs)
            t2 = time.perf_counter()
            if glue is not None:
                glue.after_schedule(output)
            if self.dspark.dists:
                dists = draft_probs.scheduled(self.dspark.dists, output.scheduled_spec_decode_tokens)
                if dists:  # the runner verifies these positions against q (draft_probs.py)
                    setattr(output, draft_probs.ATTR, dists)
            clock.add("layer_us", t1 - t0 + time.perf_counter() - t2)
            clock.add("vllm_scheduler_us", t2 - t1)
            return output

        def get_grammar_bitmask(self, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return super().get_grammar_bitmask(*args, **kwargs)
            finally:
                self.dspark.clock.add("mask_us", time.perf_counter() - t0)

        def _grammar_walker(self, request):
            """A walker over the request's grammar (either engine) when compiled and in force."""
            if not request.use_structured_output:
                return None
            sreq = request.structured_output_request
            manager = self.structured_output_manager
            grammar = sreq.grammar if sreq is not None else None
            if grammar is None or not hasattr(grammar, "is_terminated") or grammar.is_terminated():
                return None  # not compiled yet (a Future), or done
            if not (manager.enable_in_reasoning or sreq.reasoning_ended or manager.reasoner_cls is None):
                return None  # still thinking: the grammar starts later
            return engines.walker_for(grammar, self.dspark.vocab_size)

        def update_draft_token_ids(self, draft_token_ids) -> None:
            started = time.perf_counter()
            checking = 0.0
            layer = self.dspark
            # With the budget on: how far to build this step's drafts (0 while speculation is off).
            build = layer.budget.build_length() if layer.budget is not None else None
            drafted = 0
            layer.dists.clear()
            for req_id, base_draft in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
                request = self.requests.get(req_id)
                if request is None or request.is_finished():
                    continue
                if request.is_prefill_chunk:
                    request.spec_token_ids = []
                    continue
                walker = self._grammar_walker(request)
                layer.note_request(req_id, walker is not None or request.use_structured_output,
                                   isinstance(walker, engines.LLGuidanceWalker), request)
                if build is not None:
                    base_draft = list(base_draft)[:build]
                if walker is None or build == 0:
                    t = time.perf_counter()
                    validated = self.structured_output_manager.validate_tokens(request, base_draft)
                    checking += time.perf_counter() - t
                    request.spec_token_ids = validated
                    layer.kinds[req_id] = ["base"] * len(validated)
                    layer.confs[req_id] = [1.0] * len(validated)
                    continue
                drafted += 1
                try:
                    draft = layer.draft_for(request, walker, base_draft, build)
                except Exception:
                    # The layer must never stop the engine: this step keeps vLLM's own draft.
                    layer.counters.layer_errors += 1
                    if layer.counters.layer_errors == 1:
                        logger.exception("DSpark drafting layer failed; vLLM's drafts used for this step")
                    draft = draft_builder.Draft(list(base_draft), ["base"] * len(base_draft))
                t = time.perf_counter()
                validated = self.structured_output_manager.validate_tokens(request, draft.tokens)
                checking += time.perf_counter() - t
                layer.counters.grammar_trimmed_tokens += len(draft.tokens) - len(validated)
                request.spec_token_ids = validated
                if draft.sampled():
                    layer.dists[req_id] = (tuple(validated), draft.dists[: len(validated)])
                layer.kinds[req_id] = draft.kinds[: len(validated)]
                layer.confs[req_id] = (draft.confidences or [1.0] * len(draft.tokens))[: len(validated)]
            now = time.perf_counter()
            if layer.budget is not None:
                layer.budget.after_drafts(now - started, drafted)
            layer.clock.add("draft_check_us", checking)
            layer.clock.add("layer_us", now - started - checking)
            layer.clock.close(now)

        def update_from_output(self, scheduler_output, model_runner_output):
            t0 = time.perf_counter()
            sampled = model_runner_output.sampled_token_ids
            index = model_runner_output.req_id_to_index
            scheduled = scheduler_output.scheduled_spec_decode_tokens
            try:
                for req_id, rows in (getattr(model_runner_output, draft_probs.ROWS_ATTR, None) or {}).items():
                    self.dspark.learn(self.requests.get(req_id), scheduled.get(req_id) or (), rows)
            except Exception:  # the next drafts draw from what was learned before; the engine goes on
                self.dspark.counters.layer_errors += 1
                if self.dspark.counters.layer_errors == 1:
                    logger.exception("DSpark drafting layer failed to learn the verifier's rows")
            for req_id in scheduler_output.num_scheduled_tokens:
                position = index.get(req_id)
                generated = len(sampled[position]) if (sampled and position is not None) else 0
                self.dspark.record_verified(req_id, len(scheduled.get(req_id) or ()), generated)
            t1 = time.perf_counter()
            outputs = super().update_from_output(scheduler_output, model_runner_output)
            t2 = time.perf_counter()
            glue = self.dspark.budget
            if glue is not None:
                glue.after_update()
                glue.sync(self.dspark.counters)
            # Idle engines take no more steps: write the final figures now.
            self.dspark.writer.maybe_write(self.dspark.counters, force=not self.running,
                                           extra=glue.extra if glue is not None else None)
            clock = self.dspark.clock
            clock.add("vllm_scheduler_us", t2 - t1)
            clock.add("layer_us", t1 - t0 + time.perf_counter() - t2)
            return outputs

        def _free_request(self, request, *args, **kwargs):
            self.dspark.finish(request)
            return super()._free_request(request, *args, **kwargs)

    DSparkDraftingScheduler.__qualname__ = DSparkDraftingScheduler.__name__ = "DSparkDraftingScheduler"
    return DSparkDraftingScheduler


def __getattr__(name: str):
    # vLLM resolves `--scheduler-cls gpustack_dspark.worker.drafting.scheduler.DSparkDraftingScheduler`
    # by attribute lookup; building the class lazily keeps this module importable without vLLM.
    if name == "DSparkDraftingScheduler":
        return _scheduler_class()
    raise AttributeError(name)
