"""Checked streams: a streamed reply is judged whole before its last piece goes out. Pure.

Why: a non-streamed reply is checked against the request's schema before it is sent
(middleware.py); a stream used to be sent as vLLM produced it, so it was only as good as the
grammar engine — and no engine enforces every keyword (llguidance's lenient mode skips
`uniqueItems`, xgrammar 0.2.8 ignores `not` without saying so). Here every event of an
OpenAI-style SSE stream passes through at once except, per choice, the one that carries its
latest content and what follows it (finish, usage, `[DONE]`). When vLLM ends
the stream, every choice that finished with "stop" is checked (`reply_check`, the same
judgement as for non-streamed replies); then either the held events go out, or one error event
(`SchemaViolationError`, the non-streamed 500's body) and `[DONE]` go out instead, so the client
never holds a complete document that breaks the schema. A reply cut by `max_tokens` is not
judged (as for non-streamed replies). Tool calls are judged the same way when the request's
tools are constrained (`tool_check`: the call names one of them, its arguments validate against
its `parameters`; a call whose arguments are whole is judged even when max_tokens ended the
reply after it); their deltas are content too, so the last one waits for the check. Cost:
the last content event of each choice arrives when the stream ends instead of one token
earlier.

Events keep their order, so with `n > 1` one choice's events may wait for another's next token.
"""

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple

DONE = b"data: [DONE]"


def error_event(problem: str) -> bytes:
    payload = {"error": {"message": f"the reply does not validate against the requested schema ({problem}); "
                                    "its last part was not delivered",
                         "type": "SchemaViolationError", "param": None, "code": 500}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n" + DONE + b"\n\n"


@dataclass
class StreamCheck:
    """Feed the stream's body bytes in order (`feed`), then `finish` once vLLM is done.

    `check(content)` returns None when a finished choice's text is right, else why not. Events
    keep their order: the queue goes out up to the first event that is its choice's latest
    content (so with n > 1, one choice may briefly wait on another's next token)."""
    check: Optional[Callable[[str], Optional[str]]]
    # (tool name, its arguments' text) -> None when right, else why not; None: calls not judged
    tool_check: Optional[Callable[[str, str], Optional[str]]] = None
    _buffer: bytes = b""
    _queue: List[Tuple[int, bytes]] = field(default_factory=list)  # (event number, event)
    _latest: Dict[int, int] = field(default_factory=dict)          # choice index -> event number
    _count: int = 0
    _content: Dict[int, List[str]] = field(default_factory=dict)
    _finish: Dict[int, str] = field(default_factory=dict)
    _calls: Dict[int, Dict[int, List[str]]] = field(default_factory=dict)  # choice -> call -> [name, args...]
    problem: Optional[str] = None

    def feed(self, data: bytes) -> bytes:
        """What can go out now (whole events only)."""
        self._buffer += data
        while True:
            end = self._buffer.find(b"\n\n")
            if end < 0:
                break
            event, self._buffer = self._buffer[: end + 2], self._buffer[end + 2:]
            self._event(event)
        out = []
        held = set(self._latest.values())
        while self._queue and self._queue[0][0] not in held:
            out.append(self._queue.pop(0)[1])
        return b"".join(out)

    def finish(self) -> bytes:
        """The rest of the stream: the held events, or an error event in their place."""
        if self._buffer.strip():
            self._event(self._buffer if self._buffer.endswith(b"\n\n") else self._buffer + b"\n\n")
        self._buffer = b""
        problem = self._judge()
        if problem is not None:
            self.problem = problem
            self._queue.clear()
            return error_event(problem)
        out = b"".join(event for _, event in self._queue)
        self._queue.clear()
        return out

    def _judge(self) -> Optional[str]:
        for index in sorted(set(self._content) | set(self._calls)):
            finish = self._finish.get(index)
            if self.check is not None and finish == "stop" and index in self._content:
                problem = self.check("".join(self._content[index]))
                if problem is not None:
                    return problem
            if self.tool_check is not None and finish in ("stop", "tool_calls", "length"):
                for call in (self._calls.get(index) or {}).values():
                    arguments = "".join(call[1:])
                    if finish == "length" and not complete_json(arguments):
                        continue  # cut by max_tokens inside this call's arguments
                    problem = self.tool_check(call[0], arguments)
                    if problem is not None:
                        return problem
        return None

    def _event(self, event: bytes) -> None:
        self._count += 1
        self._queue.append((self._count, event))
        payload = _data(event)
        choices = payload.get("choices") if isinstance(payload, dict) else None
        for choice in choices if isinstance(choices, list) else []:
            if not isinstance(choice, dict):
                continue
            index = choice.get("index", 0)
            delta = choice.get("delta")  # chat completions; /v1/completions streams carry `text`
            piece = delta.get("content") if isinstance(delta, dict) else choice.get("text")
            if isinstance(piece, str) and piece:
                self._content.setdefault(index, []).append(piece)
                self._latest[index] = self._count
            for call in (delta.get("tool_calls") if isinstance(delta, dict) else None) or []:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict):
                    continue
                parts = self._calls.setdefault(index, {}).setdefault(call.get("index", 0), [""])
                if isinstance(function.get("name"), str) and function["name"]:
                    parts[0] = function["name"]
                if isinstance(function.get("arguments"), str) and function["arguments"]:
                    parts.append(function["arguments"])
                self._latest[index] = self._count
            if choice.get("finish_reason"):
                self._finish[index] = choice["finish_reason"]


def complete_json(text: str) -> bool:
    """Whether `text` is one whole JSON value (a call's arguments that max_tokens did not cut)."""
    try:
        json.loads(text)
        return True
    except ValueError:
        return False


def _data(event: bytes) -> Optional[Any]:
    lines = [line[5:].strip() for line in event.split(b"\n") if line.startswith(b"data:")]
    if not lines or lines == [b"[DONE]"]:
        return None
    try:
        return json.loads(b"\n".join(lines))
    except ValueError:
        return None
