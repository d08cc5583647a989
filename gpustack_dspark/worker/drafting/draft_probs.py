"""Sampled drafts' distributions, from the scheduler to vLLM's rejection sampler.

Why: at temperature > 0 a one-hot draft token x is kept with the target's probability p(x).
Where the model spreads its mass (a number, a date, a name), even the best single guess is
kept a few times in a hundred, and each such value ends the draft. The layer draws those
tokens from their continuation counts instead (draft_builder.Sampler) and hands the
distribution q it drew from to the verifier: speculative sampling keeps x with probability
min(1, p(x)/q(x)) and resamples a refusal from max(0, p - q), so the output is the target's
distribution and a token is kept with probability sum(min(p, q)).

vLLM 0.32 verifies with draft probabilities only for its own drafters
(`GPUModelRunner._get_spec_decode_draft_probs`, fed by a proposer's `take_last_draft_probs`);
drafts set in the scheduler arrive without them. The layer's scheduler attaches the sparse q
of each request's sampled positions to the step's `SchedulerOutput` (attribute `ATTR`; it
crosses to the worker process with the rest of it), and this module, loaded in every vLLM
process through the `vllm.general_plugins` entry point, makes the runner build the dense
[draft tokens, vocabulary] matrix the rejection sampler takes: one-hot rows for the other draft
tokens (what vLLM assumes without probabilities), q's rows for sampled ones. Steps without a
sampled position go through vLLM's own code. Where the runner lacks these internals (another
vLLM series), `available()` is False and the layer draws no tokens: its drafts stay one-hot.

The way back (verifier_rows.py): on a step with sampled positions, the verifier's own
distribution at each of them (its processed logits as `rejection_sample` gets them: the
`ROW_TOP` most likely tokens and their probabilities) is attached to the step's
`ModelRunnerOutput` (attribute `ROWS_ATTR`), and the scheduler averages them per context into
the next drafts' q.
"""

import logging
from typing import Dict, List, Optional, Sequence, Tuple

from gpustack_dspark.worker import vllm_seam
from gpustack_dspark.worker.drafting.draft_builder import Dist
from gpustack_dspark.worker.drafting.verifier_rows import rows_by_request

logger = logging.getLogger("vllm.dspark.draft_probs")

ATTR = "dspark_draft_dists"
RUNNER_ATTR = "_dspark_draft_dists"
ROWS_ATTR = "dspark_verifier_rows"
ROW_TOP = 24  # the verifier's most likely tokens kept per sampled position

# This step's: whether its drafts carry q (set by the runner's `execute_model`), and the
# verifier's top tokens and probabilities ([draft tokens, ROW_TOP] each) with the draft counts,
# noted by `rejection_sample` for the runner's `sample_tokens` (one runner per process).
_step: Dict[str, object] = {"wanted": False, "noted": None}

StepDists = Dict[str, List[Optional[Dist]]]  # request id -> per draft position, None = one-hot

_installed: List[str] = []


def available() -> bool:
    """Does the vLLM seam have the runner rows this hand-off patches for the installed series?
    (On a series that has them, a missing member stops the layer at start: `vllm_seam.problems`.)"""
    series = vllm_seam.installed_series()
    return any(internal.name == "GPUModelRunner" and "_get_spec_decode_draft_probs" in internal.members
               and series in internal.series for internal in vllm_seam.INTERNALS)


def scheduled(dists: Dict[str, Tuple[Tuple[int, ...], List[Optional[Dist]]]],
              scheduled_tokens: Dict[str, Sequence[int]]) -> StepDists:
    """The q rows of what vLLM scheduled: per request, its built draft's distributions for the
    scheduled prefix of that draft (a draft vLLM trimmed keeps its leading rows; one that
    differs from what was built gets none, so it is verified one-hot)."""
    out: StepDists = {}
    for rid, tokens in scheduled_tokens.items():
        entry = dists.get(rid)
        if entry is None or not tokens:
            continue
        built, rows = entry
        n = len(tokens)
        if tuple(tokens) != built[:n]:
            continue
        rows = rows[:n]
        if any(row is not None for row in rows):
            out[rid] = rows
    return out


