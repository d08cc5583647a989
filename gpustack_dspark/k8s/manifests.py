"""Checks of rendered Kubernetes manifests (deploy tooling; never imported by the plugin).

`python -m gpustack_dspark.k8s.manifests RENDERED.yaml [...]` (after `helm template`) runs:

1. kubernetes-validate's strict schemas (unknown fields refused) on every object whose kind
   Kubernetes defines, for one Kubernetes version; custom resources against the
   `openAPIV3Schema` of a CustomResourceDefinition in the same set when there is one
   (`helm template --include-crds`); the kinds left unchecked are returned by name.
2. What the schemas cannot see and the API server would refuse: label keys and values in
   `metadata.labels`, `nodeSelector`, `matchLabels` (gpustack_dspark/labels.py syntax).
3. The plugin's settings in the GPUStack server's ConfigMap (`server-config`), parsed by the
   plugin's own settings code: a bad `GPUSTACK_DSPARK_*` value is refused here, with the
   message `gpustack start` would print, instead of crash-looping the server pod.

Messages are one line each: object, field, value, what is allowed. Validation reuses
kubernetes-validate's schema files with one compiled validator per kind (its own
`validate()` rebuilds the schema registry for every object, ~10× slower here).
"""

import functools
import re
import sys
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Optional, Tuple

from gpustack_dspark import bounded
from gpustack_dspark.labels import is_label_value, parse_label_key
from gpustack_dspark.settings import FLAGS, FLAG_DISABLE, resolve_settings

KUBERNETES_VERSION = "1.32"
# Files handed to the command line (GPUStack's chart renders ~2 MiB with its CRDs, whose
# schemas nest deep).
MANIFEST_FILES = bounded.Limits(max_bytes=64 * bounded.MiB, max_depth=128, max_nodes=5_000_000)
SERVER_CONFIGMAP = "server-config"  # GPUStack's chart: the server's environment (server_config)


