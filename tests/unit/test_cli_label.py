"""`gpustack-dspark label`: the pure parts, and the CLI's import rule."""

import ast
from pathlib import Path

import pytest

from gpustack_dspark.cli.client import CLIError
from gpustack_dspark.cli.label import apply_changes, find_worker, parse_changes
from gpustack_dspark.cli.main import build_parser, main

CLI = Path(__file__).resolve().parents[2] / "gpustack_dspark" / "cli"
WORKERS = [{"id": 1, "name": "json-a"}, {"id": 2, "name": "gen-b"}, {"id": 3, "name": "2"}]


def test_changes_are_validated_naming_the_value():
    assert parse_changes(["role=json-inference", "tier=a"], ["old"]) == (
        {"role": "json-inference", "tier": "a"}, ["old"])
    with pytest.raises(CLIError, match="'role' is not KEY=VALUE"):
        parse_changes(["role"], [])
    with pytest.raises(CLIError, match="label value 'a b' is not a valid label value"):
        parse_changes(["role=a b"], [])
    with pytest.raises(CLIError, match="--remove: label key 'bad key' is not a valid label key"):
        parse_changes([], ["bad key"])
    with pytest.raises(CLIError, match="'role' is both set and removed"):
        parse_changes(["role=x"], ["role"])
    with pytest.raises(CLIError, match="nothing to do"):
        parse_changes([], [])


def test_apply_changes_merges_then_removes():
    assert apply_changes({"os": "linux", "role": "x"}, {"tier": "a"}, ["role", "absent"]) == {
        "os": "linux", "tier": "a"}


def test_workers_by_name_then_id_and_unknown_lists_the_known():
    assert find_worker(WORKERS, "gen-b")["id"] == 2
    assert find_worker(WORKERS, "1")["name"] == "json-a"
    assert find_worker(WORKERS, "2")["id"] == 3  # a worker named "2" wins over id 2
    with pytest.raises(CLIError) as e:
        find_worker(WORKERS, "nope")
    assert str(e.value) == "no worker named or numbered 'nope'; known workers: json-a (id 1), gen-b (id 2), 2 (id 3)"


def test_missing_server_or_key_is_a_clear_error(capsys, monkeypatch):
    monkeypatch.delenv("GPUSTACK_SERVER_URL", raising=False)
    monkeypatch.delenv("GPUSTACK_API_KEY", raising=False)
    assert main(["label", "w", "role=x"]) == 1
    assert "pass --server URL or set GPUSTACK_SERVER_URL" in capsys.readouterr().err
    assert main(["label", "w", "role=x", "--server", "http://127.0.0.1:9"]) == 1
    assert "pass --api-key KEY or set GPUSTACK_API_KEY" in capsys.readouterr().err


def test_subcommands_plug_into_one_parser():
    args = build_parser().parse_args(["label", "w", "a=b", "--remove", "c", "--server", "http://x", "--api-key", "k"])
    assert (args.command, args.worker, args.labels, args.remove, args.server) == ("label", "w", ["a=b"], ["c"], "http://x")


# The bench modules the CLI may import; they talk HTTP only (checked below).
CLI_BENCH_MODULES = {"gpustack_dspark.bench.load", "gpustack_dspark.bench.runner", "gpustack_dspark.bench.report",
                     "gpustack_dspark.bench.workloads", "gpustack_dspark.bench.extraction"}


# The console's pure planners the rolling sweep shares (cli/sweep_rolling.py, bench/sweep.py).
CLI_CONSOLE_MODULES = {"gpustack_dspark.console.rollout", "gpustack_dspark.console.editor"}


def test_the_console_planners_the_cli_uses_import_only_knobs():
    for module in CLI_CONSOLE_MODULES:
        path = CLI.parent / "console" / (module.rsplit(".", 1)[1] + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert all(not n.startswith("gpustack") or n == "gpustack_dspark.knobs" for n in names
                           if n.startswith("gpustack")), (path, names)


def test_the_bench_modules_the_cli_uses_import_no_gpustack_server_or_devstack():
    bench = CLI.parent / "bench"
    for module in CLI_BENCH_MODULES:
        path = bench / (module.rsplit(".", 1)[1] + ".py")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                ours = [n for n in names if n.startswith("gpustack_dspark")]
                assert all(n in CLI_BENCH_MODULES for n in ours), (path, names)
                assert not any(n == "gpustack" or n.startswith("gpustack.") for n in names), (path, names)


def test_the_cli_imports_no_server_side_module():
    allowed = {"gpustack_dspark", "gpustack_dspark.labels", "gpustack_dspark.knobs", "gpustack_dspark.translate",
               "gpustack_dspark.backend_ids",
               *CLI_BENCH_MODULES, "gpustack_dspark.bench", *CLI_CONSOLE_MODULES}
    for path in CLI.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpustack_dspark"):
                # The one documented exception: `sweep` starts scratch replicas with devstack's
                # process helpers, imported inside its functions only (when a sweep runs).
                lazy_devstack = (path.name == "sweep.py" and node.module.startswith("gpustack_dspark.devstack.")
                                 and node not in tree.body)
                assert node.module in allowed or node.module.startswith("gpustack_dspark.cli") or lazy_devstack, \
                    (path, node.module)
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not any(n == "gpustack" or n.startswith("gpustack.") for n in names), (path, names)
