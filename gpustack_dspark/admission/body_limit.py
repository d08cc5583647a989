"""A size bound on the bodies of GPUStack's model-writing routes (pure ASGI).

GPUStack reads a whole request body before validating it; a 100 MB model write or import
document would be parsed in the server process. Bodies of `POST`/`PUT` under `/v2/models`
and `/v2/model-evaluations` over the bound get a 413 naming the bound, before GPUStack reads
them (by Content-Length, or by counting a chunked body as it streams in, buffered and then
replayed to GPUStack).
"""

import json
from typing import Tuple

PREFIXES: Tuple[str, ...] = ("/v2/models", "/v2/model-evaluations")
DEFAULT_MAX_BYTES = 8 * 1024 * 1024


def _refusal(max_bytes: int) -> bytes:
    return json.dumps({"code": 413, "reason": "PayloadTooLarge",
                       "message": f"request body larger than {max_bytes} bytes; allowed: at most {max_bytes} "
                                  "bytes for model writes and imports"}).encode()


class BodyLimitMiddleware:
    def __init__(self, app, max_bytes: int = DEFAULT_MAX_BYTES):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") not in ("POST", "PUT") \
                or not scope.get("path", "").startswith(PREFIXES):
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers") or []:
            if name == b"content-length" and value.isdigit() and int(value) > self.max_bytes:
                return await self._refuse(send)
        # Read the whole body first (these bodies are small), then replay it to GPUStack.
        chunks, seen = [], 0
        while True:
            message = await receive()
            if message.get("type") != "http.request":
                return  # the client went away
            chunk = message.get("body", b"")
            seen += len(chunk)
            if seen > self.max_bytes:
                return await self._refuse(send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replay = [{"type": "http.request", "body": b"".join(chunks), "more_body": False}]

        async def replayed():
            return replay.pop() if replay else await receive()

        await self.app(scope, replayed, send)

    async def _refuse(self, send) -> None:
        body = _refusal(self.max_bytes)
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

