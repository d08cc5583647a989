"""Hostile YAML and JSON through every parser of the project: the CLI (a fresh process each,
its peak memory and wall time measured), the policy loaders, `dspark-serve`'s config, schema
and warmup files, and the bounded core itself. Each gives its usual one-line error."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpustack_dspark import bounded
from gpustack_dspark.knobs import KnobError
from gpustack_dspark.placement.policy import load_policy as load_placement
from gpustack_dspark.policy_file import PolicyError
from gpustack_dspark.routing.policy import load_policy as load_routing
from gpustack_dspark.worker.schema_check import load_schema_knob
from gpustack_dspark.worker.serve import _config_file_argv
from gpustack_dspark.worker.warmup import load_warmup_file

ROOT = Path(__file__).resolve().parents[2]


def alias_bomb(levels: int = 8, width: int = 9) -> str:
    names = "abcdefghijklmnop"
    lines = [f"{names[0]}: &{names[0]} [" + ", ".join(["x"] * width) + "]"]
    for prev, name in zip(names, names[1:levels]):
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * width) + "]")
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias-bomb": (alias_bomb().encode(), "expands to more than"),
    "recursive-alias": (b"x: &a [*a]\n", "recursive alias *a"),
    "not-utf8": (b"name: caf\xe9\nbackend: DSpark-custom\n", "not UTF-8 text: byte 0xe9"),
    "deep-nesting": (b"a: " + b"[" * 2000 + b"]" * 2000 + b"\n", "nest"),
    "deep-mapping": (("".join(f"{' ' * i}k{i}:\n" for i in range(100)) + " " * 100 + "v: 1\n").encode(),
                     "nested deeper than"),
    "huge": (None, "larger than"),  # 100 MB, written by the fixture
    "top-level-list": (b"- name: a\n  backend: DSpark-custom\n", "not a list"),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    paths = {}
    for name, (data, _) in HOSTILE.items():
        path = base / f"{name}.yaml"
        if data is None:
            with open(path, "wb") as f:
                f.write(b"name: x\nbackend_parameters:\n")
                f.truncate(100 * 1024 * 1024)
        else:
            path.write_bytes(data)
        paths[name] = path
    return paths


# The child's own peak (VmHWM of its address space): ru_maxrss would carry over the parent's
# high-water mark across fork and exec (the whole test session's memory).
CLI = ("import sys\n"
       "from gpustack_dspark.cli.main import main\n"
       "rc = main(sys.argv[1:])\n"
       "hwm = [l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0]\n"
       "print('PEAK_KB', hwm, file=sys.stderr)\n"
       "sys.exit(rc)\n")


@pytest.mark.parametrize("name", list(HOSTILE))
def test_apply_dry_run_refuses_in_bounded_time_and_memory(files, name):
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", CLI, "apply", "--dry-run", "-f", str(files[name]),
                             "--server", "http://127.0.0.1:9"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    elapsed = time.monotonic() - started
    lines = [line for line in result.stderr.splitlines() if not line.startswith("PEAK_KB")]
    peak_mb = int(result.stderr.split("PEAK_KB")[1].split()[0]) / 1024
    print(f"{name}: exit {result.returncode}, {elapsed:.2f} s, peak {peak_mb:.0f} MB: {lines[-1]}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("gpustack-dspark apply: error:") and HOSTILE[name][1] in lines[-1], lines
    assert str(files[name]) in lines[-1]
    assert elapsed < 15 and peak_mb < 300


@pytest.mark.parametrize("name", [n for n in HOSTILE if n != "top-level-list"])
def test_every_other_parser_refuses_with_its_own_one_line_error(files, tmp_path, name):
    path = files[name]
    needle = HOSTILE[name][1]
    # Policy files: one loader, one format (file: problem).
    routing = tmp_path / "routing.yaml"
    routing.write_bytes(path.read_bytes())
    with pytest.raises(PolicyError) as e:
        load_routing(routing)
    assert str(routing) in str(e.value) and needle in str(e.value) and "\n" not in str(e.value)
    (tmp_path / "placement.yaml").write_bytes(path.read_bytes())
    with pytest.raises(PolicyError) as e:
        load_placement(str(tmp_path), ("role", "json-inference"))
    assert "placement.yaml" in str(e.value) and needle in str(e.value)
    # dspark-serve --config
    with pytest.raises(KnobError) as e:
        _config_file_argv(str(path))
    assert str(e.value).startswith("--config: ") and needle in str(e.value)


JSON_HOSTILE = {
    "deep": (b"[" * 5000 + b"]" * 5000, "nested 5000 levels deep"),
    "not-utf8": (b'{"title": "caf\xe9"}', "not UTF-8"),
    "huge": (b'{"a": "' + b"x" * (5 * 1024 * 1024) + b'"}', "larger than 4 MiB"),
    "not-json": (b"{type: object}", "not valid JSON"),
}


@pytest.mark.parametrize("name", list(JSON_HOSTILE))
def test_schema_and_warmup_files_are_bounded(tmp_path, name):
    data, needle = JSON_HOSTILE[name]
    path = tmp_path / "schema.json"
    path.write_bytes(data)
    with pytest.raises(KnobError) as e:
        load_schema_knob(str(path))
    assert str(e.value).startswith("--dspark-schema: ") and needle in str(e.value)
    warmup = tmp_path / "warmup.jsonl"
    warmup.write_bytes(data + b"\n")
    if name == "huge":
        return  # 5 MB is within the warmup file's bound; a line of it is a request, not a hostile one
    with pytest.raises(KnobError) as e:
        load_warmup_file(str(warmup))
    assert str(e.value).startswith("--dspark-warmup-file: ")


def test_the_bounded_core_counts_aliases_as_copies_and_keeps_normal_anchors():
    small = "base: &b {image: x, env: {A: '1'}}\nm1: *b\nm2: {<<: *b, image: y}\n"
    assert bounded.load_yaml(small, bounded.MODEL_FILE)["m2"]["image"] == "y"
    limits = bounded.Limits(max_bytes=10_000, max_depth=64, max_nodes=1000)
    with pytest.raises(bounded.BoundedError, match="expands to more than 1000"):
        bounded.check_yaml(alias_bomb(levels=4, width=9), limits)  # 9^4 = 6561 values
    bounded.check_yaml(alias_bomb(levels=3, width=9), limits)  # 9^3 = 729: fine
    with pytest.raises(bounded.BoundedError, match="alias .b nests deeper"):
        bounded.check_yaml("a: &b [[[[1]]]]\nc: [[[[[[*b]]]]]]\n", bounded.Limits(1000, max_depth=8))
    assert bounded.json_depth('{"a": "[[[[", "b": [[1]]}') == 3
    assert json.loads(json.dumps(bounded.loads_json('{"k": [1, {"x": "\\"["}]}', bounded.SCHEMA))) == \
        {"k": [1, {"x": '"['}]}
