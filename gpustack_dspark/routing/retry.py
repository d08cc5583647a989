"""Which failed attempts are safe to retry on another replica (pure).

GPUStack's server reaches a replica through the replica's worker, so a dead replica
shows up as the worker's own error answer, not as a socket error at the server: the
worker answers 503 with GPUStack's "An unexpected error occurred: <aiohttp error>" when
it cannot reach the replica before the first byte, and 404 "No running model instance
found" when the instance is no longer RUNNING there. Both mean the replica received
nothing it answered, so one retry elsewhere cannot duplicate an answer. A third case is
retried the same way: the replica died while sending its answer ("Response payload is not
completed"): the worker got no whole answer, so the client got none either; the retry
repeats the generation, never an answer the client has seen.
"""

import json
from typing import Optional

# aiohttp's texts for failures before any response byte (connect refused/reset, peer
# closed before the status line).
_BEFORE_FIRST_BYTE = (
    "Cannot connect to host",
    "Connect call failed",
    "Server disconnected",
    "Connection reset by peer",
    "Connection refused",
    "Can not write request body",  # the connection closed while the request was being sent
    "Response payload is not completed",  # the replica died while sending its answer
)
_WORKER_PROXY_ERROR = "An unexpected error occurred"
_WORKER_NO_INSTANCE = "No running model instance found"

# Exception class names raised by aiohttp before a response exists.
RETRYABLE_EXCEPTIONS = ("ClientConnectorError", "ServerDisconnectedError")


def _message(body: Optional[bytes]) -> str:
    if not body:
        return ""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return body.decode("utf-8", "replace")[:2000]
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict):
            return str(error.get("message", ""))
        return str(data.get("message", "") or error or "")
    return ""


def retryable_answer(status: int, body: Optional[bytes]) -> bool:
    """True for the worker's own 'could not reach the replica' answers."""
    message = _message(body)
    if status == 503 and message.startswith(_WORKER_PROXY_ERROR):
        return any(marker in message for marker in _BEFORE_FIRST_BYTE)
    if status == 404 and _WORKER_NO_INSTANCE in message:
        return True
    return False


def retryable_exception(exc: BaseException) -> bool:
    """True for aiohttp errors raised before any response from the worker."""
    return type(exc).__name__ in RETRYABLE_EXCEPTIONS
