"""Workarounds for faults of vLLM 0.32's CPU build that break or slow sampling with speculation.

Loaded by vLLM itself in every one of its processes (the `vllm.general_plugins` entry point,
`register()`), before a model runner samples anything. Each fix first checks that the fault is
there (a small self-test on this very vLLM) and patches only then, so a vLLM that has fixed
it upstream runs untouched. `DSPARK_VLLM_FIXES=off` turns them all off (a diagnostic: it
brings the faults back).

1. **Temperature, top-k and top-p are garbage on draft positions** (`expand_batch_to_tokens`).
   The rejection sampler expands each request's temperature / top_k / top_p to its draft
   positions with the `expand_kernel` Triton kernel. On CPU vLLM routes that kernel to
   `vllm/utils/cpu_triton_utils.py::_expand_kernel_impl`, which hands the C++ op
   `_ensure_int64(output)`: for a float32 (temperature, top_p) or int32 (top_k) output that
   is a *new* int64 tensor, so the real output is never written and keeps whatever memory
   `new_empty` returned. Every verified draft position at temperature > 0 was then scaled by
   an arbitrary temperature (1e-41, 0, 1e23 …): drafts were rejected almost always
   (acceptance 0.03 where the grammar forces the token) and the replies came from another
   distribution (total-variation distance 0.41 on a 24-reply schema). Greedy requests never
   reach that path (`all_greedy`), which is why token identity held. The fix computes the
   expansion with `torch.repeat_interleave` (what the kernel documents) for every dtype.
2. **A seeded request whose prefill is chunked kills the engine.** For a partial prefill step
   vLLM discards the sampled token and rewinds the request's generator by
   `gen.set_offset(gen.get_offset() - 4)` (`GPUModelRunner._bookkeeping_sync`); CPU
   generators have no offset (`RuntimeError: CPU Generator does not use offset`) and the
   engine dies. The fix saves the generator state of the discarded rows before sampling,
   restores it after (an exact rewind, as if the discarded sample never happened) and keeps
   the offset rewind from running on CPU generators.
3. **Every verify step resamples every draft position, with torch's slowest sampler**
   (`sample_recovered_tokens`). A rejected draft position is resampled from the residual
   distribution (the target's without the draft token). vLLM does it for every draft position
   of every request, by the Gumbel-max trick: argmax of p / q over the vocabulary with
   q ~ Exp(1), batch x vocabulary exponentials drawn each step (`q.exponential_()`, then
   again for each seeded request). On CPU torch's `exponential_` is 5-7x slower than `rand`
   (232 µs against 42 µs for 8 x 2,048 values here), and this step was ~55 % of the
   rejection sampler in a py-spy profile at concurrency 8, temperature 1 (docs/drafting.md,
   "Where a verify step's time goes"). Only each request's first rejected position is ever
   read back, so the fix finds those with vLLM's own accept test on the uniforms it drew
   (`generate_uniform_probs`, noted on the way) and samples just those rows, one uniform each
   (from the request's generator when seeded) through the residual's cumulative sum:
   `rejection_sample` 558 -> 181 µs at 8 requests x 8 drafts, 136 -> 122 µs at 1. The
   distribution is vLLM's (tests/integration/test_vllm_fixes.py); a seeded request's stream
   is another one, still the same for the same seed and drafts. With a padded draft (-1)
   every position is resampled, as vLLM does.
"""

import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable, List, Optional

from gpustack_dspark.worker import vllm_seam

logger = logging.getLogger("vllm.dspark.fixes")

DISABLE_ENV = "DSPARK_VLLM_FIXES"
_applied: List[str] = []


@dataclass(frozen=True)
class Fix:
    name: str
    fault: str
    """What goes wrong without it, in one line (logged when applied)."""
    needed: Callable[[], Optional[str]]
    """None when this vLLM does not have the fault; else why the fix applies."""
    apply: Callable[[], None]


# ---- 1. expand_batch_to_tokens -------------------------------------------------------------

