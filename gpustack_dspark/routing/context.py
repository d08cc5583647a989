"""Per-request routing state shared by the middleware and the GPUStack hooks.

The middleware sets a fresh slot for each /v1 request; the hooks, running inside that
request, find it here. Outside a slot (any other caller) the hooks neither count nor
filter, so nothing can be acquired that the middleware would not release.
"""

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, List, Optional, Set


@dataclass
class RequestSlot:
    json_intent: bool = False
    stream: bool = False
    decision: Optional[str] = None
    instance_id: Optional[int] = None  # the instance this request holds a count on
    candidates: List[Any] = field(default_factory=list)  # instances offered at the last choice
    tried: Set[int] = field(default_factory=set)
    retried: bool = False
    model: Optional[str] = None  # the request's model name (format-check metrics)
    schema: Any = None  # the JSON schema the request asked for, if any
    affinity_key: Any = None  # affinity.AffinityKey: what it shares with other requests, if anything
    chosen_at: float = 0.0  # monotonic time the current instance was chosen
    output_tokens: Optional[int] = None  # of the answer, as the proxy saw it
    status: Optional[int] = None  # the HTTP status sent to the client
    completed: bool = False  # the response's last body part was sent
    broken: bool = False  # a stream that ended before [DONE]


_current: ContextVar[Optional[RequestSlot]] = ContextVar("dspark_routing_slot", default=None)


def current_slot() -> Optional[RequestSlot]:
    return _current.get()


def enter_slot() -> tuple:
    slot = RequestSlot()
    return slot, _current.set(slot)


def leave_slot(token) -> None:
    _current.reset(token)
