"""`gpustack-dspark bench`: arguments, figures and report forms (pure), and clean errors."""

import json
import math

import pytest

from gpustack_dspark.bench import report, workloads
from gpustack_dspark.bench.load import Result, RunStats, spec_counters
from gpustack_dspark.bench.runner import TargetRun, is_loopback, normalize_target
from gpustack_dspark.cli.main import main


def _run(target="http://127.0.0.1:1", latencies=(0.1, 0.2, 0.3, 0.4), ttft=None, failed=0, spec=None):
    results = [Result(latency, 200, 10, '{"user_id": 1}', ttft_s=ttft) for latency in latencies]
    results += [Result(1.0, 500, error="HTTP 500: boom")] * failed
    stats = RunStats(2.0, results, format_errors=1)
    return TargetRun(target, "m", stats, spec=spec or {}, metrics_source="none here")


def test_figures():
    figures = report.figures(_run(spec={"acceptance_rate": 0.75, "tokens_per_verify": 3.0, "drafted": 8,
                                        "accepted": 6}, failed=1))
    assert figures["output_tok_s"] == 20.0 and figures["request_s"] == 2.0
    assert (figures["latency_p50_s"], figures["latency_p90_s"], figures["latency_p99_s"]) == (0.2, 0.4, 0.4)
    assert figures["ttft_p50_s"] is None  # not streamed
    assert figures["format_error_rate"] == 0.25 and figures["failed"] == 1 and figures["requests"] == 5
    assert figures["acceptance_rate"] == 0.75 and figures["tokens_per_forward"] == 3.0
    assert figures["errors"] == ["HTTP 500: boom"]
    nothing = report.figures(_run(spec={"acceptance_rate": math.nan}))
    assert nothing["acceptance_rate"] is None


def test_compare_forms():
    a, b = report.figures(_run(ttft=0.05)), report.figures(_run(latencies=(0.05, 0.1, 0.15, 0.2), ttft=0.02))
    ratios = report.ratios(a, b)
    assert ratios["latency_p99_s"] == 0.5 and ratios["ttft_p50_s"] == 0.4 and ratios["acceptance_rate"] is None
    settings = {"workload": "w", "concurrency": 2, "limit": "4 requests", "max_tokens": 8, "temperature": 0,
                "stream": True}
    text = report.as_text([a, b], settings)
    assert "B/A" in text and "latency P99 s" in text and "acceptance: none here" in text
    parsed = json.loads(report.as_json([a, b], settings))
    assert parsed["ratios_b_over_a"]["latency_p99_s"] == 0.5 and len(parsed["targets"]) == 2
    rows = report.as_csv([a, b]).splitlines()
    assert rows[0].startswith("target,model,output_tok_s") and rows[3].startswith("ratio B/A") and len(rows) == 4


def test_spec_counters_filter_by_model():
    text = "\n".join([
        'vllm:spec_decode_num_drafts_total{model_name="a"} 10.0',
        'vllm:spec_decode_num_drafts_total{model_name="b"} 99.0',
        'vllm:spec_decode_num_draft_tokens_total{model_name="a",engine="0"} 40.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{model_name="a",position="0"} 9.0',
    ])
    assert spec_counters(text, "a") == {"num_drafts_total": 10.0, "num_draft_tokens_total": 40.0}
    assert spec_counters(text)["num_drafts_total"] == 109.0


def test_targets_and_loopback():
    assert normalize_target("http://h:1/v1/") == "http://h:1"
    assert is_loopback("http://127.0.0.5:80") and is_loopback("http://localhost:1") and is_loopback("http://[::1]:2")
    assert not is_loopback("http://10.0.0.1:80") and not is_loopback("http://gpustack.example")


def test_workload_bodies_ask_for_the_schema():
    body = workloads.order_body(3, 64, 0.5, "m")
    assert body["response_format"]["json_schema"]["schema"] == workloads.ORDER_SCHEMA
    assert (body["model"], body["max_tokens"], body["temperature"]) == ("m", 64, 0.5)
    custom = workloads.schema_body(0, {"type": "object"}, 8, 0, "m")
    assert custom["response_format"]["json_schema"]["schema"] == {"type": "object"}


