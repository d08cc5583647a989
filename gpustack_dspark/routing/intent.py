"""Does an OpenAI-style request body ask for JSON output? (pure)"""

from typing import Any, Mapping, Optional

JSON_RESPONSE_FORMATS = {"json_object", "json_schema"}
# vLLM's structured_outputs keys that constrain output to JSON; regex/choice/grammar do not.
JSON_STRUCTURED_OUTPUT_KEYS = {"json", "json_object"}


def has_json_intent(body: Optional[Mapping[str, Any]]) -> bool:
    """True when the request asks for JSON: `response_format` json_object/json_schema,
    vLLM's `structured_outputs` {"json": ...} / {"json_object": true}, or legacy
    `guided_json` (also inside `extra_body`, where some clients leave it)."""
    if not isinstance(body, Mapping):
        return False
    for source in (body, body.get("extra_body")):
        if isinstance(source, Mapping) and _asks_json(source):
            return True
    return False


def _asks_json(body: Mapping[str, Any]) -> bool:
    response_format = body.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") in JSON_RESPONSE_FORMATS:
        return True
    structured = body.get("structured_outputs")
    if isinstance(structured, Mapping) and any(
        structured.get(key) not in (None, False) for key in JSON_STRUCTURED_OUTPUT_KEYS
    ):
        return True
    return body.get("guided_json") is not None


def requested_schema(body: Optional[Mapping[str, Any]]) -> Optional[Any]:
    """The JSON schema a request asks its reply to follow, if any (json_object asks for
    none): `response_format.json_schema.schema`, `structured_outputs.json`, `guided_json`
    (a dict, or a JSON string as some clients send it)."""
    if not isinstance(body, Mapping):
        return None
    for source in (body, body.get("extra_body")):
        if not isinstance(source, Mapping):
            continue
        response_format = source.get("response_format")
        if isinstance(response_format, Mapping) and response_format.get("type") == "json_schema":
            spec = response_format.get("json_schema")
            if isinstance(spec, Mapping) and spec.get("schema") is not None:
                return _as_schema(spec.get("schema"))
        structured = source.get("structured_outputs")
        if isinstance(structured, Mapping) and structured.get("json") not in (None, False, True):
            return _as_schema(structured.get("json"))
        if source.get("guided_json") is not None:
            return _as_schema(source.get("guided_json"))
    return None


def _as_schema(value: Any) -> Optional[Any]:
    if isinstance(value, str):
        import json

        try:
            value = json.loads(value)
        except ValueError:
            return None
    return value if isinstance(value, (Mapping, bool)) else None
