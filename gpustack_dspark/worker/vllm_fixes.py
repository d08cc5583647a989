"""Workarounds for two faults of vLLM 0.32's CPU build that break sampling with speculation.

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
"""

import logging
import os
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


FIXES = (
    Fix("expand_batch_to_tokens",
        "on CPU, draft positions are verified with garbage temperature/top-k/top-p (biased, slow sampling)",
        _expand_is_wrong, _patch_expand),
    Fix("cpu_generator_rewind",
        "on CPU, a seeded request whose prefill is chunked stops the engine (generator offset)",
        _cpu_generators_lack_offset, _patch_generators),
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