@pytest.mark.parametrize("argv, message", [
    (["--requests", "0"], "--requests 0: must be between 1 and 100000"),
    (["--concurrency", "5000"], "--concurrency 5000: must be between 1 and 1024"),
    (["--temperature", "3"], "--temperature 3.0: must be between 0.0 and 2.0"),
    (["--duration", "0.5"], "--duration 0.5: must be between 1 and 3600"),
    (["--schema", "/no/such/file"], "--schema /no/such/file: cannot read the file"),
    (["--server", "ftp://x"], "is not an http:// or https:// URL"),
    (["--server", "http://192.0.2.1:80", "--local-only"], "http://192.0.2.1:80 is not a loopback address"),
    (["--compare", "http://127.0.0.1:1", "http://127.0.0.1:2", "--metrics-url", "http://x/metrics"],
     "--metrics-url applies to one target"),
    (["--server", "http://127.0.0.1:1"], "cannot reach http://127.0.0.1:1"),
    (["--workload", "extraction", "--schema", "s.json"], "--schema and --workload extraction: give one"),
    (["--seed", "3"], "--seed is for --workload extraction"),
    (["--example", "per-family"], "--example per-family is for --workload extraction"),
    (["--workload", "invoices"], None),
])
def test_bad_arguments_give_one_line_errors(argv, message, capsys, monkeypatch, tmp_path):
    monkeypatch.delenv("GPUSTACK_SERVER_URL", raising=False)
    if "--server" not in argv and "--compare" not in argv:
        argv = argv + ["--server", "http://127.0.0.1:1"]
    if message is None:  # argparse's own refusal names the allowed choices
        with pytest.raises(SystemExit):
            main(["bench", *argv])
        assert "invalid choice: 'invoices' (choose from 'order', 'extraction')" in capsys.readouterr().err
        return
    assert main(["bench", *argv]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpustack-dspark bench: error: ") and message in err and err.count("\n") == 1, err


def test_schema_file_must_be_a_schema(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"type": 5}')
    assert main(["bench", "--server", "http://127.0.0.1:1", "--schema", str(bad)]) == 1
    assert "not a valid JSON schema" in capsys.readouterr().err
    bad.write_text("{nope")
    assert main(["bench", "--server", "http://127.0.0.1:1", "--schema", str(bad)]) == 1
    assert "not valid JSON" in capsys.readouterr().err


def test_requests_and_duration_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--server", "http://127.0.0.1:1", "--requests", "3", "--duration", "2"])
    assert "not allowed with argument" in capsys.readouterr().err


def test_no_target(capsys, monkeypatch):
    monkeypatch.delenv("GPUSTACK_SERVER_URL", raising=False)
    assert main(["bench"]) == 1
    assert "no target" in capsys.readouterr().err


def test_the_budget_trace_is_fixed_by_its_seed_and_counts_busy_time_once():
    from tests.bench import budget_trace

    first, again = budget_trace.trace(15), budget_trace.trace(15)
    assert first == again and [p for p in ("low", "high", "low2") if any(i["phase"] == p for i in first)] == \
        ["low", "high", "low2"]
    # Overlapping requests count their shared seconds once; idle gaps do not count.
    results = [{"at": 0.0, "done": 1.0}, {"at": 0.5, "done": 2.0}, {"at": 3.0, "done": 4.0}]
    assert budget_trace.busy_seconds(results) == 3.0 and budget_trace.busy_seconds([]) == 0.0


@pytest.mark.parametrize("extraction_tasks", [False, True])
def test_each_budget_trace_run_asks_what_no_earlier_run_asked(extraction_tasks):
    from tests.bench import budget_trace

    items = budget_trace.trace(15)
    runs = [budget_trace.Contents(15, run, extraction_tasks) for run in range(3)]
    asked = [json.dumps(c.body(item)["messages"]) for c in runs for item in items]
    assert len(set(asked)) == len(asked) == 3 * len(items)
    json_item = next(i for i in items if i["kind"] == "json")
    text_item = next(i for i in items if i["kind"] == "text")
    first = runs[0]
    assert not first.valid(text_item, "", "stop") and first.valid(text_item, "Once upon a time", "stop")
    assert not first.valid(json_item, '{"a": ', "length")
    if extraction_tasks:  # judged by the task's own schema
        truth = first.tasks[json_item["index"]].truth
        assert first.valid(json_item, json.dumps(truth), "stop") and not first.valid(json_item, '{"a": 1}', "stop")


def test_a_reply_cut_at_max_tokens_is_counted_as_cut_not_as_a_format_error():
    results = [Result(0.1, 200, 5, '{"a": 1}', finish_reason="stop"),
               Result(0.1, 200, 8, '{"a": "unfinis', finish_reason="length"),
               Result(0.1, 200, 5, '{"a": oops}', finish_reason="stop"),
               Result(0.1, 500, error="HTTP 500: boom")]
    stats = RunStats(1.0, results)
    stats.count_format_errors(lambda text: text.endswith("}") and "oops" not in text)
    assert stats.format_errors == 1 and stats.truncated == 1
    figures = report.figures(TargetRun("http://127.0.0.1:1", "m", stats, metrics_source="none"))
    assert figures["format_errors"] == 1 and figures["truncated"] == 1
