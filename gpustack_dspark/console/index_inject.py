"""ASGI: GPUStack's `GET /` (its single-page app's `index.html`) with one script added,
`/dspark/ui/menu.js`, which puts the DSpark entry in GPUStack's side menu and the hint in
its deploy form. GPUStack 2.3 has no menu extension point. Any other response, and any
problem, goes out unchanged."""

import logging
from typing import Any, Dict, Tuple

from gpustack_dspark.asgi_rewrite import GetResponseRewrite, with_length

logger = logging.getLogger(__name__)

SCRIPT_TAG = b'<script src="/dspark/ui/menu.js" defer></script>'
MARK = b"/dspark/ui/menu.js"


def inject(html: bytes) -> bytes:
    """The page with the script before `</body>` (pure); unchanged if it has it or no body."""
    if MARK in html:
        return html
    at = html.rfind(b"</body>")
    if at < 0:
        return html
    return html[:at] + SCRIPT_TAG + html[at:]


class IndexInjectMiddleware(GetResponseRewrite):
    def __init__(self, app) -> None:
        super().__init__(app, "/", _rewrite)


def _rewrite(start: Dict[str, Any], body: bytes) -> Tuple[list, bytes]:
    headers = list(start.get("headers") or [])
    try:
        names = {k.lower(): v for k, v in headers}
        if (start.get("status") != 200 or not names.get(b"content-type", b"").startswith(b"text/html")
                or names.get(b"content-encoding")):
            return headers, body
        new_body = inject(body)
        if new_body is body:
            return headers, body
        out = []
        for k, v in headers:
            if k.lower() == b"etag":  # another body, another tag: a cached stock page is not reused
                v = v[:-1] + b'-dspark"' if v.endswith(b'"') else v + b"-dspark"
            out.append((k, v))
        return with_length(out, new_body), new_body
    except Exception as e:
        logger.warning("DSpark could not add its menu entry to GPUStack's page: %s", e)
        return headers, body
