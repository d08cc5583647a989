"""JSON by default on JSON replicas: the request-body rewrite, as a pure function.

vLLM has no server-wide structured-output default, so the worker adds one per request.
Requests that bring their own format are left alone; the legacy `guided_*` fields (which
vLLM 0.32 ignores, answering 200 with unconstrained text) are converted to
`structured_outputs`, and anything that would otherwise be served unconstrained is refused.
"""

from dataclasses import dataclass
from typing import Any, Dict, Optional

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
JSON_PATHS = (CHAT_PATH, COMPLETIONS_PATH)

# Legacy guided decoding fields -> the structured_outputs key vLLM understands.
LEGACY_FIELDS = {
    "guided_json": "json",
    "guided_regex": "regex",
    "guided_choice": "choice",
    "guided_grammar": "grammar",
}
LEGACY_OPTIONS = {"guided_whitespace_pattern": "whitespace_pattern"}
LEGACY_DROPPED = ("guided_decoding_backend",)  # the backend is the server's choice
DEFAULT_SCHEMA_NAME = "dspark_default"


class RequestRejected(ValueError):
    """Becomes a 400 with this message."""


@dataclass(frozen=True)
class Rewrite:
    body: Dict[str, Any]
    action: str  # kept | injected | converted
    schema: Optional[Any] = None  # the JSON schema this request will be constrained by, if any


def requested_schema(body: Dict[str, Any]) -> Optional[Any]:
    """The JSON Schema a request asks for (response_format json_schema / structured_outputs.json)."""
    fmt = body.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        inner = fmt.get("json_schema") or {}
        return inner.get("schema") if isinstance(inner, dict) else None
    so = body.get("structured_outputs")
    if isinstance(so, dict) and so.get("json") is not None:
        return so["json"]
    return None


def with_schema(body: Dict[str, Any], schema: Any) -> Dict[str, Any]:
    """The body with the schema `requested_schema` found replaced by `schema` (a copy)."""
    out = dict(body)
    fmt = out.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        out["response_format"] = {**fmt, "json_schema": {**fmt["json_schema"], "schema": schema}}
    elif isinstance(out.get("structured_outputs"), dict) and out["structured_outputs"].get("json") is not None:
        out["structured_outputs"] = {**out["structured_outputs"], "json": schema}
    return out


def wants_json_object(body: Dict[str, Any]) -> bool:
    fmt, so = body.get("response_format"), body.get("structured_outputs")
    return (isinstance(fmt, dict) and fmt.get("type") == "json_object") or (
        isinstance(so, dict) and bool(so.get("json_object")))


def rewrite(path: str, body: Dict[str, Any], default_schema: Optional[Dict[str, Any]]) -> Rewrite:
    """Apply the JSON default to one request body (a dict from the request's JSON)."""
    legacy = [k for k in body if k in LEGACY_FIELDS or k in LEGACY_OPTIONS or k in LEGACY_DROPPED]
    if legacy:
        converted = _convert_legacy(body, legacy)
        if converted is not None:
            return converted
        body = {k: v for k, v in body.items() if k not in legacy}
    if _brings_own_format(body):
        return Rewrite(body, "kept", requested_schema(body))
    out = dict(body)
    if path == CHAT_PATH:
        if default_schema is not None:
            out["response_format"] = {"type": "json_schema", "json_schema": {
                "name": DEFAULT_SCHEMA_NAME, "schema": default_schema, "strict": True}}
        else:
            out["response_format"] = {"type": "json_object"}
    else:
        out["structured_outputs"] = ({"json": default_schema} if default_schema is not None
                                     else {"json_object": True})
    return Rewrite(out, "injected", default_schema)


def _brings_own_format(body: Dict[str, Any]) -> bool:
    # A tool-calling request asked for tool calls, not for a JSON reply.
    return any(body.get(k) is not None for k in ("response_format", "structured_outputs", "tools"))


def _convert_legacy(body: Dict[str, Any], legacy: list) -> Optional[Rewrite]:
    if body.get("response_format") is not None or body.get("structured_outputs") is not None:
        raise RequestRejected(
            f"{', '.join(sorted(legacy))} cannot be combined with response_format/structured_outputs; "
            "use structured_outputs only")
    constraints = [k for k in legacy if k in LEGACY_FIELDS and body.get(k) is not None]
    if len(constraints) > 1:
        raise RequestRejected(f"only one of {', '.join(sorted(constraints))} may be given")
    out = {k: v for k, v in body.items() if k not in legacy}
    so: Dict[str, Any] = {}
    for key in constraints:
        so[LEGACY_FIELDS[key]] = body[key]
    for key, target in LEGACY_OPTIONS.items():
        if body.get(key) is not None:
            if not constraints:
                raise RequestRejected(f"{key} needs one of {', '.join(LEGACY_FIELDS)}")
            so[target] = body[key]
    if not so:  # only guided_decoding_backend: nothing to convert; the default applies
        return None
    out["structured_outputs"] = so
    return Rewrite(out, "converted", so.get("json"))
