"""ASGI: one GET path's whole response body handed to a rewrite before it goes out.

The plugin rewrites two of GPUStack's responses this way (`observe/metrics_config.py`,
`console/index_inject.py`); every other request passes through untouched. The rewrite gets
the response-start message and the whole body and returns the headers and body to send; it
must never raise (on a problem it returns what it was given)."""

from typing import Any, Callable, Dict, List, Tuple

Rewrite = Callable[[Dict[str, Any], bytes], Tuple[list, bytes]]


class GetResponseRewrite:
    def __init__(self, app, path: str, rewrite: Rewrite) -> None:
        self.app = app
        self.path = path
        self.rewrite = rewrite

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http" or scope.get("method") != "GET" or scope.get("path") != self.path:
            await self.app(scope, receive, send)
            return
        start: Dict[str, Any] = {}
        parts: List[bytes] = []

        async def capture(message):
            if message["type"] == "http.response.start":
                start.update(message)
                return
            if message["type"] == "http.response.body":
                parts.append(message.get("body", b""))
                if message.get("more_body"):
                    return
                headers, body = self.rewrite(start, b"".join(parts))
                await send({**start, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
            await send(message)

        await self.app(scope, receive, capture)


def with_length(headers: list, body: bytes) -> list:
    """`headers` with Content-Length set for `body`."""
    return [(k, v) for k, v in headers if k.lower() != b"content-length"] + [(b"content-length", str(len(body)).encode())]
