"""knobs + model family -> vLLM argv, for every method and knob (pure; config.json fixtures)."""

import json
from pathlib import Path

import pytest

from gpustack_dspark.knobs import KnobError, parse_knob_args
from gpustack_dspark.translate import MIDDLEWARE, Environment, plan_launch

CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"
CUDA = Environment(device="cuda", suffix_available=False)
CUDA_SUFFIX = Environment(device="cuda", suffix_available=True)
CPU = Environment(device="cpu", suffix_available=False)


def config(name):
    return json.loads((CONFIGS / f"{name}.json").read_text())


def plan(args, model_config="llama", draft=None, env=CUDA):
    knobs, rest = parse_knob_args(args)
    return plan_launch("/models/m", knobs, rest, config=config(model_config) if model_config else None,
                       draft=config(draft) if draft else None, env=env)


def spec(p):
    raw = p.vllm_argv[p.vllm_argv.index("--speculative-config") + 1]
    return json.loads(raw)


def flag(p, name):
    return p.vllm_argv[p.vllm_argv.index(name) + 1] if name in p.vllm_argv else None


def test_disabled_is_plain_vllm_plus_the_gate_only():
    p = plan(["--max-num-seqs", "64", "--dspark-speculative-length", "6"])
    assert not p.enabled
    assert p.vllm_argv == ["--model", "/models/m", "--max-num-seqs", "64", "--middleware", MIDDLEWARE]


def test_v41_gets_the_published_dspark_recipe():
    p = plan(["--enable-dspark"], "deepseek-v4.1")
    assert p.method == "dspark"
    assert spec(p) == {"method": "dspark", "num_speculative_tokens": 5, "draft_sample_method": "probabilistic",
                       "rejection_sample_method": "block", "enable_adaptive_verification": True}
    assert "adaptive verification" in p.startup_line()
    assert p.startup_line().startswith("DSpark enabled: method=dspark speculative_length=5 grammar_mode=json")


def test_v41_length_and_threshold_are_reported_honestly():
    p = plan(["--enable-dspark", "--dspark-speculative-length=6", "--dspark-accept-threshold", "0.7"], "deepseek-v4.1")
    assert spec(p)["num_speculative_tokens"] == 6
    assert p.threshold["applied"] is False and "adaptive verification" in p.threshold["mechanism"]
    assert any("not applied" in w for w in p.warnings)
    assert "accept_threshold=0.7" in p.startup_line()


def test_deepseek_reasoning_models_answer_json_without_thinking():
    p = plan(["--enable-dspark"], "deepseek-v4.1")
    assert json.loads(flag(p, "--default-chat-template-kwargs")) == {"thinking": False}
    p = plan(["--enable-dspark", "--dspark-grammar-mode=off"], "deepseek-v4.1")
    assert "--default-chat-template-kwargs" not in p.vllm_argv
    p = plan(["--enable-dspark", "--default-chat-template-kwargs", '{"thinking": true}'], "deepseek-v3")
    assert p.vllm_argv.count("--default-chat-template-kwargs") == 1  # the user's own wins


@pytest.mark.parametrize("family,layers", [("deepseek-v3", 1), ("deepseek-v3.2", 1), ("deepseek-v4", 2)])
def test_v3_v32_v4_use_mtp(family, layers):
    p = plan(["--enable-dspark"], family)
    assert p.method == "mtp"
    assert spec(p) == {"method": "mtp", "num_speculative_tokens": 1}


def test_mtp_on_v41_is_refused_with_the_reason():
    with pytest.raises(KnobError) as e:
        plan(["--enable-dspark", "--dspark-method=mtp"], "deepseek-v4.1")
    assert "--dspark-method" in str(e.value) and "use dspark" in str(e.value)
    assert "allowed: auto|ngram|dspark" in str(e.value)


def test_dspark_on_llama_is_refused():
    with pytest.raises(KnobError) as e:
        plan(["--enable-dspark", "--dspark-method", "dspark"], "llama")
    assert "DeepSeek-V4.1 checkpoint or a DSpark draft" in str(e.value)


def test_dspark_draft_for_other_families_is_detected_from_its_config():
    p = plan(["--enable-dspark", "--dspark-draft-model", "/drafts/q"], "qwen3", draft="draft-dspark-qwen3")
    assert p.method == "dspark"
    assert spec(p)["model"] == "/drafts/q"
    assert spec(p)["num_speculative_tokens"] == 7  # the draft's trained block size


