"""Did an OpenAI SSE stream end properly? (pure)

vLLM ends every chat/completions stream with `data: [DONE]`; an error is sent as a
`data: {"error": ...}` event. A stream with neither was cut off upstream.
"""

import json
from typing import Union

TRUNCATED_ERROR_EVENT = "data: " + json.dumps({"error": {
    "message": "The model replica stopped before finishing this stream; retry the request.",
    "type": "ServiceUnavailable", "code": 503}}) + "\n\n"


class StreamWatch:
    def __init__(self) -> None:
        self.chunks = 0
        self.done = False
        self.errored = False

    def see(self, chunk: Union[str, bytes]) -> None:
        text = chunk.decode("utf-8", "replace") if isinstance(chunk, (bytes, bytearray)) else str(chunk)
        if not text.strip():
            return
        self.chunks += 1
        stripped = text.strip()
        if stripped.endswith("data: [DONE]") or stripped == "[DONE]":
            self.done = True
        if '"error"' in text and (stripped.startswith("data:") or stripped.startswith("{")):
            self.errored = True

    def truncated(self) -> bool:
        return self.chunks > 0 and not self.done and not self.errored