def _reference_expand(x, cu_num_tokens, num_tokens: int, replace_from=0, replace_to=0):
    """[batch] -> [num_tokens]: x[i] repeated (cu[i] - cu[i-1]) times, replace_from -> replace_to."""
    import torch

    cu = cu_num_tokens.to(device=x.device, dtype=torch.int64)
    counts = torch.diff(cu, prepend=cu.new_zeros(1))
    values = x
    if replace_from != replace_to:
        values = torch.where(x == replace_from, torch.as_tensor(replace_to, dtype=x.dtype, device=x.device), x)
    out = torch.repeat_interleave(values, counts)
    if out.shape[0] != num_tokens:  # pragma: no cover - vLLM passes cu[-1] == num_tokens
        raise ValueError(f"expand: {out.shape[0]} tokens from cu_num_tokens, {num_tokens} expected")
    return out


def _expand_is_wrong() -> Optional[str]:
    import torch

    if not vllm_seam.resolve("current_platform").is_cpu():
        return None  # the Triton kernel itself runs there; this test's tensors are CPU tensors

    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    for x, replace in ((torch.tensor([0.7, 0.0, 1.5], dtype=torch.float32), (0, 1)),
                       (torch.tensor([3, 50, 7], dtype=torch.int32), (0, 0))):
        try:
            got = vllm_seam.resolve("expand_batch_to_tokens")(x, cu, 6, replace_from=replace[0], replace_to=replace[1])
        except Exception as e:  # a crash is as wrong as a wrong value
            return f"expand_batch_to_tokens raised {e.__class__.__name__} for {x.dtype}"
        want = _reference_expand(x, cu, 6, *replace)
        if got.dtype != want.dtype or not torch.equal(got, want):
            return f"expand_batch_to_tokens({x.tolist()}) gave {got.tolist()}, not {want.tolist()}"
    return None


def _patch_expand() -> None:
    import importlib

    importlib.import_module(vllm_seam.module_of("expand_batch_to_tokens")).expand_batch_to_tokens = _reference_expand


# ---- 2. seeded generators on chunked prefill ---------------------------------------------

def _cpu_generators_lack_offset() -> Optional[str]:
    import torch

    if not vllm_seam.resolve("current_platform").is_cpu():
        return None
    try:
        torch.Generator(device="cpu").get_offset()
    except RuntimeError as e:
        GPUModelRunner = vllm_seam.resolve("GPUModelRunner")
        if not all(hasattr(GPUModelRunner, name) for name in ("_sample", "_bookkeeping_sync")):
            return None  # another vLLM: nothing of the shape this fix knows
        return f"torch CPU generators: {e}"
    return None


def _discarded_generators(runner):
    """{batch index: generator} of the seeded requests whose sample this step discards."""
    batch = runner.input_batch
    generators = getattr(batch, "generators", None) or {}
    if not generators:
        return {}
    num_reqs = batch.num_reqs
    mask = runner.discard_request_mask.np[:num_reqs]
    return {i: g for i, g in generators.items() if i < num_reqs and mask[i] and g.device.type == "cpu"}


def _patch_generators() -> None:
    GPUModelRunner = vllm_seam.resolve("GPUModelRunner")
    original_sample = GPUModelRunner._sample
    original_bookkeeping = GPUModelRunner._bookkeeping_sync

    def _sample(self, *args, **kwargs):
        saved = {i: g.get_state() for i, g in _discarded_generators(self).items()}
        try:
            return original_sample(self, *args, **kwargs)
        finally:
            generators = self.input_batch.generators
            for i, state in saved.items():
                if i in generators:
                    generators[i].set_state(state)

    def _bookkeeping_sync(self, *args, **kwargs):
        # Already rewound exactly in _sample: keep vLLM's offset rewind off these generators.
        hidden = _discarded_generators(self)
        generators = self.input_batch.generators
        for i in hidden:
            del generators[i]
        try:
            return original_bookkeeping(self, *args, **kwargs)
        finally:
            generators.update(hidden)

    GPUModelRunner._sample = _sample
    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync


# ---- 3. recovered tokens ------------------------------------------------------------------

class _UniformsSeen(threading.local):
    """The uniforms `rejection_sample` just drew for its accept test (this thread's last)."""
    value = None


_uniforms_seen = _UniformsSeen()


class _RowsSeen(threading.local):
    """The first rejected rows `_first_rejected` just computed (this thread's last): (rows, requests)."""
    value = None


_rows_seen = _RowsSeen()
# Verify steps where vLLM's accept test rejected another position than `_first_rejected` said
# (a divergence emits token 0 there): counted and logged, never expected.
divergences = 0


