"""Did an OpenAI SSE stream end properly? (pure)

vLLM ends every chat/completions stream with `data: [DONE]`; an error is sent as a
`data: {"error": ...}` event. A stream with neither was cut off upstream.
"""

import json
import re
from typing import Optional, Union

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')


def completion_tokens(body: Optional[bytes]) -> Optional[int]:
    """`usage.completion_tokens` of an OpenAI answer (the last one in `body`), without
    parsing the whole body: the proxy reads it for every answer."""
    if not body:
        return None
    at = body.rfind(b'"completion_tokens"')
    if at < 0:
        return None
    match = _COMPLETION_TOKENS.match(body, at)
    return int(match.group(1)) if match else None

TRUNCATED_ERROR_EVENT = "data: " + json.dumps({"error": {
    "message": "The model replica stopped before finishing this stream; retry the request.",
    "type": "ServiceUnavailable", "code": 503}}) + "\n\n"


class StreamWatch:
    def __init__(self) -> None:
        self.chunks = 0
        self.events = 0  # `data:` events other than [DONE]: output tokens when no usage comes
        self.usage_tokens: Optional[int] = None
        self.done = False
        self.errored = False

    def see(self, chunk: Union[str, bytes]) -> None:
        text = chunk.decode("utf-8", "replace") if isinstance(chunk, (bytes, bytearray)) else str(chunk)
        if not text.strip():
            return
        self.chunks += 1
        stripped = text.strip()
        self.events += text.count("data:") - text.count("data: [DONE]")
        if '"completion_tokens"' in text:
            self.usage_tokens = completion_tokens(text.encode()) or self.usage_tokens
        if stripped.endswith("data: [DONE]") or stripped == "[DONE]":
            self.done = True
        if '"error"' in text and (stripped.startswith("data:") or stripped.startswith("{")):
            self.errored = True

    def output_tokens(self) -> int:
        return self.usage_tokens if self.usage_tokens else max(1, self.events)

    def truncated(self) -> bool:
        return self.chunks > 0 and not self.done and not self.errored
