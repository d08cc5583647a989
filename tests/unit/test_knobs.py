"""The knob table: parsing flags as users write them, validation messages, defaults."""

import pytest

from gpustack_dspark.knobs import KNOBS, DSparkKnobs, KnobError, build_knobs, knob_table_markdown, parse_knob_args


def test_both_flag_spellings_and_passthrough_order():
    knobs, rest = parse_knob_args(["--max-model-len", "4096", "--enable-dspark", "--dspark-speculative-length=6",
                                   "--dspark-accept-threshold", "0.7", "--enable-chunked-prefill"])
    assert (knobs.enable, knobs.speculative_length, knobs.accept_threshold) == (True, 6, 0.7)
    assert rest == ["--max-model-len", "4096", "--enable-chunked-prefill"]
    assert set(knobs.given) == {"enable", "speculative_length", "accept_threshold"}


def test_defaults():
    knobs, rest = parse_knob_args([])
    assert knobs == DSparkKnobs()
    assert (knobs.enable, knobs.grammar_mode, knobs.method, knobs.speculative_length) == (False, "json", "auto", None)


def test_last_occurrence_wins_like_argparse():
    knobs, _ = parse_knob_args(["--dspark-speculative-length", "3", "--dspark-speculative-length=9"])
    assert knobs.speculative_length == 9


@pytest.mark.parametrize("args,where,allowed", [
    (["--dspark-speculative-length", "0"], "--dspark-speculative-length", "an integer 1-16"),
    (["--dspark-speculative-length", "17"], "--dspark-speculative-length", "an integer 1-16"),
    (["--dspark-speculative-length", "five"], "--dspark-speculative-length", "an integer 1-16"),
    (["--dspark-accept-threshold", "1"], "--dspark-accept-threshold", "0 < x < 1"),
    (["--dspark-accept-threshold", "0"], "--dspark-accept-threshold", "0 < x < 1"),
    (["--dspark-accept-threshold", "nan"], "--dspark-accept-threshold", "0 < x < 1"),
    (["--dspark-method", "medusa"], "--dspark-method", "auto|dspark|mtp|suffix|ngram|draft_model|eagle3"),
    (["--dspark-grammar-mode", "yaml"], "--dspark-grammar-mode", "json|off"),
    (["--dspark-precision", "int4"], "--dspark-precision", "auto|bf16|fp8"),
    (["--dspark-warmup-concurrency", "0"], "--dspark-warmup-concurrency", "an integer 1-256"),
    (["--dspark-warmup-timeout", "-5"], "--dspark-warmup-timeout", "seconds"),
    (["--dspark-schema", "{not json"], "--dspark-schema", "a JSON Schema"),
    (["--dspark-schema", "[1, 2]"], "--dspark-schema", "a JSON Schema"),
])
def test_bad_values_name_the_flag_the_value_and_what_is_allowed(args, where, allowed):
    with pytest.raises(KnobError) as e:
        parse_knob_args(args)
    message = str(e.value)
    assert message.startswith(f"{where}: ")
    assert repr(args[1]) in message or args[1] in message
    assert allowed in message
    assert "\n" not in message


def test_unknown_dspark_flag_lists_the_valid_ones_and_suggests():
    with pytest.raises(KnobError) as e:
        parse_knob_args(["--dspark-speculative-lenght", "5"])
    message = str(e.value)
    assert "did you mean --dspark-speculative-length?" in message
    for knob in KNOBS:
        assert knob.flag in message


def test_missing_value():
    with pytest.raises(KnobError, match="needs a value"):
        parse_knob_args(["--dspark-method"])


def test_yaml_style_values_share_the_parsers():
    knobs = build_knobs({"speculative_length": 6, "accept_threshold": 0.7, "schema": {"type": "object"}, "enable": True})
    assert knobs.schema == '{"type": "object"}'
    with pytest.raises(KnobError, match="did you mean speculative_length"):
        build_knobs({"speculative_lenght": 6})
    with pytest.raises(KnobError, match="an integer 1-16"):
        build_knobs({"speculative_length": True})


def test_docs_table_is_generated_from_the_knobs():
    table = knob_table_markdown()
    for knob in KNOBS:
        assert f"`{knob.flag}`" in table


def test_worker_docs_carry_the_generated_table():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[2] / "docs" / "worker.md").read_text()
    between = docs.split("<!-- knob-table:start -->\n", 1)[1].split("<!-- knob-table:end -->", 1)[0]
    assert between.strip() == knob_table_markdown().strip(), "regenerate the table in docs/worker.md"
