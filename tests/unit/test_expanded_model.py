"""The benchmark model's expansion arithmetic (devstack/expanded_model.py) on a tiny random
Llama, computed in float64 with a plain numpy forward pass: the expanded model's logits must
equal the original's. The real-vLLM check on the fixture is
tests/integration/test_expanded_model.py; this one pins the arithmetic in milliseconds.
"""

import json

import numpy as np
import pytest

from gpustack_dspark.devstack.expanded_model import (Expansion, ExpansionError, build, expand_config,
                                                     expand_tensors, expanded, read_safetensors,
                                                     write_safetensors)

CONFIG = {"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 24, "num_hidden_layers": 2, "vocab_size": 40,
          "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False,
          "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}}


def tiny_model(config=CONFIG, seed=3, dtype=np.float64):
    rng = np.random.default_rng(seed)
    d, i = config["hidden_size"], config["intermediate_size"]
    q = config["num_attention_heads"] * config["head_dim"]
    kv = config["num_key_value_heads"] * config["head_dim"]
    t = {"model.embed_tokens.weight": rng.normal(0, 0.5, (config["vocab_size"], d)),
         "model.norm.weight": rng.normal(1, 0.2, (d,))}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        t.update({p + "self_attn.q_proj.weight": rng.normal(0, 0.3, (q, d)),
                  p + "self_attn.k_proj.weight": rng.normal(0, 0.3, (kv, d)),
                  p + "self_attn.v_proj.weight": rng.normal(0, 0.3, (kv, d)),
                  p + "self_attn.o_proj.weight": rng.normal(0, 0.3, (d, q)),
                  p + "mlp.gate_proj.weight": rng.normal(0, 0.3, (i, d)),
                  p + "mlp.up_proj.weight": rng.normal(0, 0.3, (i, d)),
                  p + "mlp.down_proj.weight": rng.normal(0, 0.3, (d, i)),
                  p + "input_layernorm.weight": rng.normal(1, 0.2, (d,)),
                  p + "post_attention_layernorm.weight": rng.normal(1, 0.2, (d,))})
    return {k: v.astype(dtype) for k, v in t.items()}


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def rope(x, theta):  # x: [heads, T, head_dim], HF Llama's rotate-half convention
    half = x.shape[-1] // 2
    freqs = 1.0 / theta ** (np.arange(half) / half)
    angles = np.arange(x.shape[1])[:, None] * freqs[None, :]
    cos, sin = np.cos(np.concatenate([angles, angles], -1)), np.sin(np.concatenate([angles, angles], -1))
    rotated = np.concatenate([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


def forward(tensors, config, tokens):
    """Logits of a Llama (tied head) for `tokens`, causal, all positions."""
    eps, hd = config["rms_norm_eps"], config["head_dim"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    theta = config["rope_parameters"]["rope_theta"]
    x = tensors["model.embed_tokens.weight"][tokens]
    T = len(tokens)
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(config["num_hidden_layers"]):
        w = {k.split(".", 3)[-1]: v for k, v in tensors.items() if k.startswith(f"model.layers.{layer}.")}
        h = rms_norm(x, w["input_layernorm.weight"], eps)
        q = (h @ w["self_attn.q_proj.weight"].T).reshape(T, heads, hd).transpose(1, 0, 2)
        k = (h @ w["self_attn.k_proj.weight"].T).reshape(T, kv_heads, hd).transpose(1, 0, 2)
        v = (h @ w["self_attn.v_proj.weight"].T).reshape(T, kv_heads, hd).transpose(1, 0, 2)
        q, k = rope(q, theta), rope(k, theta)
        k, v = np.repeat(k, heads // kv_heads, 0), np.repeat(v, heads // kv_heads, 0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(hd) + mask
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        attn = (probs @ v).transpose(1, 0, 2).reshape(T, heads * hd)
        x = x + attn @ w["self_attn.o_proj.weight"].T
        h = rms_norm(x, w["post_attention_layernorm.weight"], eps)
        gate = h @ w["mlp.gate_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * (h @ w["mlp.up_proj.weight"].T)) @ w["mlp.down_proj.weight"].T
    x = rms_norm(x, tensors["model.norm.weight"], eps)
    return x @ tensors["model.embed_tokens.weight"].T


TOKENS = [3, 17, 5, 39, 0, 22, 8, 8, 11, 30]


@pytest.mark.parametrize("size", [Expansion(40, 4, 56, seed=1), Expansion(16, 3, 24), Expansion(24, 2, 24)])
def test_expanded_logits_equal_the_original(size):
    tensors = tiny_model()
    before = forward(tensors, CONFIG, TOKENS)
    new_config = expand_config(CONFIG, size)
    after = forward(expand_tensors(tensors, CONFIG, size), new_config, TOKENS)
    np.testing.assert_allclose(after, before, rtol=1e-9, atol=1e-9)


def test_grouped_query_attention_keeps_each_old_heads_group():
    config = {**CONFIG, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4}
    tensors = tiny_model(config)
    size = Expansion(32, 3, 32)
    new_config = expand_config(config, size)
    assert (new_config["num_attention_heads"], new_config["num_key_value_heads"]) == (8, 4)
    np.testing.assert_allclose(forward(expand_tensors(tensors, config, size), new_config, TOKENS),
                               forward(tensors, config, TOKENS), rtol=1e-9, atol=1e-9)


def test_the_new_parts_are_dense_except_the_output_projections():
    size = Expansion(40, 4, 56)
    out = expand_tensors(tiny_model(), CONFIG, size)
    assert out["model.layers.3.self_attn.q_proj.weight"].shape == (40, 40)
    assert np.count_nonzero(out["model.layers.3.mlp.up_proj.weight"]) == 56 * 40  # new layer: real weights
    assert np.count_nonzero(out["model.layers.0.self_attn.q_proj.weight"][16:]) == 24 * 40  # new heads
    assert not out["model.layers.3.self_attn.o_proj.weight"].any()
    assert not out["model.layers.2.mlp.down_proj.weight"].any()
    assert not out["model.layers.0.mlp.down_proj.weight"][16:].any()
    assert not out["model.layers.0.mlp.down_proj.weight"][:, 24:].any()
    assert not out["model.embed_tokens.weight"][:, 16:].any()
    assert expand_config(CONFIG, size)["rms_norm_eps"] == pytest.approx(1e-5 * 16 / 40)


def test_seeded_reproducible_and_the_seed_matters():
    a = expand_tensors(tiny_model(), CONFIG, Expansion(40, 4, 56, seed=5))
    b = expand_tensors(tiny_model(), CONFIG, Expansion(40, 4, 56, seed=5))
    c = expand_tensors(tiny_model(), CONFIG, Expansion(40, 4, 56, seed=6))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["model.layers.3.mlp.up_proj.weight"], c["model.layers.3.mlp.up_proj.weight"])


@pytest.mark.parametrize("change, message", [
    ({"hidden": 8}, "hidden 8: must be at least the model's 16"),
    ({"hidden": 20}, "hidden 20: must be a multiple of head_dim 8"),
    ({"layers": 1}, "layers 1: must be at least the model's 2"),
    ({"intermediate": 4}, "intermediate 4: must be at least the model's 24"),
])
def test_bad_sizes_are_one_line_errors_naming_the_field(change, message):
    size = Expansion(**{"hidden": 32, "layers": 2, "intermediate": 24, **change})
    with pytest.raises(ExpansionError, match=f"^{message}$"):
        expand_config(CONFIG, size)


def test_other_architectures_are_refused():
    with pytest.raises(ExpansionError, match="^model_type 'gpt2': only 'llama' can be expanded$"):
        expand_config({**CONFIG, "model_type": "gpt2"}, Expansion(32, 2, 24))


def test_build_writes_a_model_directory_and_the_cache_reuses_it(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    tensors = tiny_model(dtype=np.float32)
    write_safetensors(source / "model.safetensors", tensors)
    (source / "config.json").write_text(json.dumps(CONFIG))
    (source / "tokenizer.json").write_text("{}")
    assert all(np.array_equal(v, read_safetensors(source / "model.safetensors")[k]) for k, v in tensors.items())

    size = Expansion(32, 3, 32)
    first = expanded(size, source, tmp_path / "cache")
    assert first.name.startswith("src-h32-l3-i32-s0-")
    assert json.loads((first / "config.json").read_text())["hidden_size"] == 32
    assert (first / "tokenizer.json").read_text() == "{}"
    written = read_safetensors(first / "model.safetensors")
    assert written["model.layers.2.mlp.up_proj.weight"].dtype == np.float32
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert expanded(size, source, tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp  # cached, not rebuilt
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == [first.name]  # no scratch left
    with pytest.raises(FileExistsError):
        build(source, size, first)


def test_agreement_counts_the_tokens_before_each_first_difference():
    from tests.bench.expanded_check import agreement

    found = agreement([[1, 2, 3, 4], [5, 6], [7, 8, 9]], [[1, 2, 3, 4], [5, 0], [7, 8, 9, 10]])
    assert (found["identical"], found["tokens"], found["agreed"]) == (1, 9, 4 + 1 + 3)
    assert found["first_differences"] == [1, 3]
    assert agreement([], [])["rate"] == 1.0
    with pytest.raises(ValueError, match="^replies 1: expected 2, one per prompt$"):
        agreement([[1], [2]], [[1]])


def test_the_agreement_check_writes_its_three_workloads_without_a_server():
    from tests.bench.expanded_check import prompts

    found = prompts(3)
    assert sorted(found) == ["fixed schema (book_flight)", "free text", "order JSON"]
    assert all(len(conversations) == 3 for conversations in found.values())
    stories = [conversation[-1]["content"] for conversation in found["free text"]]
    assert len(set(stories)) == 3 and all("harbour" in story for story in stories)


def test_step_time_table_has_milliseconds_and_ratios_to_one_position():
    from tests.bench.step_time import table

    rows = [{"batch": 1, "positions": 1, "ms": 10.0}, {"batch": 1, "positions": 9, "ms": 12.0},
            {"batch": 8, "positions": 1, "ms": 20.0}, {"batch": 8, "positions": 9, "ms": 80.0}]
    lines = table(rows).splitlines()
    assert lines[2].split() == ["1", "10.0", "12.0", "|", "1.00", "1.20"]
    assert lines[3].split() == ["8", "20.0", "80.0", "|", "1.00", "4.00"]


def test_the_benchmarks_size_the_kv_cache_per_model(tmp_path):
    from tests.bench.models import kv_cache_bytes, resolve

    fixture, args = resolve("fixture")
    assert args == ["--kv-cache-memory-bytes", str(256 << 20)]  # the fixture's CPU layout, unchanged
    (tmp_path / "config.json").write_text(json.dumps(expand_config(json.loads((fixture / "config.json").read_text()),
                                                                   Expansion(768, 12, 2048))))
    assert kv_cache_bytes(tmp_path) == 2 * 12 * 768 * 4 * 16384
    with pytest.raises(SystemExit, match="not real, fixture, expanded, or a model directory"):
        resolve(str(tmp_path / "nothing"))
