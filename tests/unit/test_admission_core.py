"""The pure parts of admission: which knob values a write is refused for, and what a replica
that exits 2 at start says and whether it is restarted."""

from datetime import datetime, timedelta, timezone

from gpustack_dspark.admission import check, start_failure
from gpustack_dspark.backend_ids import BACKEND_NAME
from gpustack_dspark.knobs import scan_knob_tokens


def messages(*args):
    return [str(e) for e in check.refusals(*args)]


def test_only_dspark_models_are_judged():
    assert messages("vllm", ["--dspark-speculative-length=99"]) == []
    assert messages(BACKEND_NAME, ["--dspark-speculative-length=99"]) == [
        "--dspark-speculative-length: '99' is not allowed; allowed: auto or an integer 1-16"]


def test_every_problem_is_reported_and_the_last_value_of_a_knob_wins_as_in_dspark_serve():
    argv = ["--dspark-method=bogus", "--dspark-speculative-length", "99", "--dspark-method=ngram", "--max-num-seqs=4"]
    assert messages(BACKEND_NAME, argv) == ["--dspark-speculative-length: '99' is not allowed; allowed: auto or an integer 1-16"]
    both = check.refusal_message(check.refusals(BACKEND_NAME, ["--dspark-precision=int4", "--dspark-zz"]))
    assert both.startswith(check.MESSAGE_PREFIX + "--dspark-precision: 'int4'") and " | --dspark-zz: " in both


def test_on_update_only_changed_values_are_judged():
    stored = ["--enable-dspark", "--dspark-speculative-length=99", "--dspark-old-flag=1"]
    assert messages(BACKEND_NAME, stored, BACKEND_NAME, stored) == []  # a whole-object write
    assert messages(BACKEND_NAME, stored + ["--max-num-seqs=2"], BACKEND_NAME, stored) == []
    changed = ["--enable-dspark", "--dspark-speculative-length=98", "--dspark-old-flag=1"]
    assert messages(BACKEND_NAME, changed, BACKEND_NAME, stored) == [
        "--dspark-speculative-length: '98' is not allowed; allowed: auto or an integer 1-16"]
    # Switching a model to DSpark: everything is new.
    assert len(messages(BACKEND_NAME, stored, "vllm", stored)) == 2


def test_the_scanner_reads_flags_as_dspark_serve_does():
    tokens = scan_knob_tokens(["--enable-dspark", "--dspark-schema", "{\"type\": \"object\"}", "--x", "--dspark-method"])
    assert [(t.key, t.raw, t.error is None) for t in tokens] == [
        ("enable", "", True), ("schema", '{"type": "object"}', True), ("method", None, False)]
    assert "the flag needs a value" in str(tokens[-1].error)


LOG = """INFO 12-01 08:00:01 something
\x1b[31mdspark-serve: error: --dspark-schema: '/x.json' is not allowed (cannot read the file: No such file or directory); allowed: a JSON Schema\x1b[0m
"""


def test_the_error_line_comes_from_the_log_and_the_message_keeps_the_runtime_s_words():
    line = start_failure.error_line(LOG)
    assert line == ("dspark-serve: error: --dspark-schema: '/x.json' is not allowed (cannot read the file: "
                    "No such file or directory); allowed: a JSON Schema")
    assert start_failure.error_line("2026-12-01T08:00:00Z stderr F vllm: error: argument --max-num-seqs: x") == \
        "vllm: error: argument --max-num-seqs: x"
    assert start_failure.error_line("all fine\n") is None
    assert start_failure.error_line("p: error: " + "x" * 2000).endswith("...")
    message = start_failure.config_error_message(line, "Error (exit code 2)")
    assert message.startswith(line) and "(Error (exit code 2); " in message
    assert start_failure.is_held_message(message)
    assert start_failure.is_held_message(start_failure.config_error_message(None, "exit code 2", pending=True))
    assert "could not be read from its log: timeout" in start_failure.config_error_message(
        None, "exit code 2", unreadable="timeout")
    assert start_failure.is_config_exit("Error (exit code 2)") and not start_failure.is_config_exit("exit code 137")


def test_the_automatic_restart_is_held_until_the_model_changes():
    failed = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
    held = start_failure.config_error_message("p: error: x", "exit code 2")
    assert start_failure.hold_restart("error", held, "scheduled")
    assert not start_failure.hold_restart("error", "Error (exit code 1)", "scheduled")
    assert not start_failure.hold_restart("error", held, "error")
    assert not start_failure.changed_since(failed, failed - timedelta(minutes=5))
    assert start_failure.changed_since(failed, failed + timedelta(seconds=1))
    # GPUStack stores naive UTC timestamps; both kinds compare.
    assert start_failure.changed_since(failed.replace(tzinfo=None), failed + timedelta(seconds=1))
    assert not start_failure.changed_since(None, failed)