def _noting_uniforms(original):
    def generate_uniform_probs(num_tokens, num_draft_tokens, generators, device):
        uniforms = original(num_tokens, num_draft_tokens, generators, device)
        _uniforms_seen.value = uniforms
        return uniforms
    return generate_uniform_probs


def _first_rejected(uniforms, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs):
    """Each request's first draft position the accept test rejects: (rows, their requests).

    The same test as vLLM's CPU kernel (`rejection_random_sample_kernel_impl`): in float32,
    a draft is kept when draft_prob > 0 and target_prob / draft_prob >= u (draft_prob = 1
    without draft probabilities). Only the first rejected position of a request is ever read
    back, so only those need a recovered token. (Index work in numpy: a handful of small
    arrays, where each torch op would cost more than its work.)"""
    import numpy as np
    import torch

    safe = draft_token_ids.long()[:, None]
    target = target_probs.gather(1, safe)[:, 0]
    uniform = uniforms.to(torch.float32)
    if draft_probs is None:
        kept = target >= uniform
    else:
        draft = draft_probs.gather(1, safe)[:, 0]
        kept = (draft > 0) & (target / draft >= uniform)
    rejected = np.flatnonzero(~kept.numpy())
    requests = np.searchsorted(cu_num_draft_tokens.numpy(), rejected, side="right")
    requests, first = np.unique(requests, return_index=True)
    return torch.from_numpy(rejected[first]), requests.tolist()


def _fast_recovered_tokens(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs,
                           target_probs, sampling_metadata, device, use_fp64_gumbel: bool = False):
    """vLLM's `sample_recovered_tokens` for the positions that are read back: a sample of each
    one's residual distribution by one uniform per position (the same generators as vLLM's)
    through its cumulative sum, instead of the Gumbel-max over batch x vocabulary exponentials.
    (`use_fp64_gumbel` has nothing to choose: the sums are float64.)"""
    import torch

    uniforms, _uniforms_seen.value = _uniforms_seen.value, None
    # Every position when this was not called from rejection_sample, or a draft is padded (-1):
    # vLLM's CPU kernel then reads target_probs out of its row, so what it keeps is not known here.
    if uniforms is None or uniforms.shape[0] != draft_token_ids.shape[0] or bool((draft_token_ids < 0).any()):
        rows = torch.arange(draft_token_ids.shape[0])
        requests = [i for i, n in enumerate(num_draft_tokens) for _ in range(n)]
    else:
        rows, requests = _first_rejected(uniforms, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs)
        _rows_seen.value = (rows.tolist(), requests)
    recovered = torch.zeros_like(draft_token_ids)
    vocab_size = target_probs.shape[-1]
    if rows.numel() == 0:
        return recovered
    if draft_probs is None:  # a one-hot proposal: the residual is the target without the draft token
        residual = target_probs[rows]
        ids = draft_token_ids[rows].long()
        drafted = ids >= 0
        residual[torch.arange(rows.shape[0])[drafted], ids[drafted]] = 0
    else:
        residual = (target_probs[rows] - draft_probs[rows]).clamp_(min=0)
    # One uniform per row, inverted through the residual's cumulative sum: the first token whose
    # cumulative mass exceeds u * total, so a token of mass 0 (the draft's) is never chosen.
    uniform = torch.rand((rows.shape[0], 1), dtype=torch.float64, device=device)
    generators = sampling_metadata.generators
    for k, request in enumerate(requests):
        if request in generators:
            uniform[k].uniform_(generator=generators[request])
    cumulative = residual.cumsum(dim=-1, dtype=torch.float64)
    chosen = torch.searchsorted(cumulative, uniform * cumulative[:, -1:], right=True)[:, 0]
    # u * total rounding up to total (about 2^-53): the last token with mass; an empty residual: 0
    # (as vLLM's kernel, whose scores are then all 0).
    over = chosen >= vocab_size
    if bool(over.any()):
        chosen[over] = (cumulative[over] < cumulative[over][:, -1:]).sum(dim=-1)
    recovered[rows] = chosen.to(recovered.dtype)
    return recovered


