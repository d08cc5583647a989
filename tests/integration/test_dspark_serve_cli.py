"""`dspark-serve` as a program (worker venv): --print-vllm-args for every model family, checked
with vLLM's own parser and SpeculativeConfig, and every bad input exiting 2 with one line
before vLLM starts."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from gpustack_dspark.devstack.replica import TARGET_MODEL, dspark_serve_bin, worker_env, worker_python

pytestmark = pytest.mark.integration
CONFIGS = Path(__file__).parent.parent / "fixtures" / "configs"


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Checkpoint folders holding only a config.json: all dspark-serve reads before vLLM."""
    root = tmp_path_factory.mktemp("checkpoints")
    for config in CONFIGS.glob("*.json"):
        folder = root / config.stem
        folder.mkdir()
        shutil.copy(config, folder / "config.json")
    return root


def serve(*args, device="cuda", timeout=120):
    return subprocess.run([str(dspark_serve_bin()), *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=worker_env({"DSPARK_DEVICE": device}))


def printed_argv(*args, device="cuda"):
    done = serve(*args, "--print-vllm-args", device=device)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


# One worker-venv process for every case (each `dspark-serve` start imports vLLM for its tool
# parsers: about 18 s apiece idle, so nine cases took 2-3 minutes of a CI run): dspark-serve's
# own entry point prints each case's vLLM argv, and vLLM's parser reads it back. The program
# itself (exit codes, one-line errors) is run as a program by the tests below.
VLLM_CHECK = r"""
import contextlib, io, json, sys
from gpustack_dspark.worker.serve import main
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.config.speculative import SpeculativeConfig
fields = set(SpeculativeConfig.__dataclass_fields__)
for case in json.loads(sys.stdin.read()):
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main([*case, "--print-vllm-args"])
    argv = json.loads(printed.getvalue())
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    spec = args.speculative_config or {}
    unknown = set(spec) - fields
    assert not unknown, (argv, unknown)
    extra = args.additional_config or {}
    print(json.dumps({"model": args.model, "spec": spec,
                      "so": str(args.structured_outputs_config), "middleware": args.middleware,
                      "engines": (extra.get("dspark_drafting") or {}).get("engines") if isinstance(extra, dict) else None}))
"""


def test_every_family_translates_into_arguments_vllm_accepts(models):
    cases = {
        "v41": [models / "deepseek-v4.1", "--enable-dspark", "--dspark-speculative-length=6",
                "--dspark-accept-threshold", "0.7", "--tensor-parallel-size", "4"],
        "v3": [models / "deepseek-v3", "--enable-dspark"],
        "v32": [models / "deepseek-v3.2", "--enable-dspark"],
        "v4": [models / "deepseek-v4", "--enable-dspark"],
        "llama": [models / "llama", "--enable-dspark", "--max-num-seqs", "128"],
        "eagle3": [models / "llama", "--enable-dspark", "--dspark-draft-model", models / "draft-eagle3"],
        "draft": [models / "llama", "--enable-dspark", "--dspark-draft-model", models / "draft-llama-small"],
        "qwen3-dspark": [models / "qwen3", "--enable-dspark", "--dspark-draft-model", models / "draft-dspark-qwen3"],
        "plain": [models / "llama", "--max-num-seqs", "64"],
    }
    done = subprocess.run([str(worker_python()), "-c", VLLM_CHECK],
                          input=json.dumps([[str(a) for a in argv] for argv in cases.values()]),
                          capture_output=True, text=True, timeout=300, env=worker_env({"DSPARK_DEVICE": "cuda"}))
    assert done.returncode == 0, done.stderr[-3000:]
    parsed = dict(zip(cases, (json.loads(line) for line in done.stdout.strip().splitlines()[-len(cases):])))
    assert parsed["v41"]["spec"]["method"] == "dspark" and parsed["v41"]["spec"]["num_speculative_tokens"] == 6
    assert parsed["v41"]["spec"]["enable_adaptive_verification"] is True
    assert {parsed[k]["spec"]["method"] for k in ("v3", "v32", "v4")} == {"mtp"}
    assert parsed["llama"]["spec"]["method"] == "ngram"
    assert parsed["eagle3"]["spec"]["method"] == "eagle3"
    assert parsed["draft"]["spec"]["method"] == "draft_model"
    assert parsed["qwen3-dspark"]["spec"]["method"] == "dspark"
    assert parsed["plain"]["spec"] == {}
    assert all(p["middleware"] == ["gpustack_dspark.worker.middleware.DSparkMiddleware"] for p in parsed.values())
    # The drafting layer on (n-gram base): both engines, compact whitespace set by the layer on
    # each (vLLM takes the flag only beside one named backend); off (dspark's own drafter):
    # xgrammar with the flag.
    assert "backend='auto'" in parsed["llama"]["so"] and parsed["llama"]["engines"] == ["xgrammar", "llguidance"]
    assert "backend='xgrammar'" in parsed["v41"]["so"] and "disable_any_whitespace=True" in parsed["v41"]["so"]
    assert parsed["v41"]["engines"] is None


def test_server_config_file(models, tmp_path):
    config = tmp_path / "server.yaml"
    config.write_text(f"""
model: {{path: {models / 'deepseek-v4.1'}, name: v41-json}}
server: {{host: 127.0.0.1, port: 9000}}
engine:
  max_model_len: 32768
  continuous_batching: {{max_batch_size: 64}}
  speculative_decoding: {{enabled: true, strategy: dspark, speculative_length: 6}}
resources: {{gpu_memory_utilization: 0.9}}
enable_metrics: true
""")
    argv = printed_argv("--config", config)
    assert argv[:2] == ["--model", str(models / "deepseek-v4.1")]
    for pair in (["--served-model-name=v41-json"], ["--max-num-seqs=64"], ["--gpu-memory-utilization=0.9"]):
        assert pair[0] in argv
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert (spec["method"], spec["num_speculative_tokens"]) == ("dspark", 6)

    config.write_text("engine:\n  speculative_decoding:\n    strategy: dspark\n    lenght: 6\n")
    done = serve("--config", config, "--print-vllm-args")
    assert done.returncode == 2
    assert "engine.speculative_decoding.lenght" in done.stderr and "unknown key" in done.stderr


LOOKBEHIND = '{"type":"object","properties":{"c":{"type":"string","pattern":"(?<=a)b"}}}'


@pytest.mark.parametrize("case,args,expected", [
    ("range", ["llama", "--enable-dspark", "--dspark-speculative-length", "0"],
     ["--dspark-speculative-length", "'0'", "an integer 1-16"]),
    ("threshold", ["llama", "--enable-dspark", "--dspark-accept-threshold=1.5"],
     ["--dspark-accept-threshold", "'1.5'", "0 < x < 1"]),
    ("unknown flag", ["llama", "--enable-dspark", "--dspark-turbo"],
     ["--dspark-turbo", "--dspark-speculative-length", "--dspark-warmup-timeout"]),
    ("unreadable schema", ["llama", "--enable-dspark", "--dspark-schema", "/nonexistent/order.json"],
     ["--dspark-schema", "cannot read the file"]),
    ("not a schema", ["llama", "--enable-dspark", "--dspark-schema", '{"type": 12}'],
     ["--dspark-schema", "not a valid JSON Schema"]),
    ("uncompilable schema", ["llama", "--enable-dspark", "--dspark-schema", LOOKBEHIND],
     ["--dspark-schema", "cannot compile"]),
    ("mtp on v4.1", ["deepseek-v4.1", "--enable-dspark", "--dspark-method=mtp"],
     ["--dspark-method", "'mtp'", "use dspark"]),
    ("dspark on llama", ["llama", "--enable-dspark", "--dspark-method", "dspark"],
     ["--dspark-method", "'dspark'", "DeepSeek-V4.1"]),
    ("own speculative config", ["llama", "--enable-dspark", "--speculative-config", '{"method":"ngram"}'],
     ["--speculative-config", "cannot be combined with --enable-dspark"]),
    ("missing draft", ["llama", "--enable-dspark", "--dspark-draft-model", "/nonexistent/draft"],
     ["--dspark-draft-model", "no such folder"]),
    ("bad warmup file", ["llama", "--enable-dspark", "--dspark-warmup-file", "/nonexistent/w.jsonl"],
     ["--dspark-warmup-file", "cannot read"]),
])
def test_bad_input_exits_2_with_one_line_before_vllm_starts(models, case, args, expected):
    done = serve(models / args[0], *args[1:], "--host", "127.0.0.1", "--port", "1")
    assert done.returncode == 2, (case, done.stdout[-500:], done.stderr[-500:])
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dspark-serve: error: "), done.stderr
    for fragment in expected:
        assert fragment in lines[0], (case, lines[0])


def test_arguments_vllm_rejects_exit_2_with_one_line():
    done = serve(TARGET_MODEL, "--enable-dspark", "--no-such-vllm-flag", "--host", "127.0.0.1", "--port", "1",
                 device="cpu", timeout=300)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("dspark-serve: error:")]
    assert errors and "vLLM rejects the arguments" in errors[0] and "--no-such-vllm-flag" in errors[0]