def test_eagle3_head_and_draft_model():
    p = plan(["--enable-dspark", "--dspark-draft-model", "/drafts/e"], "llama", draft="draft-eagle3")
    assert (p.method, spec(p)) == ("eagle3", {"method": "eagle3", "num_speculative_tokens": 3, "model": "/drafts/e"})
    p = plan(["--enable-dspark", "--dspark-draft-model", "/drafts/s"], "llama", draft="draft-llama-small")
    assert (p.method, spec(p)) == ("draft_model", {"method": "draft_model", "num_speculative_tokens": 4, "model": "/drafts/s"})
    with pytest.raises(KnobError, match="not an EAGLE-3 head"):
        plan(["--enable-dspark", "--dspark-method=eagle3", "--dspark-draft-model", "/d"], "llama", draft="draft-llama-small")
    with pytest.raises(KnobError, match="needs --dspark-draft-model"):
        plan(["--enable-dspark", "--dspark-method=draft_model"], "llama")


def test_generic_models_use_suffix_when_installed_else_ngram():
    p = plan(["--enable-dspark"], "llama", env=CUDA_SUFFIX)
    assert p.method == "suffix"
    p = plan(["--enable-dspark"], "llama")
    assert p.method == "ngram" and "not installed" in p.method_reason
    # The drafting layer (on by default on JSON replicas) drafts longer than plain n-gram.
    assert spec(p) == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    p = plan(["--enable-dspark", "--dspark-drafting=off"], "llama")
    assert spec(p) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 5}
    with pytest.raises(KnobError, match="arctic-inference"):
        plan(["--enable-dspark", "--dspark-method=suffix"], "llama")


def test_suffix_threshold_is_a_real_cutoff():
    p = plan(["--enable-dspark", "--dspark-accept-threshold=0.35"], "llama", env=CUDA_SUFFIX)
    assert spec(p)["suffix_decoding_min_token_prob"] == 0.35
    assert p.threshold["applied"] is True and not p.warnings


def test_gpu_only_methods_on_a_cpu_worker():
    p = plan(["--enable-dspark"], "deepseek-v4.1", env=CPU)
    assert p.method == "ngram" and "runs only on CUDA" in p.method_reason
    with pytest.raises(KnobError, match="runs only on CUDA"):
        plan(["--enable-dspark", "--dspark-method=dspark"], "deepseek-v4.1", env=CPU)


def test_json_mode_sets_the_engines_with_bounded_whitespace():
    # With the drafting layer on: vLLM picks the engine per request, the layer's manager keeps both.
    p = plan(["--enable-dspark"])
    assert json.loads(flag(p, "--structured-outputs-config")) == {"backend": "auto"}
    assert p.grammar_engines == ("xgrammar", "llguidance") and p.drafting_layer_on
    # vLLM takes disable_any_whitespace only with one named backend: the layer sets it on both.
    assert json.loads(flag(p, "--additional-config"))["dspark_drafting"]["engines"] == ["xgrammar", "llguidance"]
    # Without the layer nothing would make one engine hold both: xgrammar only.
    p = plan(["--enable-dspark", "--dspark-drafting=off"])
    assert json.loads(flag(p, "--structured-outputs-config")) == {"backend": "xgrammar", "disable_any_whitespace": True}
    assert p.grammar_engines == ("xgrammar",)
    p = plan(["--enable-dspark", "--structured-outputs-config", '{"backend":"guidance"}'])
    assert p.grammar_engines == () and flag(p, "--structured-outputs-config") == '{"backend":"guidance"}'
    assert flag(p, "--per-request-spec-decode-metrics") == "summary"
    p = plan(["--enable-dspark", "--dspark-grammar-mode=off"])
    assert "--structured-outputs-config" not in p.vllm_argv
    with pytest.raises(KnobError, match="lm-format-enforcer"):
        plan(["--enable-dspark", "--structured-outputs-config", '{"backend":"lm-format-enforcer"}'])


def test_user_speculative_config_with_enable_dspark_is_refused():
    with pytest.raises(KnobError) as e:
        plan(["--enable-dspark", "--speculative-config", '{"method":"ngram"}'])
    assert str(e.value).startswith("--speculative-config:") and "cannot be combined with --enable-dspark" in str(e.value)
    # without DSpark it is plain vLLM's business
    assert "--speculative-config" in plan(["--speculative-config", '{"method":"ngram"}']).vllm_argv