def divergent_requests(output_token_ids, num_draft_tokens, cu_num_draft_tokens, seen, random_rows,
                       placeholder: int = -1) -> List[int]:
    """The requests (of those sampled at random, `random_rows`) where vLLM's own accept test
    stopped at another draft position than `_first_rejected` said (`seen`: its rows and
    requests). Read from the verify step's output: a request that kept k of its n drafts was
    rejected at its row `start + k` when k < n, and nowhere when k = n."""
    expected = dict(zip(seen[1], seen[0]))
    out = []
    ends = cu_num_draft_tokens.tolist()
    for i, row in enumerate(output_token_ids.tolist()):
        drafts = num_draft_tokens[i]
        if not drafts or not random_rows[i]:
            continue
        kept = sum(1 for t in row if t != placeholder) - 1
        actual = ends[i] - drafts + kept if kept < drafts else None
        if expected.get(i) != actual:
            out.append(i)
    return out


def _checking_rejections(original, greedy: float, placeholder: int):
    """`rejection_sample` that checks, after each verify step, that the positions vLLM's kernel
    rejected are the ones whose recovered tokens this fix drew (`divergent_requests`; `greedy`
    and `placeholder`: vLLM's GREEDY_TEMPERATURE and PLACEHOLDER_TOKEN_ID, resolved once)."""
    def rejection_sample(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                         target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs):
        _rows_seen.value = None
        output = original(draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
                          target_logits, bonus_token_ids, sampling_metadata, *args, **kwargs)
        seen, _rows_seen.value = _rows_seen.value, None
        if seen is not None and not sampling_metadata.all_greedy:
            random_rows = (sampling_metadata.temperature != greedy).tolist()
            wrong = divergent_requests(output, num_draft_tokens, cu_num_draft_tokens, seen, random_rows,
                                       placeholder)
            if wrong:
                global divergences
                divergences += 1
                if divergences <= 5 or divergences % 1000 == 0:
                    logger.error("DSpark recovered_tokens: vLLM's accept test rejected other draft positions "
                                 "than this fix drew tokens for (requests %s of this step; %d such steps): "
                                 "those positions got token 0", wrong, divergences)
        return output
    return rejection_sample


def _recovered_on_cpu() -> Optional[str]:
    if not vllm_seam.resolve("current_platform").is_cpu():
        return None  # on a GPU vLLM's draw is one kernel launch
    vllm_seam.resolve("sample_recovered_tokens")  # the functions this fix wraps are there
    vllm_seam.resolve("generate_uniform_probs")
    return "CPU sampling (torch exponential_ 5-7x slower than rand)"


def _patch_recovered() -> None:
    import importlib

    module = importlib.import_module(vllm_seam.module_of("sample_recovered_tokens"))
    module.generate_uniform_probs = _noting_uniforms(module.generate_uniform_probs)
    module.sample_recovered_tokens = _fast_recovered_tokens
    module.rejection_sample = _checking_rejections(vllm_seam.resolve("rejection_sample"),
                                                   vllm_seam.resolve("GREEDY_TEMPERATURE"),
                                                   vllm_seam.resolve("PLACEHOLDER_TOKEN_ID"))


FIXES = (
    Fix("expand_batch_to_tokens",
        "on CPU, draft positions are verified with garbage temperature/top-k/top-p (biased, slow sampling)",
        _expand_is_wrong, _patch_expand),
    Fix("cpu_generator_rewind",
        "on CPU, a seeded request whose prefill is chunked stops the engine (generator offset)",
        _cpu_generators_lack_offset, _patch_generators),
    Fix("recovered_tokens",
        "on CPU, every verify step resamples every draft position from batch x vocabulary slow exponential_ draws",
        _recovered_on_cpu, _patch_recovered),
)


def applied() -> List[str]:
    """Names of the fixes applied in this process."""
    return list(_applied)


def register() -> None:
    """vLLM's general-plugin hook: check each fault, patch where present. Never raises."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() in ("off", "0", "false", "no"):
        logger.warning("DSpark vLLM fixes are off (%s=%s): the faults they fix are back",
                       DISABLE_ENV, os.environ[DISABLE_ENV])
        return
    for fix in FIXES:
        if fix.name in _applied:
            continue
        try:
            why = fix.needed()
            if why is None:
                continue
            fix.apply()
            _applied.append(fix.name)
            logger.info("DSpark vLLM fix %s applied: %s (%s)", fix.name, fix.fault, why)
        except Exception:  # the engine must start even if a check cannot run
            logger.exception("DSpark vLLM fix %s could not be checked or applied", fix.name)
