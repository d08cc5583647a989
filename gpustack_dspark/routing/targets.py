"""Which of a route's active targets may serve a request, given its JSON intent (pure)."""

from dataclasses import dataclass
from typing import Callable, Generic, List, Sequence, TypeVar

from gpustack_dspark.routing.policy import NoJsonIntentOnJsonOnly

T = TypeVar("T")

# Decision labels: also the `decision` label values of the Prometheus counter.
JSON = "json"  # JSON intent -> JSON targets of a mixed route
GENERAL = "general"  # no JSON intent -> general targets of a mixed route
JSON_ONLY = "json_only"  # no JSON intent, only JSON targets: served as JSON (policy)
REFUSED = "refused"  # no JSON intent, only JSON targets: refused (policy)
UNCHANGED = "unchanged"  # no active JSON target: GPUStack's choice as is
DECISIONS = (JSON, GENERAL, JSON_ONLY, REFUSED, UNCHANGED)


@dataclass(frozen=True)
class TargetChoice(Generic[T]):
    targets: List[T]
    decision: str


def choose_targets(
    targets: Sequence[T],
    is_json_target: Callable[[T], bool],
    json_intent: bool,
    without_intent: NoJsonIntentOnJsonOnly,
) -> TargetChoice[T]:
    """Split a route's active targets into the JSON pool and the general pool.

    A refusal returns no targets; the caller answers 400. The weights GPUStack applies
    afterwards still split traffic within the chosen pool.
    """
    json_pool = [t for t in targets if is_json_target(t)]
    general_pool = [t for t in targets if not is_json_target(t)]
    if not json_pool:
        return TargetChoice(list(targets), UNCHANGED)
    if json_intent:
        return TargetChoice(json_pool, JSON)
    if general_pool:
        return TargetChoice(general_pool, GENERAL)
    if without_intent is NoJsonIntentOnJsonOnly.REFUSE:
        return TargetChoice([], REFUSED)
    return TargetChoice(json_pool, JSON_ONLY)


def refusal_message(model_name: str) -> str:
    return (
        f"model {model_name!r} serves JSON only and this request does not ask for JSON: "
        "set response_format to {\"type\": \"json_object\"} or {\"type\": \"json_schema\", ...} "
        "(or structured_outputs / guided_json); the routing policy "
        "json_only_without_json_intent=refuse rejects other requests"
    )