def load_objects(text: str) -> List[dict]:
    """`helm template` output we made ourselves (the tests); files from users: `read_objects`."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def read_objects(path: str) -> List[dict]:
    """A file handed to us, read bounded (size, depth, aliases); BoundedError in one line."""
    import yaml

    text = bounded.read_text(path, MANIFEST_FILES)
    try:
        docs = bounded.load_yaml_all(text, MANIFEST_FILES)
    except yaml.YAMLError as e:
        raise bounded.yaml_problem(e) from None
    objects = [doc for doc in docs if doc]
    for doc in objects:
        if not isinstance(doc, dict):
            raise bounded.BoundedError(f"a document is a {type(doc).__name__}, not a Kubernetes object")
    return objects


def name_of(obj: dict) -> str:
    metadata = obj.get("metadata") or {}
    namespace = f"{metadata['namespace']}/" if metadata.get("namespace") else ""
    return f"{obj.get('kind')} {namespace}{metadata.get('name')}"


@functools.lru_cache(maxsize=None)
def _schema_dir(version: str) -> str:
    from kubernetes_validate import utils

    chosen = [v for v in utils.all_versions() if utils.major_minor(v) <= version]
    if not chosen:
        raise ValueError(f"kubernetes-validate has no schemas for Kubernetes {version}")
    return f"v{chosen[-1]}-local-strict"


@functools.lru_cache(maxsize=None)
def _definitions(version: str):
    from kubernetes_validate import utils
    from referencing import Resource

    return Resource.from_contents(
        utils.schema_contents(f"kubernetes-json-schema/{_schema_dir(version)}/_definitions.json", version))


@functools.lru_cache(maxsize=None)
def _builtin_validator(kind: str, api_version: str, version: str):
    """As kubernetes_validate.validate(strict=True) builds it; None for kinds it has no schema of."""
    import jsonschema
    from kubernetes_validate import utils
    from referencing import Registry, Resource

    group_version = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
    try:
        schema = utils.schema_contents(
            f"kubernetes-json-schema/{_schema_dir(version)}/{kind.lower()}-{group_version}.json", version)
    except FileNotFoundError:
        return None
    registry = _definitions(version) @ (Resource.from_contents(schema) @ Registry())
    return jsonschema.validators.Draft202012Validator(schema, registry=registry)


def _crd_validators(objects: Iterable[dict]) -> Dict[Tuple[str, str], object]:
    import jsonschema

    out = {}
    for obj in objects:
        if obj.get("kind") != "CustomResourceDefinition":
            continue
        spec = obj.get("spec") or {}
        for served in spec.get("versions") or []:
            schema = ((served.get("schema") or {}).get("openAPIV3Schema"))
            if schema:
                key = (spec["names"]["kind"], f"{spec['group']}/{served['name']}")
                out[key] = jsonschema.validators.Draft202012Validator(schema)
    return out


def _path(error) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "(top)"


@dataclass
class Report:
    errors: List[str] = field(default_factory=list)
    schema_checked: int = 0
    crd_checked: int = 0
    unchecked: Dict[str, int] = field(default_factory=dict)  # kinds with no schema here


def validate_schemas(objects: List[dict], version: str = KUBERNETES_VERSION, report: Optional[Report] = None) -> Report:
    report = report or Report()
    crds = _crd_validators(objects)
    for obj in objects:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if not kind or not api_version:
            report.errors.append(f"{name_of(obj)}: an object needs apiVersion and kind")
            continue
        validator = _builtin_validator(kind, api_version, version)
        if validator is not None:
            report.schema_checked += 1
        elif (kind, api_version) in crds:
            validator = crds[(kind, api_version)]
            report.crd_checked += 1
        else:
            report.unchecked[kind] = report.unchecked.get(kind, 0) + 1
            continue
        for error in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path))[:3]:
            report.errors.append(f"{name_of(obj)}: {_path(error)}: {error.message} (Kubernetes {version} schema, strict)")
    return report


def _label_errors(where: str, labels) -> List[str]:
    errors = []
    if not isinstance(labels, dict):
        return [f"{where}: {labels!r} is not a map of labels"]
    for key, value in labels.items():
        try:
            parse_label_key(str(key))
        except ValueError as e:
            errors.append(f"{where}: {e}")
        if not is_label_value(value):
            errors.append(f"{where}: label value {value!r} of {key!r} is not a valid label value "
                          "(a string; letters, digits, '-', '_', '.', at most 63 characters)")
    return errors


def _pod_spec(obj: dict) -> Optional[dict]:
    spec = obj.get("spec") or {}
    if obj.get("kind") == "Pod":
        return spec
    if obj.get("kind") == "CronJob":
        spec = ((spec.get("jobTemplate") or {}).get("spec")) or {}
    return ((spec.get("template") or {}).get("spec")) if isinstance(spec.get("template"), dict) else None


def check_labels(objects: List[dict]) -> List[str]:
    errors = []
    for obj in objects:
        name = name_of(obj)
        errors += _label_errors(f"{name} metadata.labels", (obj.get("metadata") or {}).get("labels") or {})
        spec = obj.get("spec") if isinstance(obj.get("spec"), dict) else {}
        selector = spec.get("selector")
        if isinstance(selector, dict) and isinstance(selector.get("matchLabels"), dict):
            errors += _label_errors(f"{name} spec.selector.matchLabels", selector["matchLabels"])
        template = spec.get("template") if isinstance(spec.get("template"), dict) else {}
        errors += _label_errors(f"{name} spec.template.metadata.labels",
                                (template.get("metadata") or {}).get("labels") or {})
        pod = _pod_spec(obj)
        if pod and pod.get("nodeSelector"):
            where = "spec.template.spec.nodeSelector" if obj.get("kind") != "Pod" else "spec.nodeSelector"
            errors += _label_errors(f"{name} {where}", pod["nodeSelector"])
    return errors


def plugin_environment(objects: List[dict]) -> Optional[Dict[str, str]]:
    for obj in objects:
        if obj.get("kind") == "ConfigMap" and (obj.get("metadata") or {}).get("name") == SERVER_CONFIGMAP:
            data = obj.get("data") or {}
            return {k: v for k, v in data.items() if k.startswith("GPUSTACK_DSPARK_")}
    return None


def check_plugin_settings(objects: List[dict]):
    """(settings or None, errors): the plugin's settings as the server pod would resolve them."""
    environment = plugin_environment(objects)
    if environment is None:
        return None, []
    known = {flag.env for flag in FLAGS}
    errors = [f"ConfigMap {SERVER_CONFIGMAP} data.{key}: not a gpustack-dspark setting "
              f"(known: {', '.join(sorted(known))})" for key in sorted(environment) if key not in known]
    try:
        settings = resolve_settings({}, {}, environment={k: v for k, v in environment.items() if k in known})
    except ValueError as e:
        return None, errors + [f"ConfigMap {SERVER_CONFIGMAP} data: {e}"]
    if FLAG_DISABLE.env in environment and settings.disabled:
        errors.append(f"ConfigMap {SERVER_CONFIGMAP} data.{FLAG_DISABLE.env}: turns every plugin feature off")
    return settings, errors


def check(objects: List[dict], version: str = KUBERNETES_VERSION) -> Report:
    report = validate_schemas(objects, version)
    report.errors += check_labels(objects)
    report.errors += check_plugin_settings(objects)[1]
    return report


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m gpustack_dspark.k8s.manifests",
                                     description="check manifests rendered by `helm template`")
    parser.add_argument("files", nargs="+")
    parser.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    args = parser.parse_args(argv)
    objects = []
    for path in args.files:
        try:
            objects += read_objects(path)
        except bounded.BoundedError as e:
            print(f"{path}: {e}", file=sys.stderr)
            return 2
    report = check(objects, args.kubernetes_version)
    for error in report.errors:
        print(error, file=sys.stderr)
    unchecked = ", ".join(f"{k} ×{n}" for k, n in sorted(report.unchecked.items())) or "none"
    print(f"{len(objects)} objects: {report.schema_checked} against Kubernetes {args.kubernetes_version}'s "
          f"strict schemas, {report.crd_checked} against their CRDs, no schema here: {unchecked}; "
          f"{len(report.errors)} error(s)")
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
