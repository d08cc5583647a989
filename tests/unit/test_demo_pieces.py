"""The demo's pure pieces: which model file it applies and how, and its benchmark line."""

from pathlib import Path

import pytest

from gpustack_dspark.bench import report
from gpustack_dspark.bench.load import Result, RunStats
from gpustack_dspark.bench.runner import TargetRun
from gpustack_dspark.devstack.demo import bench_summary
from gpustack_dspark.devstack import real_model
from gpustack_dspark.devstack.demo import main as demo_main
from gpustack_dspark.devstack.demo_model import (DEMO_MODEL_FILE, FIXTURE_MODEL_FILE, apply_argv,
                                                 model_name_and_replicas, real_model_wanted, with_real_model)


def test_the_demo_deploys_the_cpu_demo_file_with_the_cli():
    assert model_name_and_replicas(DEMO_MODEL_FILE) == ("smollm2-135m-instruct", 2)
    assert model_name_and_replicas(FIXTURE_MODEL_FILE) == ("tiny-order", 2)
    argv = apply_argv(DEMO_MODEL_FILE, "http://127.0.0.1:9180", "key-1")
    assert argv[-8:] == ["apply", "-f", str(DEMO_MODEL_FILE), "--no-wait", "--server", "http://127.0.0.1:9180",
                         "--api-key", "key-1"]
    assert Path(argv[0]).name == "gpustack-dspark" or argv[-9:-8] == ["gpustack_dspark.cli.main"]


def test_the_real_model_is_converted_first_and_applied_where_the_conversion_is(tmp_path):
    assert real_model_wanted(DEMO_MODEL_FILE) and not real_model_wanted(FIXTURE_MODEL_FILE)
    link = real_model.link_path(tmp_path / "cache" / "gpustack-dspark" / "models")
    link.parent.mkdir(parents=True)
    target = link.with_name(link.name + "-abc")
    target.mkdir()
    link.symlink_to(target.name)
    # the demo file's ~/.cache is not this cache folder: a copy naming the conversion is applied
    copy = with_real_model(DEMO_MODEL_FILE, target, tmp_path)
    assert copy.parent == tmp_path and f"local_path: {target}" in copy.read_text()
    assert model_name_and_replicas(copy) == ("smollm2-135m-instruct", 2)
    # a file whose local_path reaches the conversion is applied as it is
    own = tmp_path / "own.yaml"
    own.write_text(f"name: m\nsource: local_path\nlocal_path: {link}\n")
    assert real_model_wanted(own) and with_real_model(own, target, tmp_path / "x") == own


def test_the_fixture_is_one_flag_away_and_not_both(capsys):
    with pytest.raises(SystemExit) as stop:
        demo_main(["--fixture", "--model-file", str(FIXTURE_MODEL_FILE)])
    assert stop.value.code == 2 and "--fixture and --model-file: give one" in capsys.readouterr().err


def test_a_demo_file_with_more_than_one_model_is_refused(tmp_path):
    two = tmp_path / "two.yaml"
    two.write_text("name: a\n---\nname: b\n")
    with pytest.raises(ValueError, match="one document that has a name"):
        model_name_and_replicas(two)


def test_the_benchmark_line_carries_the_bench_figures():
    stats = RunStats(2.0, [Result(0.5, 200, 40, '{"a": 1}'), Result(1.5, 200, 60, "{"), Result(0.1, 502, error="x")])
    stats.format_errors = 1
    run = TargetRun("http://127.0.0.1:1", "tiny-order", stats,
                    spec={"acceptance_rate": 0.8, "tokens_per_verify": 3.5, "drafted": 10, "accepted": 8})
    line = bench_summary(report.figures(run))
    assert line["requests"] == 3 and line["failed"] == 1 and line["format_errors"] == 1
    assert line["tok_per_s"] == 50.0 and line["acceptance_rate"] == 0.8 and line["tokens_per_forward"] == 3.5
    assert 0.5 <= line["p50_s"] <= line["p99_s"] <= 1.5


def _stop_reason(signal_after_s):
    """The main thread waits for a stop while another thread finds the output dead; a SIGTERM
    (as a terminal sends the whole job, the pipe's reader included) follows after
    `signal_after_s`, or never. Returns the stop's reason."""
    import io
    import os
    import signal
    import threading
    import time

    from gpustack_dspark.devstack.demo import DemoStop, Stopper
    from gpustack_dspark.devstack.progress import Progress

    stopper = Stopper(Progress(stream=io.StringIO()))
    saved = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    stopper.install()
    try:
        threading.Thread(target=stopper.output_died, daemon=True).start()
        with pytest.raises(DemoStop):
            if signal_after_s is not None:
                time.sleep(signal_after_s)
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
        return stopper.reason
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def test_a_signal_that_also_killed_the_reader_names_the_stop():
    # Seen in CI: the output watcher saw the dead pipe before the main thread ran the SIGTERM
    # handler, and the stop was logged as a dead output.
    assert _stop_reason(0.1) == "SIGTERM"


def test_a_dead_output_without_a_signal_stops_the_demo_after_the_grace():
    assert _stop_reason(None) == "its output is gone (the pipe's reader or the terminal)"
