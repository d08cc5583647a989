"""`gpustack-dspark sweep`: the grid's arguments and their errors, the table, the best setting
per load, the YAML suggestion and the PNG (a real image, read back). The heavy run against a
real replica is a script (docs/drafting.md), not a test."""

import json

import pytest

from gpustack_dspark.bench import sweep
from gpustack_dspark.cli.main import main

MODEL = "fixtures/models/tiny-order-llama"


def test_lengths_thresholds_and_levels_parse():
    assert sweep.parse_lengths("8,0,2-4,auto,4") == [0, 2, 3, 4, 8, "auto"]
    assert sweep.parse_thresholds("0.7, 0.3") == [0.3, 0.7]
    assert sweep.parse_concurrency("8,1") == [1, 8]
    settings = sweep.grid([0, 4, "auto"], [0.3, 0.7], [1, 8])
    assert [s.label for s in settings] == ["no speculation", "length 4, threshold 0.3", "length 4, threshold 0.7",
                                           "length auto, threshold 0.3", "length auto, threshold 0.7"]
    assert settings[0].serve_args() == []
    assert settings[3].serve_args() == ["--enable-dspark", "--dspark-speculative-length=auto",
                                        "--dspark-accept-threshold=0.3"]


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "0,17"], "--lengths: 17 is not allowed; allowed: integers 0-16, ranges like 2-8, auto"),
    (["--lengths", "two"], "--lengths: 'two' is not allowed; allowed: integers 0-16, ranges like 2-8, auto"),
    (["--lengths", "8-2"], "--lengths: '8-2' is an empty range; allowed: low-high with low <= high"),
    (["--lengths", "2,,4"], "--lengths: '2,,4' is not allowed; allowed: a comma-separated list without empty items"),
    (["--thresholds", "1.5"], "--thresholds: '1.5' is not allowed; allowed: numbers 0 < x < 1, comma-separated"),
    (["--thresholds", "nan"], "--thresholds: 'nan' is not allowed; allowed: numbers 0 < x < 1, comma-separated"),
    (["--concurrency", "0"], "--concurrency: '0' is not allowed; allowed: integers 1-1024, comma-separated"),
    (["--lengths", "0-16", "--thresholds", "0.1,0.2,0.3,0.4,0.5,0.6,0.7", "--concurrency", "1,2,4"],
     "the grid has 339 cells; allowed: at most 200 (fewer --lengths, --thresholds or --concurrency levels)"),
    (["--requests", "0"], "--requests 0: must be between 1 and 100000"),
    (["--serve-args=--dspark-speculative-length=4"],
     "--serve-args: --dspark-speculative-length is set by the sweep per setting; leave it out"),
    (["--serve-args", "'unclosed"], "--serve-args \"'unclosed\": No closing quotation"),
])
def test_bad_arguments_fail_before_anything_starts(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sweep", "--model-path", MODEL, "--out", str(out), *argv])
    assert code == 2
    assert capsys.readouterr().err.strip() == f"gpustack-dspark sweep: error: {message}"
    assert not out.exists()  # nothing was touched


def test_a_model_path_without_a_model_and_an_out_that_is_a_file(tmp_path, capsys):
    assert main(["sweep", "--model-path", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "not a model directory (no config.json)" in capsys.readouterr().err
    path = tmp_path / "file"
    path.write_text("x")
    assert main(["sweep", "--model-path", MODEL, "--out", str(path)]) == 2
    assert "exists and is not a directory" in capsys.readouterr().err


def rows(table):
    out = []
    for length, threshold, level, goodput in table:
        out.append(sweep.Row(length, threshold, level, 16, 0, goodput, goodput, 1.0, 2.0, 0.1, 0.8, 3.0, 0))
    return out


def test_one_best_setting_everywhere_is_suggested_as_it_is():
    table = rows([(0, None, 1, 10.0), (4, 0.3, 1, 30.0), (8, 0.3, 1, 20.0),
                  (0, None, 8, 50.0), (4, 0.3, 8, 90.0), (8, 0.3, 8, 70.0)])
    rec = sweep.recommendation(table)
    assert rec["setting"] == {"speculative_length": 4, "accept_threshold": 0.3}
    assert rec["yaml"] == "dspark:\n  speculative_length: 4\n  accept_threshold: 0.3\n"


def test_a_best_setting_that_moves_with_load_suggests_auto():
    table = rows([(0, None, 1, 10.0), (8, 0.3, 1, 30.0), (4, 0.3, 1, 20.0),
                  (0, None, 32, 95.0), (8, 0.3, 32, 60.0), (4, 0.3, 32, 90.0)])
    best = sweep.best_per_load(table)
    assert (best[1].length, best[32].length) == (8, 0)
    rec = sweep.recommendation(table)
    assert rec["yaml"] == "dspark:\n  speculative_length: auto\n"
    assert "concurrency 1: length 8" in rec["why"] and "concurrency 32: no speculation" in rec["why"]
    text = sweep.as_text(table)
    assert "recommendation:" in text and "speculative_length: auto" in text


def test_csv_json_and_a_png_that_opens(tmp_path):
    table = rows([(0, None, 1, 10.0), (2, 0.3, 1, 18.0), (4, 0.3, 1, 25.0), ("auto", 0.3, 1, 27.0),
                  (0, None, 8, 40.0), (2, 0.3, 8, 55.0), (4, 0.3, 8, 50.0), ("auto", 0.3, 8, 57.0)])
    csv_text = sweep.as_csv(table)
    assert csv_text.splitlines()[0] == ",".join(sweep.COLUMNS) and len(csv_text.splitlines()) == 9
    doc = json.loads(sweep.as_json(table, {"requests": 16}))
    assert doc["best_per_concurrency"]["8"]["length"] == "auto"
    assert doc["recommendation"]["yaml"].startswith("dspark:\n  speculative_length: auto")
    path = tmp_path / "sweep.png"
    sweep.plot(table, str(path))
    import matplotlib.image

    image = matplotlib.image.imread(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert image.shape[0] == 500 and image.shape[1] == 800
    assert image[..., :3].std() > 0.05  # something is drawn


def test_goodput_counts_only_replies_that_pass_the_format_check():
    from gpustack_dspark.bench.load import Result, RunStats, json_check

    stats = RunStats(2.0, [Result(1.0, 200, 10, '{"a": 1}'), Result(1.0, 200, 30, "not json"),
                           Result(1.0, 500, 50, "")])
    assert sweep.goodput(stats, json_check(None)) == 5.0
    assert sweep.goodput(RunStats(0.0, []), json_check(None)) == 0.0


def test_the_batch_size_table_for_gpu_methods():
    table = rows([(0, None, 1, 10.0), (8, 0.3, 1, 30.0), (4, 0.3, 1, 20.0), ("auto", 0.3, 1, 99.0),
                  (0, None, 8, 60.0), (8, 0.3, 8, 50.0), (4, 0.3, 8, 70.0),
                  (0, None, 32, 95.0), (8, 0.3, 32, 60.0), (4, 0.3, 32, 90.0),
                  (0, None, 64, 99.0), (4, 0.3, 64, 90.0)])
    # auto is left out; 1 -> 8, 8 -> 4, 32 and 64 -> 0 (merged); splits at sqrt(1*8)=2, sqrt(8*32)=16.
    assert sweep.batch_size_table(table) == [[1, 2, 8], [3, 16, 4], [17, 1024, 0]]
    assert sweep.batch_size_table(rows([("auto", 0.3, 1, 9.0)])) is None
    assert json.loads(sweep.as_json(table, {}))["vllm_num_speculative_tokens_per_batch_size"][0] == [1, 2, 8]


def test_a_setting_on_a_deployment_replaces_only_the_swept_knobs():
    params = ["--enforce-eager", "--enable-dspark", "--dspark-speculative-length", "auto",
              "--dspark-speculative-max=12", "--dspark-grammar-mode=json", "--dspark-accept-threshold=0.5"]
    fixed = sweep.deployment_parameters(params, sweep.Setting(4, 0.3))
    assert fixed == ["--enforce-eager", "--enable-dspark", "--dspark-speculative-length=4",
                     "--dspark-grammar-mode=json", "--dspark-accept-threshold=0.3"]  # max only goes with auto
    auto = sweep.deployment_parameters(["--enable-dspark"], sweep.Setting("auto", None))
    assert auto == ["--enable-dspark", "--dspark-speculative-length=auto"]
    with pytest.raises(sweep.GridError, match="--lengths 0: no speculation would turn DSpark off"):
        sweep.deployment_parameters(params, sweep.Setting(0, None))
    info = {"phase": "ready", "enabled": True, "knobs": {"speculative_length": 4, "accept_threshold": 0.3}}
    assert sweep.shows_setting(info, sweep.Setting(4, 0.3))
    assert not sweep.shows_setting(info, sweep.Setting(4, 0.5))
    assert not sweep.shows_setting({**info, "phase": "warming"}, sweep.Setting(4, 0.3))
    assert sweep.shows_setting({"phase": "ready", "enabled": True, "knobs": {"speculative_length": "auto"}},
                               sweep.Setting("auto", None))


@pytest.mark.parametrize("argv, message", [
    (["--lengths", "0,4"], "--lengths 0: no speculation would turn DSpark off"),
    (["--serve-args=--enforce-eager"], "--serve-args: only for scratch replicas"),
    (["--server", "ftp://x"], "--server 'ftp://x': a GPUStack URL (http:// or https://) is needed"),
    (["--api-key", ""], "--api-key: a GPUStack API key is needed with --deployment"),
])
def test_a_rolling_sweep_refuses_bad_arguments_before_it_connects(argv, message, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["sweep", "--out", str(out), "--deployment", "orders", "--server", "http://127.0.0.1:9",
                 "--api-key", "k", *argv])
    assert code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("argv, message", [
    (["--deployment", "orders", "--model-path", MODEL], "argument --model-path: not allowed with argument --deployment"),
    ([], "one of the arguments --model-path --deployment is required"),
])
def test_a_sweep_takes_a_model_path_or_a_deployment(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["sweep", "--out", str(tmp_path / "out"), *argv])
    assert exited.value.code == 2 and message in capsys.readouterr().err
