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


CLI_BENCH_LIBRARY = {"load", "workloads", "runner", "report", "sweep", "extraction"}


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


# --- the two seams (issue 28): one door per upstream ------------------------------------

GPUSTACK_SEAM = PACKAGE / "gpustack_seam"


def _imports_upstream(path: Path, top: str) -> set:
    """Every import of `top` or `top.*` in the file, wherever it sits (module level or inside
    a function), including importlib.import_module("top...") with a literal name."""
    found = {n for n in _all_imports(path) if n == top or n.startswith(top + ".")}
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module" \
                and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str) \
                and (node.args[0].value == top or node.args[0].value.startswith(top + ".")):
            found.add(node.args[0].value)
    return found


def test_only_the_gpustack_seam_imports_gpustack():
    offenders = {str(p.relative_to(PACKAGE)): sorted(_imports_upstream(p, "gpustack"))
                 for p in _modules() if GPUSTACK_SEAM not in p.parents and _imports_upstream(p, "gpustack")}
    assert offenders == {}
    assert _imports_upstream(GPUSTACK_SEAM / "shapes.py", "gpustack") == set()  # a table: resolved lazily


def test_the_gpustack_seam_imports_no_feature():
    for path in _modules("gpustack_seam"):
        assert _our_imports(path) <= {"gpustack_dspark", "gpustack_dspark.versions", "gpustack_dspark.feature",
                                      "gpustack_dspark.feature.FeatureOff",
                                      *(n for n in _our_imports(path) if n.startswith("gpustack_dspark.gpustack_seam"))}, path


VLLM_SEAM = PACKAGE / "worker" / "vllm_seam"


def test_only_the_vllm_seam_imports_vllm():
    offenders = {str(p.relative_to(PACKAGE)): sorted(_imports_upstream(p, "vllm"))
                 for p in _modules() if VLLM_SEAM not in p.parents and _imports_upstream(p, "vllm")}
    assert offenders == {}
    for name in ("names.py", "sources.py"):  # a table and a source reader: never vLLM itself
        assert _imports_upstream(VLLM_SEAM / name, "vllm") == set()


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _import_graph() -> dict:
    """module -> the modules of ours it imports, anywhere in the file (a function-level
    import closes a circle as surely as a module-level one)."""
    modules = {_module_name(p): p for p in _modules()}
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                if node.level:
                    base = package
                    for _ in range(node.level - 1):
                        base = base.rpartition(".")[0]
                    module = f"{base}.{module}" if module else base
                edges.update(f"{module}.{a.name}" if f"{module}.{a.name}" in modules else module for a in node.names)
        graph[name] = {e for e in edges if e in modules and e != name}
    return graph


def test_the_import_walker_sees_function_level_imports():
    graph = _import_graph()
    assert "gpustack_dspark.worker.launch" in graph["gpustack_dspark.worker.serve"]  # inside main()


def test_no_import_cycles():
    graph, index, low, stack, on_stack, cycles = _import_graph(), {}, {}, [], set(), []

    def visit(v):  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    assert cycles == []


def _areas(module: str) -> str:
    return ".".join(module.split(".")[:2])


# The client-side layers, top to bottom: the CLI uses the bench library and the console's pure
# planners; the bench library uses the console's knob editor; the console never reaches up.
DOWNWARD = {
    "gpustack_dspark.cli": {"gpustack_dspark.bench", "gpustack_dspark.console.rollout", "gpustack_dspark.console.editor",
                            "gpustack_dspark.devstack"},  # devstack: cli/sweep.py's scratch replicas only
    "gpustack_dspark.bench": {"gpustack_dspark.console.editor"},
    "gpustack_dspark.console": set(),
}
LAYERED = set(DOWNWARD) | {"gpustack_dspark.plugin", "gpustack_dspark.devstack"}


def test_the_cli_console_and_bench_layers_import_downward_only():
    for module, edges in _import_graph().items():
        area = _areas(module)
        if area not in DOWNWARD:
            continue
        for edge in edges:
            if _areas(edge) == area or _areas(edge) not in LAYERED:
                continue  # itself, or the leaves and seams below every layer
            assert edge in DOWNWARD[area] or _areas(edge) in DOWNWARD[area], (module, edge)
    for module in ("gpustack_dspark.console.rolling",):
        assert not any(_areas(e) == "gpustack_dspark.cli" for e in _import_graph()[module])