def test_precision_maps_to_what_the_model_supports():
    assert flag(plan(["--enable-dspark", "--dspark-precision=bf16"]), "--dtype") == "bfloat16"
    p = plan(["--enable-dspark", "--dspark-precision=fp8"])
    assert (flag(p, "--quantization"), flag(p, "--kv-cache-dtype")) == ("fp8", "fp8")
    p = plan(["--enable-dspark", "--dspark-precision=fp8"], "deepseek-v4.1")  # already an fp8 checkpoint
    assert "--quantization" not in p.vllm_argv and flag(p, "--kv-cache-dtype") == "fp8"
    with pytest.raises(KnobError, match="already quantized"):
        plan(["--enable-dspark", "--dspark-precision=bf16"], "deepseek-v4.1")
    with pytest.raises(KnobError, match="--dtype=float32"):
        plan(["--enable-dspark", "--dspark-precision=bf16", "--dtype", "float32"])


def test_passthrough_arguments_keep_their_order_and_tuning_flags_are_not_wrapped():
    args = ["--max-num-seqs", "128", "--block-size", "32", "--scheduling-policy", "priority",
            "--enable-chunked-prefill", "--tensor-parallel-size", "4"]
    p = plan(["--enable-dspark", *args])
    assert p.vllm_argv[:2 + len(args)] == ["--model", "/models/m", *args]
    assert p.vllm_argv[-2:] == ["--middleware", MIDDLEWARE]


def test_drafting_layer_loads_through_the_scheduler_class_with_its_settings():
    p = plan(["--enable-dspark", "--dspark-accept-threshold=0.6", "--dspark-speculative-length=6"], "llama", env=CPU)
    assert p.drafting["mode"] == "forced+statistical"
    assert flag(p, "--scheduler-cls") == "gpustack_dspark.worker.drafting.scheduler.DSparkDraftingScheduler"
    assert "--no-async-scheduling" in p.vllm_argv
    assert json.loads(flag(p, "--additional-config")) == {
        "dspark_drafting": {"mode": "forced+statistical", "threshold": 0.6, "length": 6,
                            "engines": ["xgrammar", "llguidance"]}}
    assert p.threshold["applied"] is True and "cut at the first token below" in p.threshold["mechanism"]
    assert not p.warnings and "drafting=forced+statistical" in p.startup_line()


def test_drafting_layer_modes_defaults_and_merged_additional_config():
    p = plan(["--enable-dspark", "--dspark-drafting=forced", "--additional-config", '{"x": 1}'], "llama", env=CPU)
    assert json.loads(flag(p, "--additional-config")) == {
        "x": 1, "dspark_drafting": {"mode": "forced", "threshold": 0.3, "length": 8,
                                    "engines": ["xgrammar", "llguidance"]}}
    assert p.threshold == {**p.threshold, "value": 0.3, "applied": True, "default": True}
    p = plan(["--enable-dspark", "--dspark-drafting=off"], "llama", env=CPU)
    assert p.drafting["mode"] == "off" and "--scheduler-cls" not in p.vllm_argv
    assert p.threshold["applied"] is False


def test_drafting_layer_off_where_drafts_never_reach_the_scheduler():
    p = plan(["--enable-dspark"], "deepseek-v4.1")
    assert p.method == "dspark" and p.drafting["mode"] == "off"
    assert "asynchronous scheduling" in p.drafting["reason"] and "--scheduler-cls" not in p.vllm_argv
    assert any("drafting layer off" in n for n in p.notes)
    with pytest.raises(KnobError, match="--dspark-drafting: 'forced' is not allowed.*never pass the scheduler"):
        plan(["--enable-dspark", "--dspark-drafting=forced"], "deepseek-v4.1")
    with pytest.raises(KnobError, match="needs --dspark-grammar-mode=json"):
        plan(["--enable-dspark", "--dspark-grammar-mode=off", "--dspark-drafting=forced"], "llama", env=CPU)
    with pytest.raises(KnobError, match="--scheduler-cls, which the drafting layer replaces"):
        plan(["--enable-dspark", "--dspark-drafting=forced+statistical", "--scheduler-cls", "x.Y"], "llama", env=CPU)
    with pytest.raises(KnobError, match="--additional-config: 'nope'"):
        plan(["--enable-dspark", "--additional-config", "nope"], "llama", env=CPU)