def entries(req_ids: Sequence[str], num_draft_tokens: Sequence[int], draft_token_ids: Sequence[int],
            dists: StepDists) -> List[Tuple[int, int, float]]:
    """The nonzero cells (row, token, probability) of the rejection sampler's draft_probs, rows
    in the batch's order (requests with drafts, their positions in order): 1 at each draft
    token, unless its request carries q for that position, then q's cells."""
    cells: List[Tuple[int, int, float]] = []
    start = 0
    for rid, n in zip(req_ids, num_draft_tokens):
        rows = dists.get(rid) or []
        for pos in range(n):
            dist = rows[pos] if pos < len(rows) else None
            if dist is None:
                cells.append((start + pos, int(draft_token_ids[start + pos]), 1.0))
            else:
                cells.extend((start + pos, token, prob) for token, prob in zip(*dist))
        start += n
    return cells


def dense(req_ids: Sequence[str], num_draft_tokens: Sequence[int], draft_token_ids: Sequence[int],
          dists: StepDists, vocab_size: int):
    """`entries` as the [sum(num_draft_tokens), vocab_size] float32 matrix vLLM takes."""
    import torch

    probs = torch.zeros((int(sum(num_draft_tokens)), vocab_size), dtype=torch.float32)
    cells = entries(req_ids, num_draft_tokens, draft_token_ids, dists)
    if cells:
        rows, tokens, values = zip(*cells)
        probs[torch.tensor(rows), torch.tensor(tokens).clamp(0, vocab_size - 1)] = torch.tensor(values)
    return probs


def _patch() -> None:
    Runner = vllm_seam.resolve("GPUModelRunner")
    original_execute = Runner.execute_model
    original_probs = Runner._get_spec_decode_draft_probs

    def execute_model(self, scheduler_output, *args, **kwargs):
        dists = getattr(scheduler_output, ATTR, None)
        setattr(self, RUNNER_ATTR, dists)
        _step["wanted"], _step["noted"] = bool(dists), None
        return original_execute(self, scheduler_output, *args, **kwargs)

    def _get_spec_decode_draft_probs(self, spec_decode_metadata):
        dists = getattr(self, RUNNER_ATTR, None)
        if not dists:
            return original_probs(self, spec_decode_metadata)
        num_draft = list(spec_decode_metadata.num_draft_tokens)
        req_ids = list(self.input_batch.req_ids)[: len(num_draft)]
        vocab = self.model_config.get_vocab_size()
        draft_ids = spec_decode_metadata.draft_token_ids.tolist()
        return dense(req_ids, num_draft, draft_ids, dists, vocab).to(spec_decode_metadata.draft_token_ids.device)

    original_sample_tokens = Runner.sample_tokens

    def sample_tokens(self, *args, **kwargs):
        out = original_sample_tokens(self, *args, **kwargs)
        noted, _step["noted"] = _step["noted"], None
        dists = getattr(self, RUNNER_ATTR, None)
        if noted and dists and hasattr(out, "__dict__") and getattr(out, "req_ids", None):
            try:
                tokens, probs, num_draft = noted
                rows = rows_by_request(list(out.req_ids), num_draft, tokens.tolist(), probs.tolist(), dists)
                if rows:
                    setattr(out, ROWS_ATTR, rows)
            except Exception:  # drafts then draw from what was learned before
                logger.exception("DSpark: the verifier's rows were not handed back this step")
        return out

    import importlib

    module = importlib.import_module(vllm_seam.module_of("rejection_sample"))
    original_rejection_sample = module.rejection_sample

    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, *args, **kwargs):
        if _step["wanted"] and draft_probs is not None and target_logits.shape[0]:
            try:
                import torch

                values, tokens = target_logits.topk(min(ROW_TOP, target_logits.shape[-1]), dim=-1)
                probs = (values - torch.logsumexp(target_logits, dim=-1, keepdim=True)).exp()
                _step["noted"] = (tokens.cpu(), probs.float().cpu(), list(num_draft_tokens))
            except Exception:
                logger.exception("DSpark: the verifier's rows were not noted this step")
        return original_rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens,
                                         draft_probs, target_logits, *args, **kwargs)

    Runner.execute_model = execute_model
    Runner._get_spec_decode_draft_probs = _get_spec_decode_draft_probs
    Runner.sample_tokens = sample_tokens
    module.rejection_sample = rejection_sample


def register() -> None:
    """vLLM's general-plugin hook (every vLLM process): patch the runner where it can take the
    hand-off. Never raises: without it, sampled drafts are not drawn (`available()`)."""
    if _installed:
        return
    try:
        if not available():
            return
        _patch()
        _installed.append("GPUModelRunner")
    except Exception:  # a plugin must never stop vLLM
        logger.exception("DSpark sampled-draft hand-off not installed; drafts stay one-hot")
