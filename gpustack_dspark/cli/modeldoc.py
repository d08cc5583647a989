"""Model YAML -> validated documents -> GPUStack 2.3 deployment entries (pure, no network).

A document is a GPUStack deployment document entry (what `POST /v2/models/import` takes)
plus, optionally, a `dspark:` section. The DSpark knobs may instead sit in
`backend_parameters` as flags (`--enable-dspark`, `--dspark-speculative-length=6`, ...);
both go through the knob parsers of `knobs.py`, so a bad value reads the same either way.

Materializing writes the knobs into GPUStack's own fields — `backend`, `backend_version`,
`backend_parameters` (DSpark flags first, canonical `--flag=value`, then the vLLM
arguments in the user's order), `worker_selector`, `cpu_offloading` — so the entry
imports unchanged into a GPUStack without this CLI, and an exported deployment re-applies
as "unchanged". See docs/models-yaml.md.
"""

import json
from dataclasses import dataclass
from pathlib import Path as FsPath
from typing import Any, Dict, List, Optional, Tuple

from gpustack_dspark import backend_ids, bounded
from gpustack_dspark.cli import gpustack_fields as gf
from gpustack_dspark.cli.yamldoc import Document, Path, SpecError, dotted, load_documents
from gpustack_dspark.knobs import (ENABLE_FLAG, KNOB_FLAG_PREFIX, KNOBS, KNOBS_BY_FLAG, KNOBS_BY_NAME,
                                   DSparkKnobs, KnobError, build_knobs, nearest, rest_of, scan_knob_tokens)
from gpustack_dspark.knobs import knob_flags as knob_flag_names
from gpustack_dspark.labels import parse_label

DEVICES = {"cuda": backend_ids.CUDA_VERSION, "cpu": backend_ids.CPU_VERSION}

# The `dspark:` section. Grouped keys: `enabled`, `grammar` (mode + schema), `warmup.*`;
# every other knob goes by its knob name, so a knob added to knobs.py is accepted here as is.
_WARMUP = {k.name[len("warmup_"):]: k.name for k in KNOBS if k.name.startswith("warmup_")}
_GROUPED = {"enable", "grammar_mode", "schema", *_WARMUP.values()}
_SECTION: Dict[str, Optional[str]] = {
    "enabled": "enable",
    **{k.name: k.name for k in KNOBS if k.name not in _GROUPED},
    "grammar": None,
    "warmup": None,
    "device": None,
    "worker_label": None,
}
TP_FLAG = "--tensor-parallel-size"


