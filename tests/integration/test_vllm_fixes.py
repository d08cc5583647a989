"""vLLM's rejection sampler on CPU with and without `worker/vllm_fixes.py`'s recovered-token fix.

The fix (`recovered_tokens`) replaces how vLLM 0.32 resamples a rejected draft position: only
the positions read back, one uniform each through the residual's cumulative sum, instead of a
Gumbel-max over batch x vocabulary exponentials at every position. It must not change
what a verify step returns, in distribution: real `rejection_sample` of the installed vLLM (its
CPU kernels), a small vocabulary with rejections at every position, many steps, vLLM's own
outputs against the fixed ones by the same two-sample test as the drafting layer's exactness
test (`tests/bench/exactness.py`). A deliberately wrong residual (the draft token left in) must
fail the same test, so the test can fail. Seeded requests stay reproducible. The drafting
layer's reply-level test (`test_drafting_layer.py`) runs the whole path with the fix on.
"""

import json
import subprocess

import pytest

from gpustack_dspark.devstack.replica import worker_env, worker_python
from tests.bench import exactness

pytestmark = pytest.mark.integration

STEPS = 6000
ALPHA = 0.001

SCRIPT = r"""
import json, sys
import torch
from vllm.platforms import current_platform
current_platform.register_triton_kernel_overrides()  # the CPU kernels, as in a CPU engine
from gpustack_dspark.worker import vllm_fixes
from gpustack_dspark.worker.vllm_seam import module_of
import importlib
rs = importlib.import_module(module_of("sample_recovered_tokens"))

steps = int(sys.argv[1])
V, B, K = 6, 3, 3
base = torch.tensor([.4, .3, .1, .1, .05, .05]).log()
logits = torch.stack([base.roll(i) for i in range(B * K)])  # every position its own distribution
draft = torch.tensor([0, 1, 2, 3, 4, 5, 1, 2, 2], dtype=torch.int32)
cu = torch.tensor([3, 6, 9], dtype=torch.int32)
bonus = torch.tensor([[5], [5], [5]])

class Meta:  # the SamplingMetadata fields rejection_sample reads
    all_greedy, all_random = False, True
    temperature = torch.ones(B)
    generators = {}

# A drafter's own distributions (the q of a probabilistic draft), 0.6 on its draft token (more
# than the target's there, so drafts are rejected): the residual is (p - q)+.
q = torch.full((B * K, V), 0.08)
q[torch.arange(B * K), draft.long()] = 0.6

def run(n, seeded=False, draft_probs=None):
    Meta.generators = {1: torch.Generator().manual_seed(7)} if seeded else {}
    return [[tuple(row) for row in rs.rejection_sample(draft, [K] * B, K, cu, draft_probs, logits.clone(), bonus,
                                                       Meta).tolist()] for _ in range(n)]

# The reference arm is vLLM's own code: nothing (a plugin hook) patched it before this point.
out = {"unpatched": [getattr(rs, name).__module__ == rs.__name__
                     for name in ("sample_recovered_tokens", "generate_uniform_probs")]}
out["vllm"] = run(steps)
out["vllm_q"] = run(steps // 3, draft_probs=q.clone())
vllm_fixes._patch_recovered()
out["patched"] = rs.sample_recovered_tokens is vllm_fixes._fast_recovered_tokens
out["fixed"] = run(steps)
out["fixed_q"] = run(steps // 3, draft_probs=q.clone())
out["seeded"] = [run(50, seeded=True), run(50, seeded=True)]
out["divergences"] = vllm_fixes.divergences  # the run-time check of _first_rejected: none
right = vllm_fixes._first_rejected
def shifted(*args):  # a deliberately wrong accept test: one position off
    rows, requests = right(*args)
    return torch.where(rows + 1 < len(draft), rows + 1, rows - 1), requests
vllm_fixes._first_rejected = shifted
run(50)
out["divergences_caught"] = vllm_fixes.divergences
vllm_fixes._first_rejected = right
padded = draft.clone(); padded[4] = -1  # a padded draft: every position is resampled
out["padded_ok"] = rs.sample_recovered_tokens(K, [K] * B, cu, padded, None, logits.softmax(-1), Meta, "cpu").tolist()

def wrong_residual(max_spec_len, num_draft_tokens, cu_num_draft_tokens, draft_token_ids, draft_probs, target_probs,
                   sampling_metadata, device, use_fp64_gumbel=False):
    # Resampling from the target itself: the draft token is not taken out of the residual.
    return torch.multinomial(target_probs, 1)[:, 0].to(draft_token_ids.dtype)
rs.sample_recovered_tokens = wrong_residual
out["wrong"] = run(steps)
out["wrong_q"] = run(steps // 3, draft_probs=q.clone())  # the residual from p, not (p - q)+
# The formula: where a request's first draft is rejected, the token is drawn from (p - q)+.
p0 = logits.softmax(-1)
out["residual_q"] = [((p0[r] - q[r]).clamp(min=0) / (p0[r] - q[r]).clamp(min=0).sum()).tolist()
                     for r in (0, 3, 6)]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def steps():
    done = subprocess.run([str(worker_python()), "-c", SCRIPT, str(STEPS)], capture_output=True, text=True,
                          timeout=900, env=worker_env())
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _request(outputs, i):
    return [tuple(step[i]) for step in outputs]


def test_the_fix_keeps_vllms_verify_distribution_and_a_wrong_residual_is_caught(steps):
    assert steps["unpatched"] == [True, True] and steps["patched"] is True, (steps["unpatched"], steps["patched"])
    for i in range(3):
        fixed = exactness.two_sample(_request(steps["vllm"], i), _request(steps["fixed"], i), permutations=2000)
        wrong = exactness.two_sample(_request(steps["vllm"], i), _request(steps["wrong"], i), permutations=2000)
        print(f"request {i}: fixed {fixed.line()}; wrong residual {wrong.line()}")
        assert fixed.p_value > ALPHA, (i, fixed.line())
        assert wrong.p_value <= ALPHA and wrong.tv > fixed.tv, (i, wrong.line())
    # Rejections happen at every position, so every recovered position was exercised.
    for i in range(3):
        assert {sum(1 for t in row if t >= 0) for row in _request(steps["fixed"], i)} >= {1, 2, 3}


def test_the_q_residual_keeps_vllms_verify_distribution(steps):
    """`draft_probs` given (a probabilistic draft, as the drafting layer's sampled drafts): the
    residual is (p - q)+, the fix's other branch, against vLLM's own on the same inputs."""
    for i in range(3):
        fixed = exactness.two_sample(_request(steps["vllm_q"], i), _request(steps["fixed_q"], i), permutations=2000)
        print(f"request {i} with q: fixed {fixed.line()}")
        assert fixed.p_value > ALPHA, (i, fixed.line())
        assert {sum(1 for t in row if t >= 0) for row in _request(steps["fixed_q"], i)} >= {1, 2, 3}
    # q changes what is accepted and resampled: the runs with q are not the runs without it.
    with_q = exactness.two_sample(_request(steps["fixed"], 0), _request(steps["fixed_q"], 0), permutations=2000)
    assert with_q.p_value <= ALPHA, with_q.line()
    # A residual drawn from p instead of (p - q)+ is caught by the same test.
    wrong = exactness.two_sample(_request(steps["vllm_q"], 0), _request(steps["wrong_q"], 0), permutations=2000)
    assert wrong.p_value <= ALPHA, wrong.line()


# Chi-square critical values at 0.001 by degrees of freedom (a goodness-of-fit test).
CHI2_0001 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52}


def test_a_rejected_first_draft_is_replaced_by_a_draw_from_the_residual_formula(steps):
    """Where a request's first draft is rejected, what the step emits is a draw of
    (p - q)+ / sum: the fixed sampler's frequencies fit the formula; the wrong residual's do not."""
    def fit(outputs, request, expected):
        drawn = [row[0] for row in _request(outputs, request) if sum(1 for t in row if t >= 0) == 1]
        counts = [drawn.count(t) for t in range(len(expected))]
        cells = [(c, len(drawn) * e) for c, e in zip(counts, expected) if e > 0]
        chi2 = sum((c - m) ** 2 / m for c, m in cells)
        outside = sum(c for c, e in zip(counts, expected) if e == 0)
        return len(drawn), chi2, len(cells) - 1, outside

    for request, expected in enumerate(steps["residual_q"]):
        n, chi2, df, outside = fit(steps["fixed_q"], request, expected)
        print(f"request {request}: {n} rejected first drafts, chi2 {chi2:.1f} (df {df}), outside the residual {outside}")
        assert n >= 300 and outside == 0 and chi2 < CHI2_0001[df], (request, n, chi2, df, outside)
    n, chi2, df, outside = fit(steps["wrong_q"], 0, steps["residual_q"][0])
    assert outside > 0 or chi2 >= CHI2_0001[df], (n, chi2, df, outside)


def test_the_run_time_check_of_the_accept_test_sees_no_divergence_and_catches_one(steps):
    assert steps["divergences"] == 0
    assert steps["divergences_caught"] >= 10, steps["divergences_caught"]


def test_a_seeded_request_stays_reproducible_and_a_padded_draft_is_served(steps):
    first, second = steps["seeded"]
    assert [step[1] for step in first] == [step[1] for step in second]
    assert len({tuple(step[1]) for step in first}) > 1  # the seed drives a real sample
    assert all(0 <= token < 6 for token in steps["padded_ok"])
