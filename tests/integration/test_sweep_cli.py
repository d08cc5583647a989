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


VLLM_PARSE = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup, validate_and_normalize_dynamic_sd_schedule
table = json.loads(sys.argv[1])
validate_and_normalize_dynamic_sd_schedule(table)
print(json.dumps(build_dynamic_sd_schedule_lookup(table, 64, 8)))
"""


def test_the_batch_size_table_is_accepted_by_vllms_own_parser():
    import subprocess

    from gpustack_dspark.bench import sweep
    from gpustack_dspark.devstack.replica import worker_env, worker_python

    rows = [sweep.Row(length, threshold, level, 8, 0, goodput, goodput, 1.0, 1.0, 0.1, 0.9, 3.0, 0)
            for length, threshold, level, goodput in ((0, None, 1, 10.0), (8, 0.3, 1, 30.0), (0, None, 8, 60.0),
                                                      (4, 0.3, 8, 70.0), (0, None, 32, 95.0), (4, 0.3, 32, 90.0))]
    table = sweep.batch_size_table(rows)
    out = subprocess.run([str(worker_python()), "-c", VLLM_PARSE, json.dumps(table)], env=worker_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lookup = json.loads(out.stdout.strip().splitlines()[-1])
    assert (lookup[1], lookup[2], lookup[3], lookup[16], lookup[17], lookup[64]) == (8, 8, 4, 4, 0, 0)
