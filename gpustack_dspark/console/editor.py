"""The console's knob editor (pure): a deployment's backend parameters with some DSpark
knobs changed, judged with the same parsers and messages as `dspark-serve`, the CLI and the
API-side check (`knobs.scan_knob_tokens`), and the diff the page previews."""

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

from gpustack_dspark.knobs import KNOBS_BY_FLAG, KnobError, nearest, scan_knob_tokens

# The knobs the console edits; the others stay as the backend parameters have them.
EDITABLE = ("--dspark-speculative-length", "--dspark-speculative-max", "--dspark-accept-threshold",
            "--dspark-grammar-mode",
            "--dspark-schema", "--dspark-warmup-requests", "--dspark-warmup-timeout")


@dataclass
class Edit:
    backend_parameters: List[str]
    changes: List[Dict[str, Optional[str]]] = field(default_factory=list)  # {flag, from, to}
    errors: Dict[str, str] = field(default_factory=dict)                  # flag -> message

    def as_dict(self) -> Dict[str, object]:
        return {"backend_parameters": self.backend_parameters, "changes": self.changes, "errors": self.errors}


def _current(argv: Sequence[str]) -> Dict[str, Optional[str]]:
    out: Dict[str, Optional[str]] = {}
    for token in scan_knob_tokens(argv, check_values=False):
        out[token.flag] = token.raw
    return out


def edit_knobs(backend_parameters: Optional[Sequence[str]], wanted: Mapping[str, Optional[str]]) -> Edit:
    """`wanted` maps a flag to its new value (None or "": remove the flag, the worker's
    default applies). The result keeps every other argument in place; a changed flag is
    written `--flag=value` where it stood (its earlier duplicates dropped), a new one at the end."""
    argv = [str(a) for a in (backend_parameters or [])]
    errors: Dict[str, str] = {}
    for flag, value in wanted.items():
        if flag not in EDITABLE:
            hint = nearest(flag, list(EDITABLE))
            errors[flag] = str(KnobError(flag, value, ", ".join(EDITABLE),
                                         f"not editable here; did you mean {hint}?" if hint else "not editable here"))
            continue
        if value is not None and str(value).strip() != "":
            try:
                KNOBS_BY_FLAG[flag].parse(flag, str(value).strip())
            except KnobError as e:
                errors[flag] = str(e)
    before = _current(argv)
    if errors:
        return Edit(argv, [], errors)
    tokens = scan_knob_tokens(argv, check_values=False)
    out: List[str] = []
    taken = {t.index + k: t for t in tokens for k in range(t.width)}
    last_index = {t.flag: t.index for t in tokens}
    for n, arg in enumerate(argv):
        token = taken.get(n)
        if token is None or token.flag not in wanted:
            out.append(arg)
            continue
        if n != token.index or token.index != last_index[token.flag]:
            continue  # the flag's value item, or an earlier duplicate
        value = wanted[token.flag]
        if value is not None and str(value).strip() != "":
            out.append(f"{token.flag}={str(value).strip()}")
    for flag, value in wanted.items():
        if flag not in last_index and value is not None and str(value).strip() != "":
            out.append(f"{flag}={str(value).strip()}")
    after = _current(out)
    changes = [{"flag": flag, "from": before.get(flag), "to": after.get(flag)}
               for flag in wanted if before.get(flag) != after.get(flag)]
    return Edit(out, changes, {})
