"""`gpustack-dspark sweep` end to end against a real scratch replica (vLLM 0.32 on CPU, the tiny
fixture model): the smallest grid (one setting, one concurrency level, two requests) — the
table, the CSV/JSON, a PNG that opens, the YAML suggestion, the budget on in the replica."""

import json

import pytest

from gpustack_dspark.cli.main import main
from gpustack_dspark.devstack.replica import TARGET_MODEL, dspark_serve_bin

pytestmark = pytest.mark.integration


def test_sweep_on_a_scratch_replica_writes_its_table_png_and_suggestion(tmp_path, capsys):
    assert dspark_serve_bin().exists(), "make worker-venv first"
    out = tmp_path / "sweep"
    code = main(["sweep", "--model-path", str(TARGET_MODEL), "--lengths", "auto", "--thresholds", "0.3",
                 "--concurrency", "2", "--requests", "2", "--warmup", "0", "--max-tokens", "128",
                 "--out", str(out), "--no-progress"])
    printed = capsys.readouterr()
    assert code == 0, printed.err[-3000:]
    doc = json.loads((out / "sweep.json").read_text())
    (row,) = doc["rows"]
    assert (row["length"], row["threshold"], row["concurrency"], row["requests"], row["failed"]) == ("auto", 0.3, 2, 2, 0)
    assert row["goodput_tok_s"] > 0 and row["format_errors"] == 0
    assert doc["recommendation"]["yaml"] == "dspark:\n  speculative_length: auto\n  accept_threshold: 0.3\n"
    assert (out / "sweep.csv").read_text().splitlines()[1].startswith("auto,0.3,2,2,0,")
    import matplotlib.image

    assert matplotlib.image.imread(str(out / "sweep.png")).shape[:2] == (500, 800)
    assert "recommendation:" in printed.out and "speculative_length: auto" in printed.out
    log = (out / "replica-1.log").read_text()
    assert "speculative_length=auto(max 8)" in log and "budget=auto" in log
