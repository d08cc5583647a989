"""The dependency rule of docs/architecture.md, checked on the source."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "gpustack_dspark"


def _our_imports(path: Path) -> set:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("gpustack_dspark"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gpustack_dspark"):
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _modules(*parts):
    root = PACKAGE.joinpath(*parts)
    return [root] if root.suffix == ".py" else sorted(root.rglob("*.py"))


LEAF = {"gpustack_dspark", "gpustack_dspark.bounded"}  # `from gpustack_dspark import bounded`


def test_knobs_imports_only_the_bounded_leaf_which_imports_nothing_of_ours():
    assert _our_imports(PACKAGE / "knobs.py") <= LEAF
    assert _our_imports(PACKAGE / "bounded.py") == set()


def test_server_side_never_imports_the_devstack():
    server_side = _modules("plugin.py") + _modules("backend.py") + _modules("settings.py") \
        + _modules("placement") + _modules("observe") + _modules("k8s") + _modules("lifecycle")
    for path in server_side:
        assert not any("devstack" in name for name in _our_imports(path)), path


def test_only_the_plugin_wires_observe_and_placement():
    for path in _modules("backend.py") + _modules("settings.py") + _modules("knobs.py") + _modules("versions.py"):
        imported = _our_imports(path)
        assert not any(".observe" in n or ".placement" in n or n.endswith(".plugin") for n in imported), path


def test_the_import_walker_sees_imports():
    imported = _our_imports(PACKAGE / "plugin.py")
    assert "gpustack_dspark.observe.status" in imported and "gpustack_dspark.backend" in imported


SERVER_SIDE = (".plugin", ".placement", ".routing", ".observe", ".backend", ".settings", ".k8s", ".lifecycle")


def test_translate_imports_only_knobs():
    assert _our_imports(PACKAGE / "translate.py") <= LEAF | {
        "gpustack_dspark.knobs", *(f"gpustack_dspark.knobs.{n}" for n in ("DSparkKnobs", "KnobError"))}


def test_worker_never_imports_the_server_side_and_the_server_never_imports_the_worker():
    for path in _modules("worker"):
        imported = _our_imports(path)
        assert not any(any(f"gpustack_dspark{s}" in n for s in SERVER_SIDE) for n in imported), path
        assert not any("devstack" in n for n in imported), path
    server_side = _modules("plugin.py") + _modules("backend.py") + _modules("settings.py") \
        + _modules("placement") + _modules("observe") + _modules("k8s") + _modules("lifecycle")
    for path in server_side:
        assert not any(".worker" in n for n in _our_imports(path)), path


def test_the_node_label_sync_reports_through_the_plugin_only():
    for path in _modules("k8s"):
        imported = _our_imports(path)
        assert not any(".observe" in n or ".placement" in n or ".routing" in n for n in imported), path


CLI_BENCH_LIBRARY = {"load", "workloads", "runner", "report", "sweep"}


def _all_imports(path: Path) -> set:
    """Every absolute module an import statement names (ours or not)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def test_the_bench_package_is_the_cli_library_only():
    # The experiments and the stand-ins live in tests/bench and tests/support: not in the wheel.
    assert {p.stem for p in _modules("bench")} == {"__init__", *CLI_BENCH_LIBRARY}
    assert not list(PACKAGE.rglob("stand_in*.py"))


def test_the_bench_library_never_imports_the_devstack_and_the_devstack_only_the_library():
    for path in _modules("bench"):
        assert not any(".devstack" in n for n in _our_imports(path)), path
    for path in _modules("devstack"):
        for name in _our_imports(path):
            if name.startswith("gpustack_dspark.bench."):
                assert name.split(".")[2] in CLI_BENCH_LIBRARY, (path, name)


def test_the_package_never_imports_the_tests():
    for path in _modules():
        assert not any(n == "tests" or n.startswith("tests.") for n in _all_imports(path)), path


def test_one_reply_checker_serves_the_proxy_and_the_worker():
    assert _our_imports(PACKAGE / "reply_check.py") == set()
    assert "gpustack_dspark.reply_check" in _our_imports(PACKAGE / "routing" / "format_check.py")
    assert "gpustack_dspark.reply_check" in _our_imports(PACKAGE / "worker" / "middleware.py")
