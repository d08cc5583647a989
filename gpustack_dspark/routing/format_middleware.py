"""ASGI middleware: counts JSON replies that do not parse or break the requested schema.

Sits inside `InFlightMiddleware` (so the routing slot is set) and watches what GPUStack's
proxy sends back for JSON requests (JSON intent, or a JSON-only model served as JSON).
Every message goes to the client first; the check runs after the last byte, on a bounded
copy (format_check.py), and any failure of the check itself is logged, never raised.
"""

import logging
from typing import Any, Dict, Optional, Tuple

from gpustack_dspark.routing import format_check, targets
from gpustack_dspark.routing.context import RequestSlot, current_slot

logger = logging.getLogger(__name__)

CHECKED_SUFFIXES = ("/chat/completions", "/completions")
MAX_SERIES = 2000  # (model, instance, result) label sets kept; beyond that one overflow series


class FormatStats:
    """Checked replies per (model, instance_id, result); read by the status and the collector."""

    def __init__(self) -> None:
        self.counts: Dict[Tuple[str, str, str], int] = {}

    def record(self, model: Optional[str], instance_id: Optional[int], result: str) -> None:
        key = (model or "", "" if instance_id is None else str(instance_id), result)
        if key not in self.counts and len(self.counts) >= MAX_SERIES:
            key = ("(other)", "", result)
        self.counts[key] = self.counts.get(key, 0) + 1

    def snapshot(self) -> Dict[Tuple[str, str, str], int]:
        return dict(self.counts)

    def totals(self) -> Dict[str, int]:
        out = {result: 0 for result in format_check.RESULTS}
        for (_m, _i, result), count in self.counts.items():
            out[result] = out.get(result, 0) + count
        return out


def wants_check(slot: RequestSlot) -> bool:
    return slot.json_intent or slot.decision == targets.JSON_ONLY


class _Watch:
    def __init__(self, slot: RequestSlot) -> None:
        self.slot = slot
        self.active = False
        self.stream: Optional[format_check.StreamCheck] = None
        self.parts: list = []
        self.size = 0

    def see(self, message: Dict[str, Any]) -> Optional[str]:
        """Returns the result once the reply is complete."""
        if message["type"] == "http.response.start":
            content_type = b""
            for key, value in message.get("headers") or []:
                if key.lower() == b"content-type":
                    content_type = value.lower()
            self.active = message.get("status") == 200 and wants_check(self.slot)
            if self.active and b"text/event-stream" in content_type:
                self.stream = format_check.StreamCheck(self.slot.schema)
            return None
        if message["type"] != "http.response.body" or not self.active:
            return None
        body = message.get("body", b"")
        if self.stream is not None:
            self.stream.feed(body)
        elif self.size <= format_check.MAX_BODY_BYTES:
            self.size += len(body)
            self.parts.append(body)
        if message.get("more_body"):
            return None
        self.active = False
        if self.stream is not None:
            return self.stream.result()
        if self.size > format_check.MAX_BODY_BYTES:
            return format_check.UNCHECKED
        return format_check.check_body(b"".join(self.parts), self.slot.schema)


class FormatCheckMiddleware:
    def __init__(self, app, stats: FormatStats):
        self.app = app
        self.stats = stats
        self._warned = False

    async def __call__(self, scope, receive, send):
        slot = current_slot() if scope.get("type") == "http" else None
        if slot is None or scope.get("method") != "POST" or not scope.get("path", "").endswith(CHECKED_SUFFIXES):
            await self.app(scope, receive, send)
            return
        watch = _Watch(slot)

        async def watched_send(message):
            await send(message)  # the client first, always
            try:
                result = watch.see(message)
                if result is not None:
                    self.stats.record(slot.model, slot.instance_id, result)
                    if result in format_check.ERRORS:
                        logger.warning("JSON format error (%s) in a reply of model %s, instance %s",
                                       result, slot.model, slot.instance_id)
            except Exception as e:  # the check is a view; it never breaks a reply
                watch.active = False
                if not self._warned:
                    self._warned = True
                    logger.warning("DSpark JSON format check failed (reply delivered unchecked): %s", e)

        await self.app(scope, receive, watched_send)
