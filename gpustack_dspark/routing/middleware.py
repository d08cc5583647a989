"""ASGI middleware: one routing slot per inference request, released when the response
is over — its last byte sent, the client gone, an error or a cancellation. The slot
notes the status and whether the answer was sent whole (the service-time estimate's input).

Pure ASGI (not BaseHTTPMiddleware) so the request runs in this coroutine: `finally` is
reached exactly once however the response ends, and the context variable set here is
the one GPUStack's handler sees.
"""

from typing import Callable, Tuple

from gpustack_dspark.routing.context import enter_slot, leave_slot

INFERENCE_PREFIXES: Tuple[str, ...] = ("/v1/", "/v1-openai/")


class InFlightMiddleware:
    def __init__(self, app, release: Callable, prefixes: Tuple[str, ...] = INFERENCE_PREFIXES):
        self.app = app
        self.release = release  # release(slot): drops the slot's in-flight count, if any
        self.prefixes = prefixes

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or not scope.get("path", "").startswith(self.prefixes):
            await self.app(scope, receive, send)
            return
        slot, token = enter_slot()

        async def watched_send(message):
            # What the client got: the status, and whether the last body part went out
            # (only a complete successful answer feeds the instance's service-time estimate).
            kind = message.get("type")
            if kind == "http.response.start":
                slot.status = message.get("status")
            elif kind == "http.response.body" and not message.get("more_body", False):
                slot.completed = True
            await send(message)

        try:
            await self.app(scope, receive, watched_send)
        finally:
            try:
                self.release(slot)
            finally:
                leave_slot(token)
