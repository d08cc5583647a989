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