class SpecErrors(Exception):
    """Every problem found in a file (all documents), one SpecError each."""

    def __init__(self, errors: List[SpecError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass
class ModelDocument:
    index: int
    name: str
    entry: Dict[str, Any]  # GPUStack document fields, materialized
    knobs: Optional[DSparkKnobs]  # None: not a DSpark deployment


def load_file(path: str) -> List[ModelDocument]:
    """Read and validate a model YAML file; SpecErrors lists everything wrong with it."""
    try:
        text = bounded.read_text(path, bounded.MODEL_FILE)
    except bounded.BoundedError as e:
        raise SpecErrors([SpecError(path, None, None, "", e.line, e.problem)]) from None
    return parse_text(text, path, FsPath(path).resolve().parent)


def parse_text(text: str, file: str, base_dir: FsPath) -> List[ModelDocument]:
    try:
        docs = load_documents(text, file)
    except SpecError as e:
        raise SpecErrors([e]) from None
    if not docs:
        raise SpecErrors([SpecError(file, None, None, "", None, "no documents; expected one model per '---' section")])
    out: List[ModelDocument] = []
    errors: List[SpecError] = []
    names: Dict[str, int] = {}
    for doc in docs:
        checker = _Checker(file, doc, base_dir)
        model = checker.run()
        errors.extend(checker.errors)
        if model is None:
            continue
        if model.name in names:
            errors.append(checker.error(("name",), f"{model.name!r} is already used by document {names[model.name]}; "
                                        "names are unique in GPUStack"))
            continue
        names[model.name] = doc.index
        out.append(model)
    if errors:
        raise SpecErrors(errors)
    return out


def canonical_value(value: Any) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def knob_flags(knobs: DSparkKnobs) -> List[str]:
    """The DSpark part of backend_parameters, in the knob table's order."""
    flags = [ENABLE_FLAG] if knobs.enable else []
    for knob in KNOBS:
        if knob.name != "enable" and knob.name in knobs.given:
            flags.append(f"{knob.flag}={canonical_value(getattr(knobs, knob.name))}")
    return flags


def _not_allowed(e: KnobError) -> str:
    return e.problem


class _Checker:
    """Validates and materializes one document, collecting every error."""

    def __init__(self, file: str, doc: Document, base_dir: FsPath):
        self.file, self.doc, self.base_dir = file, doc, base_dir
        self.errors: List[SpecError] = []
        data = doc.data if isinstance(doc.data, dict) else {}
        self.name = data.get("name") if isinstance(data.get("name"), str) else None

    def error(self, path: Path, message: str) -> SpecError:
        return SpecError(self.file, self.doc.index, self.name, dotted(path), self.doc.line_of(path), message)

    def fail(self, path: Path, message: str) -> None:
        self.errors.append(self.error(path, message))

    def run(self) -> Optional[ModelDocument]:
        data = self.doc.data
        if not isinstance(data, dict):
            kind = {"list": "a list", "str": "a plain value", "int": "a number", "float": "a number",
                    "bool": "a boolean"}.get(type(data).__name__, type(data).__name__)
            hint = "; several models go in separate documents split by '---', not in a list" if kind == "a list" else ""
            self.fail((), f"a model document is a mapping of fields (name: ..., backend: ...), not {kind}{hint}")
            return None
        entry: Dict[str, Any] = {}
        for key, value in data.items():
            if key == "dspark":
                continue
            if not isinstance(key, str):
                self.fail((), f"field names are text, not {key!r}")
            elif key in gf.SERVER_MANAGED:
                hint = "; name the cluster with cluster_name" if key == "cluster_id" else ""
                self.fail((key,), f"{key} is set by GPUStack and cannot be given{hint}; remove it")
            elif key not in gf.ENTRY_FIELDS:
                hint = nearest(key, list(gf.ENTRY_FIELDS) + ["dspark"])
                self.fail((key,), "unknown field" + (f"; did you mean {hint}?" if hint else
                                                     "; allowed: GPUStack's model fields and dspark"))
            elif value is not None and self._kind_ok(key, value):
                entry[key] = value
        self._required(entry)
        self._local_path(entry)
        gpu_count = self._gpu_selector(entry)
        knobs = self._dspark(data, entry, gpu_count)
        if self.errors:
            return None
        ordered = {key: entry[key] for key in gf.ENTRY_FIELDS if key in entry}  # GPUStack's export order
        return ModelDocument(self.doc.index, entry["name"], ordered, knobs)

    # --- GPUStack's own fields -------------------------------------------------------------

    def _kind_ok(self, key: str, value: Any) -> bool:
        kind = gf.ENTRY_FIELDS[key]
        ok, allowed = True, kind
        if kind == "str":
            ok, allowed = isinstance(value, str) and value.strip() != "", "non-empty text"
        elif kind == "int":
            ok, allowed = isinstance(value, int) and not isinstance(value, bool) and value >= 0, "an integer >= 0"
        elif kind == "bool":
            ok, allowed = isinstance(value, bool), "true|false"
        elif kind.startswith("enum:"):
            allowed = kind[5:]
            ok = value in allowed.split("|")
        elif kind == "mapping":
            ok, allowed = isinstance(value, dict), "a mapping"
        elif kind == "list":
            ok, allowed = isinstance(value, list), "a list"
        elif kind == "list[str]":
            ok, allowed = isinstance(value, list), "a list of text"
            for i, item in enumerate(value if ok else []):
                if not isinstance(item, str):
                    self.fail((key, i), f"{item!r} is not allowed; allowed: text (quote numbers and booleans)")
                    return False
        elif kind == "map[str]":
            ok, allowed = isinstance(value, dict), "a mapping of text to text"
            for k, v in (value.items() if ok else []):
                if not isinstance(v, str):
                    self.fail((key, k), f"{v!r} is not allowed; allowed: text (quote numbers and booleans)")
                    return False
        if not ok:
            self.fail((key,), f"{value!r} is not allowed; allowed: {allowed}")
        return ok

    def _required(self, entry: Dict[str, Any]) -> None:
        data = self.doc.data
        if "name" not in data:
            self.fail((), "name is missing; every model needs a name")
        if "source" not in data:
            self.fail((), "source is missing; allowed: " + "|".join(gf.SOURCE_FIELDS))
        source = entry.get("source")
        if source in gf.SOURCE_FIELDS and not entry.get(gf.SOURCE_FIELDS[source]):
            self.fail(("source",), f"source {source} needs {gf.SOURCE_FIELDS[source]}")

    def _local_path(self, entry: Dict[str, Any]) -> None:
        """A relative local_path is taken from the YAML file's folder, a leading `~` is the
        home folder of whoever applies it (GPUStack needs an absolute path; such paths only
        make sense where the worker shares this disk)."""
        path = entry.get("local_path")
        if isinstance(path, str) and path.startswith("~"):
            entry["local_path"] = str(FsPath(path).expanduser().resolve())
        elif isinstance(path, str) and not FsPath(path).is_absolute():
            entry["local_path"] = str((self.base_dir / path).resolve())

    def _gpu_selector(self, entry: Dict[str, Any]) -> Optional[int]:
        """gpu_selector keys; `gpu_count: N` (our shorthand) becomes --tensor-parallel-size=N."""
        selector = entry.get("gpu_selector")
        if not isinstance(selector, dict):
            return None
        count = None
        for key, value in selector.items():
            path = ("gpu_selector", key)
            if key == "gpu_count":
                if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64:
                    count = value
                else:
                    self.fail(path, f"{value!r} is not allowed; allowed: an integer 1-64")
            elif key not in gf.GPU_SELECTOR_FIELDS:
                hint = nearest(str(key), list(gf.GPU_SELECTOR_FIELDS) + ["gpu_count"])
                self.fail(path, "unknown field" + (f"; did you mean {hint}?" if hint else
                                                   "; allowed: gpu_count, gpu_ids, gpus_per_replica"))
        return count

    # --- DSpark ----------------------------------------------------------------------------

    def _dspark(self, data: Dict[str, Any], entry: Dict[str, Any], gpu_count: Optional[int]) -> Optional[DSparkKnobs]:
        section = data.get("dspark")
        params = entry.get("backend_parameters") or []
        has_flags = any(str(p).split("=", 1)[0] == ENABLE_FLAG or str(p).startswith(KNOB_FLAG_PREFIX)
                        for p in params)
        backend = entry.get("backend")
        if "dspark" in data and not isinstance(section, dict):
            self.fail(("dspark",), f"{section!r} is not allowed; allowed: a mapping of DSpark settings")
            return None
        is_dspark = section is not None or has_flags or backend == backend_ids.BACKEND_NAME
        if not is_dspark:
            if gpu_count is not None:
                self.fail(("gpu_selector", "gpu_count"), "gpu_count is a DSpark shorthand; in other models "
                          f"set {TP_FLAG} in backend_parameters or gpu_selector.gpu_ids")
            return None
        if backend not in (None, backend_ids.BACKEND_NAME):
            why = "a dspark section" if section is not None else "DSpark flags in backend_parameters"
            self.fail(("backend",), f"{backend!r} is not allowed with {why}; allowed: {backend_ids.BACKEND_NAME} "
                      "(other backends do not understand the DSpark knobs)")
            return None

        raw, paths, device, label = self._section(section or {})
        rest: List[str] = []
        if params:
            rest = self._flags(params, raw, paths)
        if self.errors:
            return None
        if section is not None and "enable" not in raw:
            raw["enable"] = True
        knobs = build_knobs(raw)  # every value was parsed above; this cannot fail now

        entry["backend"] = backend_ids.BACKEND_NAME
        self._version(entry, device)
        rest = self._tensor_parallel(rest, gpu_count, entry)
        entry["backend_parameters"] = knob_flags(knobs) + rest
        if label is not None:
            selector = dict(entry.get("worker_selector") or {})
            if selector.get(label[0], label[1]) != label[1]:
                self.fail(("dspark", "worker_label"), f"worker_selector already sets {label[0]}="
                          f"{selector[label[0]]}; keep one")
            selector[label[0]] = label[1]
            entry["worker_selector"] = selector
        entry.setdefault("enable_model_route", True)
        return knobs

    def _section(self, section: Dict[str, Any]) -> Tuple[Dict[str, Any], Dict[str, Path], Optional[str], Optional[Tuple[str, str]]]:
        raw: Dict[str, Any] = {}
        paths: Dict[str, Path] = {}
        device = label = None

        def knob(name: str, value: Any, path: Path) -> None:
            try:
                KNOBS_BY_NAME[name].parse(dotted(path), value)
            except KnobError as e:
                self.fail(path, _not_allowed(e))
                return
            raw[name], paths[name] = value, path

        for key, value in section.items():
            path = ("dspark", key)
            if key not in _SECTION:
                hint = nearest(str(key), list(_SECTION))
                self.fail(path, "unknown DSpark setting" + (f"; did you mean {hint}?" if hint else
                                                             f"; allowed: {', '.join(_SECTION)}"))
            elif key == "enabled":
                if isinstance(value, bool):
                    raw["enable"], paths["enable"] = value, path
                else:
                    self.fail(path, f"{value!r} is not allowed; allowed: true|false")
            elif _SECTION[key] is not None:
                knob(_SECTION[key], value, path)
            elif key == "grammar":
                self._grammar(value, path, knob)
            elif key == "warmup":
                if not isinstance(value, dict):
                    self.fail(path, f"{value!r} is not allowed; allowed: a mapping with {', '.join(_WARMUP)}")
                    continue
                for sub, sub_value in value.items():
                    if sub not in _WARMUP:
                        hint = nearest(str(sub), list(_WARMUP))
                        self.fail(path + (sub,), "unknown warmup setting" + (
                            f"; did you mean {hint}?" if hint else f"; allowed: {', '.join(_WARMUP)}"))
                    else:
                        knob(_WARMUP[sub], sub_value, path + (sub,))
            elif key == "device":
                if value in DEVICES:
                    device = value
                else:
                    self.fail(path, f"{value!r} is not allowed; allowed: {'|'.join(DEVICES)}")
            elif key == "worker_label":
                try:
                    label = parse_label(str(value))
                except ValueError as e:
                    self.fail(path, str(e))
        return raw, paths, device, label

    def _grammar(self, value: Any, path: Path, knob) -> None:
        if value is False:  # YAML 1.1 reads a bare `off` as false
            value = "off"
        if not isinstance(value, dict):
            knob("grammar_mode", value, path)
            return
        for key in value:
            if key != "schema":
                hint = nearest(str(key), ["schema"])
                self.fail(path + (key,), "unknown grammar setting" + (f"; did you mean {hint}?" if hint else
                                                                      "; allowed: schema"))
        if "schema" not in value:
            if not [k for k in value if k != "schema"]:
                self.fail(path, "a grammar mapping needs schema: a file path or an inline JSON Schema")
            return
        schema = value["schema"]
        spath = path + ("schema",)
        if isinstance(schema, str) and not schema.strip().startswith(("{", "[")):
            # A path is read here, relative to the YAML file, and inlined: the worker that
            # runs the model does not have the user's files.
            file = (self.base_dir / schema).resolve()
            try:
                schema = bounded.read_json(file, bounded.SCHEMA)
            except bounded.BoundedError as e:
                unreadable = e.problem.startswith("cannot read the file: ")
                self.fail(spath, f"cannot read the schema file {str(file)!r}: {e.problem[22:]}" if unreadable
                          else f"the schema file {str(file)!r}: {e}")
                return
            if not isinstance(schema, dict):
                self.fail(spath, f"{str(file)!r} holds a {type(schema).__name__}; a JSON Schema is an object")
                return
        if isinstance(schema, dict):
            schema = json.dumps(schema, separators=(",", ":"))
        knob("grammar_mode", "json", path)
        knob("schema", schema, spath)

    def _flags(self, params: List[str], raw: Dict[str, Any], paths: Dict[str, Path]) -> List[str]:
        """Split backend_parameters into DSpark knobs (validated, into raw) and the rest."""
        tokens = scan_knob_tokens(params)
        for token in tokens:
            path = ("backend_parameters", token.index)
            knob = KNOBS_BY_FLAG.get(token.flag)
            if knob is None:
                hint = nearest(token.flag, knob_flag_names())
                self.fail(path, f"{token.flag} is not a DSpark flag; " + (
                    f"did you mean {hint}?" if hint else f"allowed: {', '.join(knob_flag_names())}"))
            elif token.raw is None:
                self.fail(path, f"{token.flag} needs a value; allowed: {knob.allowed}")
            elif knob.name in paths and paths[knob.name][0] == "dspark":
                self.fail(path, f"{token.flag} is also set by {dotted(paths[knob.name])}; keep one")
            elif token.error is not None:
                self.fail(path, f"{token.flag}: {_not_allowed(token.error)}")
            else:
                raw[knob.name], paths[knob.name] = token.raw, path
        return rest_of(params, tokens)

    def _version(self, entry: Dict[str, Any], device: Optional[str]) -> None:
        version = entry.get("backend_version")
        if device is not None:
            if version is not None and version in DEVICES.values() and version != DEVICES[device]:
                self.fail(("backend_version",), f"{version!r} is not allowed with dspark.device {device}; "
                          f"allowed: {DEVICES[device]} (or leave backend_version out)")
                return
            version = version or DEVICES[device]
        version = version or backend_ids.CUDA_VERSION
        entry["backend_version"] = version
        if version == backend_ids.CPU_VERSION:
            # GPUStack fits a custom CPU backend only with CPU offloading on.
            if entry.get("cpu_offloading") is False:
                self.fail(("cpu_offloading",), f"false is not allowed with {version}; allowed: true "
                          "(GPUStack places CPU models only with CPU offloading)")
            entry["cpu_offloading"] = True

    def _tensor_parallel(self, rest: List[str], gpu_count: Optional[int], entry: Dict[str, Any]) -> List[str]:
        if gpu_count is None:
            return rest
        selector = {k: v for k, v in entry["gpu_selector"].items() if k != "gpu_count"}
        if selector:
            entry["gpu_selector"] = selector
        else:
            entry.pop("gpu_selector")
        for i, token in enumerate(rest):
            flag, eq, value = token.partition("=")
            if flag == TP_FLAG:
                if not eq and i + 1 < len(rest):
                    value = rest[i + 1]
                if value.strip() != str(gpu_count):
                    self.fail(("gpu_selector", "gpu_count"), f"{gpu_count} disagrees with {TP_FLAG} {value} in "
                              "backend_parameters; keep one")
                return rest
        return [f"{TP_FLAG}={gpu_count}"] + rest  # where the flags form usually has it
