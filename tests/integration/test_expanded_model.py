"""The benchmark model's expansion on real vLLM (CPU): a small expansion of the fixture
(hidden 256 -> 384, layers 4 -> 6, intermediate 512 -> 768; built here in about a second) must
give the fixture's greedy tokens, token for token, on order, fixed-schema and free-text prompts.
Its purpose: the speed figures of docs/drafting.md come from an expanded model, and they mean
something only while its tokens are the fixture's, so the technique must not break silently (a
vLLM upgrade that reads a config field differently, a changed fixture).

One worker-venv process loads both models one after the other with vLLM's offline engine
(tests/bench/vllm_offline.py): vLLM is imported once, which costs more than either model. The
full-size benchmark model stays out of CI (tests/bench/expanded_check.py measures its agreement);
the numpy unit test tests/unit/test_expanded_model.py pins the arithmetic.
"""

import json

import pytest

from gpustack_dspark.devstack.expanded_model import Expansion, build
from gpustack_dspark.devstack.replica import TARGET_MODEL
from tests.bench.expanded_check import agreement, prompts
from tests.bench.vllm_offline import run_offline

pytestmark = pytest.mark.integration

SMALL = Expansion(hidden=384, layers=6, intermediate=768, seed=0)
MAX_TOKENS = 64


def test_a_small_expansion_gives_the_fixtures_greedy_tokens_on_real_vllm(tmp_path):
    expanded = build(TARGET_MODEL, SMALL, tmp_path / "expanded")
    config = json.loads((expanded / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"]) == (384, 6, 6)

    workloads = prompts(4)
    flat = [p for ps in workloads.values() for p in ps]
    out = run_offline({"command": "greedy", "models": [str(TARGET_MODEL), str(expanded)], "prompts": flat,
                       "max_tokens": MAX_TOKENS}, timeout_s=600, log=tmp_path / "vllm.log")
    reference, got = out["tokens"][str(TARGET_MODEL)], out["tokens"][str(expanded)]
    found = agreement(reference, got)
    print(f"agreement {found}; load + generate seconds {out['seconds']}")
    assert found["tokens"] >= 12 * 20, found  # real replies, not empty ones
    assert found["identical"] == found["prompts"], found
