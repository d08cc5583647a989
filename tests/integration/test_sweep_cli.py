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


# A stand-in for `dspark-serve` (the scratch replica the sweep starts): the devstack's stand-in
# vLLM replica (OpenAI chat completions, SSE with a usage chunk), plus the worker's readiness gate
# `/dspark/ready`, on the --port the sweep gives it. It writes its pid so the test can see it gone.
STAND_IN_SERVE = r'''#!{python}
import os, sys, threading, time
sys.path.insert(0, {repo!r})
from starlette.responses import JSONResponse
from starlette.routing import Route
from tests.support.stand_in_replica import StandInReplica

class Serve(StandInReplica):
    def _app(self):
        app = super()._app()

        async def ready(_request):
            return JSONResponse({{"ready": True}})

        app.router.routes.append(Route("/dspark/ready", ready))
        return app

port = int(sys.argv[sys.argv.index("--port") + 1])
with open(os.path.join({pids!r}, str(os.getpid())), "w"):
    pass
replica = Serve("tiny-order", base_s=0.08)
replica.port = port
replica.start()
threading.Event().wait()
'''

# (what the SIGINT is sent after: a line of the sweep's stderr, then a delay; how many SIGINTs)
MOMENTS = [
    ("[1/2]", 0.0, 1),  # while the first scratch replica starts
    ("concurrency 1: goodput", 0.0, 1),  # as the next level's event loop is made (the e2e's moment)
    ("concurrency 1: goodput", 0.003, 1),
    ("concurrency 1: goodput", 0.02, 1),
    ("concurrency 1: goodput", 0.3, 1),  # mid-level
    ("concurrency 1: goodput", 0.01, 2),  # Ctrl-C twice: the second lands in the cleanup
    ("[2/2]", 0.0, 1),  # while the second replica starts, the first one stopping
]


def test_ctrl_c_at_any_moment_of_a_scratch_sweep_says_interrupted_and_exits_130(tmp_path):
    """The scratch sweep against a stand-in dspark-serve, one SIGINT (or two) at each of several
    moments: "interrupted", exit 130, no traceback, every scratch replica stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    import gpustack_dspark

    repo = str(Path(gpustack_dspark.__file__).resolve().parents[1])
    venv = tmp_path / "worker"
    (venv / "bin").mkdir(parents=True)
    pids = tmp_path / "pids"
    pids.mkdir()
    serve = venv / "bin" / "dspark-serve"
    serve.write_text(STAND_IN_SERVE.format(python=sys.executable, repo=repo, pids=str(pids)))
    serve.chmod(0o755)
    env = {**os.environ, "DSPARK_WORKER_VENV": str(venv), "PYTHONPATH": repo}
    for index, (after, delay_s, signals) in enumerate(MOMENTS):
        out = tmp_path / f"sweep-{index}"
        sweep = subprocess.Popen([sys.executable, "-m", "gpustack_dspark.cli.main", "sweep", "--model-path",
                                  str(TARGET_MODEL), "--lengths", "2,4", "--concurrency", "1,2", "--requests", "8",
                                  "--warmup", "0", "--out", str(out), "--no-progress", "--device", "cuda"],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seen = []
        try:
            for line in sweep.stderr:
                seen.append(line)
                if after in line:
                    time.sleep(delay_s)
                    for n in range(signals):
                        sweep.send_signal(signal.SIGINT)
                        time.sleep(0.005)
                    break
            _, rest = sweep.communicate(timeout=120)
        finally:
            sweep.kill()
        err = "".join(seen) + rest
        moment = f"SIGINT x{signals} {delay_s} s after {after!r}"
        assert sweep.returncode == 130, (moment, sweep.returncode, err[-3000:])
        assert "gpustack-dspark sweep: interrupted" in err, (moment, err[-3000:])
        for noise in ("Traceback", "Exception ignored", "was never awaited", "Task was destroyed"):
            assert noise not in err, (moment, err[-3000:])
    left = []
    for pid in pids.iterdir():
        try:
            os.kill(int(pid.name), 0)
            left.append(pid.name)
        except ProcessLookupError:
            pass
    assert list(pids.iterdir()) and not left, left  # every replica it started is gone
