"""Sampling parameters a speculating replica cannot honour become a 400 (pure).

The promise is the model's own distribution, with or without speculation. vLLM 0.32 applies
temperature, top_k, top_p, the penalties, bad words, allowed token ids and min_tokens to every
verified draft position (the rejection sampler's `apply_logits_processors` and
`apply_sampling_constraints`), so those are served exactly. Two it does not apply at all once
an engine has a speculative config: `build_logitsprocs` keeps only MinTokens and logs "min_p
and logit_bias parameters won't work with speculative decoding" — the request is answered as if
they were not there. The per-request way out (turning speculation off for that request) does
not exist either: the processors are not loaded in the engine, drafts or not. So a request
that sets one of them gets a clear 400 instead of a silently different distribution.
"""

from typing import Any, Dict, Optional, Tuple

# parameter -> (is it set?, what is allowed)
_IGNORED_WITH_SPECULATION = {
    "min_p": (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and v != 0, "0 or unset"),
    "logit_bias": (lambda v: bool(v), "empty or unset"),
}


def refused_with_speculation(body: Dict[str, Any]) -> Optional[Tuple[str, str]]:
    """(parameter, one-line reason) when the body sets a parameter speculation would ignore."""
    for name, (is_set, allowed) in _IGNORED_WITH_SPECULATION.items():
        value = body.get(name)
        if value is not None and is_set(value):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            return name, (f"{name}={shown} is not honoured by vLLM with speculative decoding on this DSpark "
                          f"replica (allowed: {allowed}); send it to a replica without --enable-dspark")
    return None
