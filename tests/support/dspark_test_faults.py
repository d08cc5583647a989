"""Faults injected into a real GPUStack server process by the tests.

Loaded through the devstack's sitecustomize (DSPARK_SITECUSTOMIZE_EXTRA) before GPUStack
starts; DSPARK_TEST_FAULT picks the fault. Nothing here runs outside the tests.
"""

import os

FAULT = os.environ.get("DSPARK_TEST_FAULT", "")

if FAULT == "gpustack-version":
    from gpustack_dspark import versions

    versions.installed_gpustack_version = lambda: "2.2.0"

elif FAULT == "database-unreachable":
    from gpustack_dspark import backend

    async def _unreachable(settings):
        raise ConnectionRefusedError("[Errno 111] connection to the database refused (injected by the tests)")

    backend.register_backend = _unreachable

    from gpustack_dspark.console import sampler

    async def _no_deployments():
        raise ConnectionRefusedError("[Errno 111] connection to the database refused (injected by the tests)")

    sampler.read_deployments = _no_deployments
    backend.REGISTRATION_ATTEMPTS = 2
    backend.REGISTRATION_FIRST_DELAY_S = 0.1

elif FAULT == "init-crash":
    from gpustack_dspark import plugin

    def _crash(self, app, cfg):
        raise RuntimeError("wiring exploded (injected by the tests)")

    plugin.DSparkPlugin._wire = _crash

elif FAULT == "greedy-draft-verification":
    # The exactness test's deliberately wrong verifier, in a DSpark replica: every draft position
    # is verified with its float sampling parameters (temperature, top_p) near 0, so a draft is
    # accepted only where it is the target's top token and the replies lean to the likeliest
    # ones. The same error vLLM's CPU build made by itself (expand_batch_to_tokens left the
    # draft positions' temperatures as whatever memory held, seen as 4.6e-41), made every run:
    # the unfixed build's garbage is sometimes right by chance (memory still holding the last
    # right values), and a negative control must fail every time. It goes in through the fix's
    # own door: vllm_fixes patches vLLM's expand with this one.
    from gpustack_dspark.worker import vllm_fixes

    _right_expand = vllm_fixes._reference_expand

    def _greedy_at_draft_positions(x, cu_num_tokens, num_tokens, replace_from=0, replace_to=0):
        out = _right_expand(x, cu_num_tokens, num_tokens, replace_from, replace_to)
        return out * 1e-6 if out.is_floating_point() else out

    vllm_fixes._reference_expand = _greedy_at_draft_positions
