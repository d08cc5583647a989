"""Which DSpark knob values a model write must be refused for (pure).

The same parsers and messages as `dspark-serve` and the CLI (`knobs.scan_knob_tokens`). Only
what the server can know is judged: flag names and values. A schema *file*, a warmup file, a
draft checkpoint and the model's `config.json` live on the worker, which checks them at start.
"""

from typing import Dict, List, Optional, Sequence

from gpustack_dspark.backend_ids import BACKEND_NAME
from gpustack_dspark.knobs import KnobError, KnobToken, scan_knob_tokens

MESSAGE_PREFIX = "DSpark backend parameters: "


def _last_per_knob(tokens: List[KnobToken]) -> List[KnobToken]:
    """As `dspark-serve` reads them: the last value of a knob wins; every unknown flag counts."""
    last: Dict[str, KnobToken] = {}
    for token in tokens:
        last.pop(token.key, None)
        last[token.key] = token
    return list(last.values())


def refusals(backend: Optional[str], argv: Optional[Sequence[str]],
             stored_backend: Optional[str] = None,
             stored_argv: Optional[Sequence[str]] = None) -> List[KnobError]:
    """The knob errors a write must be refused for; [] when it may go ahead.

    `stored_*` describe the row being updated (None on create): a knob whose value is the
    stored one is not judged again, so GPUStack's own whole-object writes of an existing model
    (workers, controllers) keep working even if that model predates this check.
    """
    if backend != BACKEND_NAME or not argv:
        return []
    previous: Dict[str, Optional[str]] = {}
    if stored_argv is not None and stored_backend == BACKEND_NAME:
        previous = {t.key: t.raw for t in _last_per_knob(scan_knob_tokens(stored_argv))}
    return [t.error for t in _last_per_knob(scan_knob_tokens(argv))
            if t.error is not None and not (t.key in previous and previous[t.key] == t.raw)]


def refusal_message(errors: List[KnobError]) -> str:
    """One line: each problem exactly as `dspark-serve` and the CLI word it."""
    return MESSAGE_PREFIX + " | ".join(str(e) for e in errors)
