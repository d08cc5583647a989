"""Whose answer is an error the worker returned: the replica's own, or the GPUStack worker's? (pure)

GPUStack's server reaches a replica through the replica's worker. The worker passes the
replica's status and body through, and adds answers of its own when it cannot: 503 "An
unexpected error occurred: <aiohttp error>", 504 "Request to ... timed out" / "Upstream ...
sent no response data", 404 "No running model instance found", 400 "Missing target port".

Stock GPUStack 2.3 turns every non-streamed answer >= 400 into its own 503 "An unexpected error
occurred: Worker request failed: ... status=400 ...", which tells clients (the OpenAI SDK by
default) to retry a request that can never succeed. The routing layer instead passes the
replica's own answers through as they are; only the worker's own answers (the replica could
not be reached or did not answer in time) keep GPUStack's 503/504.
"""

import json
from typing import Optional

from gpustack_dspark.routing import retry

OK, REPLICA, WORKER = "ok", "replica", "worker"
# Texts GPUStack's worker proxy (gpustack/routes/worker/proxy.py) puts in its own answers.
_WORKER_MESSAGES = (
    "An unexpected error occurred",
    "No running model instance found",
    "Missing target port",
)
_WORKER_TIMEOUT_MARKERS = ("timed out", "sent no response data")
# The DSpark replica's "the reply broke the requested schema; withheld" answer.
WITHHELD_TYPE = "SchemaViolationError"


def _error_fields(body: Optional[bytes]):
    """(message, type) of an OpenAI-style, GPUStack-style or FastAPI-style error body."""
    if not body:
        return "", ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")[:2000], ""
    if not isinstance(data, dict):
        return "", ""
    error = data.get("error")
    if isinstance(error, dict):
        return str(error.get("message") or ""), str(error.get("type") or "")
    detail = data.get("detail")
    return str(data.get("message") or detail or error or ""), ""


def classify(status: int, body: Optional[bytes]) -> str:
    """OK (< 400), WORKER (GPUStack's worker answered itself: replica unreachable, gone or too
    slow) or REPLICA (the replica's own error answer, to pass through unchanged)."""
    if status < 400:
        return OK
    if retry.retryable_answer(status, body):
        return WORKER
    message, _ = _error_fields(body)
    if any(message.startswith(prefix) for prefix in _WORKER_MESSAGES):
        return WORKER
    if status == 504 and any(marker in message for marker in _WORKER_TIMEOUT_MARKERS):
        return WORKER
    if status == 499:  # the worker's "client went away"
        return WORKER
    return REPLICA


def is_withheld(status: int, body: Optional[bytes]) -> bool:
    """The replica's reply check withheld a reply that broke the requested schema."""
    return status >= 500 and _error_fields(body)[1] == WITHHELD_TYPE


def count_key(status: int, body: Optional[bytes]) -> str:
    """The status counter a passed-through replica answer goes to."""
    if is_withheld(status, body):
        return "withheld"
    return "replica_4xx" if status < 500 else "replica_5xx"
