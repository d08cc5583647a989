"""Is a JSON reply valid JSON, and does it follow the requested schema? (pure)

Checked on what the proxy sends to the client, after the last byte went out, so the
check never delays a reply. Non-streamed: the whole body (bounded). Streamed: the content
deltas of each choice are accumulated from the SSE events (bounded per choice) and checked
when the stream ends. A choice cut by `max_tokens` (finish_reason "length") is not a
format error — the client asked for fewer tokens than the object needed — and counts as
`truncated`. Whether a choice's text is JSON and follows the schema is judged by
`reply_check.py`, the replica's own check too (numbers exact: `multipleOf` on decimals; its
validators cached, bounded).
"""

import json
from typing import Any, Dict, Optional, Union

from gpustack_dspark import reply_check

OK = "ok"
NOT_JSON = reply_check.NOT_JSON
SCHEMA_MISMATCH = reply_check.SCHEMA_MISMATCH
TRUNCATED = "truncated"
UNCHECKED = "unchecked"  # over the size bound, an error reply, or not a completion
RESULTS = (OK, NOT_JSON, SCHEMA_MISMATCH, TRUNCATED, UNCHECKED)
ERRORS = (NOT_JSON, SCHEMA_MISMATCH)

MAX_BODY_BYTES = 1 << 20  # non-streamed replies bigger than this are not checked
MAX_CHOICE_CHARS = 256 * 1024  # per streamed choice
MAX_CHOICES = 16
_SEVERITY = {OK: 0, UNCHECKED: 1, TRUNCATED: 2, SCHEMA_MISMATCH: 3, NOT_JSON: 4}

def check_content(content: Optional[str], finish_reason: Optional[str], schema: Any = None) -> str:
    """The result for one choice's text (the judgement is `reply_check`'s, the worker's too)."""
    if finish_reason == "length":
        return TRUNCATED
    if content is None:
        return UNCHECKED
    problem = reply_check.check(content, schema)
    return OK if problem is None else problem.kind


def worst(results) -> str:
    results = list(results)
    return max(results, key=_SEVERITY.__getitem__) if results else UNCHECKED


def _choice_text(choice: Dict[str, Any]) -> Optional[str]:
    message = choice.get("message")
    if isinstance(message, dict):
        return message.get("content")
    text = choice.get("text")
    return text if isinstance(text, str) else None


def check_body(body: bytes, schema: Any = None) -> str:
    """A non-streamed chat/completions reply: the worst result over its choices."""
    if len(body) > MAX_BODY_BYTES:
        return UNCHECKED
    try:
        payload = json.loads(body)
    except ValueError:
        return NOT_JSON  # a 200 from a JSON endpoint that is not JSON at all
    choices = payload.get("choices") if isinstance(payload, dict) else None
    if not isinstance(choices, list) or not choices:
        return UNCHECKED
    return worst(check_content(_choice_text(c), c.get("finish_reason"), schema)
                 for c in choices[:MAX_CHOICES] if isinstance(c, dict))


class StreamCheck:
    """Accumulates the content of an OpenAI SSE stream, per choice, and checks it at the end."""

    def __init__(self, schema: Any = None) -> None:
        self.schema = schema
        self.texts: Dict[int, list] = {}
        self.sizes: Dict[int, int] = {}
        self.finish: Dict[int, Optional[str]] = {}
        self.overflow = False
        self.errored = False
        self._partial = ""

    def feed(self, chunk: Union[str, bytes]) -> None:
        text = chunk.decode("utf-8", "replace") if isinstance(chunk, (bytes, bytearray)) else str(chunk)
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()  # an event split across chunks waits for its end
        if len(self._partial) > MAX_CHOICE_CHARS:
            self.overflow, self._partial = True, ""
        for line in lines:
            self._line(line.strip())

    def _line(self, line: str) -> None:
        if not line.startswith("data:"):
            return
        data = line[5:].strip()
        if not data or data == "[DONE]":
            return
        try:
            event = json.loads(data)
        except ValueError:
            return
        if not isinstance(event, dict):
            return
        if "error" in event:
            self.errored = True
            return
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            if not isinstance(index, int) or (index not in self.texts and len(self.texts) >= MAX_CHOICES):
                continue
            delta = choice.get("delta")
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str) and piece:
                size = self.sizes.get(index, 0) + len(piece)
                if size > MAX_CHOICE_CHARS:
                    self.overflow = True
                else:
                    self.texts.setdefault(index, []).append(piece)
                    self.sizes[index] = size
            else:
                self.texts.setdefault(index, [])
            if choice.get("finish_reason"):
                self.finish[index] = choice["finish_reason"]

    def result(self) -> str:
        if self._partial.strip():
            self._line(self._partial.strip())
            self._partial = ""
        if self.overflow or self.errored or not self.texts:
            return UNCHECKED
        return worst(check_content("".join(parts), self.finish.get(index), self.schema)
                     for index, parts in self.texts.items())
