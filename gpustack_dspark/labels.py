"""Worker label syntax (pure; imports nothing of ours): shared by the server plugin's
`--dspark-json-label` flag and the `gpustack-dspark label` CLI."""

import re
from typing import Tuple

# Kubernetes label syntax, which GPUStack worker labels follow: an optional DNS prefix,
# a name of alphanumerics with -_. inside, at most 63 characters; values the same or empty.
_LABEL_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY_RE = re.compile(rf"^([a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?/)?{_LABEL_NAME}$")
_LABEL_VALUE_RE = re.compile(rf"^({_LABEL_NAME})?$")


def parse_label_key(key: str) -> str:
    if not _LABEL_KEY_RE.match(key):
        raise ValueError(
            f"label key {key!r} is not a valid label key "
            "(letters, digits, '-', '_', '.', at most 63 characters, optional DNS prefix/)"
        )
    return key


def is_label_value(value: object) -> bool:
    """A valid label value (may be empty), as Kubernetes and GPUStack accept it."""
    return isinstance(value, str) and bool(_LABEL_VALUE_RE.match(value))


def parse_label(value: str) -> Tuple[str, str]:
    """`KEY=VALUE` -> (key, value); ValueError says what is wrong and what is allowed."""
    if "=" not in value:
        raise ValueError(f"{value!r} is not KEY=VALUE (for example role=json-inference)")
    key, label_value = value.split("=", 1)
    parse_label_key(key)
    if not _LABEL_VALUE_RE.match(label_value) or not label_value:
        raise ValueError(
            f"label value {label_value!r} is not a valid label value "
            "(non-empty; letters, digits, '-', '_', '.', at most 63 characters)"
        )
    return key, label_value


# Kubernetes label selectors (equality- and set-based), as `kubectl get -l` takes them:
# `key`, `!key`, `key=value`, `key==value`, `key!=value`, `key in (a,b)`, `key notin (a,b)`,
# joined by commas. Used for the node-label sync's selector (settings) and by the
# Kubernetes API stand-in of the tests.
SELECTOR_FORMS = "key, !key, key=value, key!=value, key in (a,b), key notin (a,b), joined by commas"
_KEY_TOKEN = r"[A-Za-z0-9][A-Za-z0-9_./-]*"
_EXISTS_RE = re.compile(rf"^(!?)\s*({_KEY_TOKEN})$")
_EQUALITY_RE = re.compile(rf"^({_KEY_TOKEN})\s*(==|!=|=)\s*([^\s,()=!]*)$")
_SET_RE = re.compile(rf"^({_KEY_TOKEN})\s+(in|notin)\s*\(([^()]*)\)$")


class Requirement(Tuple[str, str, Tuple[str, ...]]):
    """(key, operator, values); operator one of exists, !exists, =, !=, in, notin."""

    def __new__(cls, key: str, operator: str, values: Tuple[str, ...] = ()):
        return super().__new__(cls, (key, operator, tuple(values)))

    @property
    def key(self) -> str:
        return self[0]

    @property
    def operator(self) -> str:
        return self[1]

    @property
    def values(self) -> Tuple[str, ...]:
        return self[2]

    def text(self) -> str:
        key, op, values = self
        if op == "exists":
            return key
        if op == "!exists":
            return f"!{key}"
        if op in ("=", "!="):
            return f"{key}{op}{values[0]}"
        return f"{key} {op} ({','.join(values)})"

    def matches(self, labels) -> bool:
        key, op, values = self
        present = key in labels
        if op == "exists":
            return present
        if op == "!exists":
            return not present
        if op in ("=", "in"):
            return present and labels[key] in values
        return not present or labels[key] not in values  # != and notin match a missing key


def _split_requirements(text: str):
    parts, depth, current = [], 0, []
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def _selector_value(value: str, requirement: str) -> str:
    if not _LABEL_VALUE_RE.match(value):
        raise ValueError(
            f"label selector requirement {requirement!r}: value {value!r} is not a valid label value "
            "(letters, digits, '-', '_', '.', at most 63 characters)"
        )
    return value


def parse_selector(text: str) -> Tuple[Requirement, ...]:
    """A Kubernetes label selector -> its requirements; ValueError names the bad part and the
    forms allowed. An empty selector (it would select every node) is refused."""
    if not text.strip():
        raise ValueError(f"the label selector is empty (allowed: {SELECTOR_FORMS})")
    requirements = []
    for part in _split_requirements(text):
        if not part:
            raise ValueError(f"label selector {text!r} has an empty requirement (allowed: {SELECTOR_FORMS})")
        found = _SET_RE.match(part)
        if found:
            key, op, raw = found.groups()
            values = tuple(v.strip() for v in raw.split(","))
            if values == ("",):
                raise ValueError(f"label selector requirement {part!r}: {op} needs at least one value")
            requirement = Requirement(key, op, tuple(_selector_value(v, part) for v in values))
        elif (found := _EQUALITY_RE.match(part)):
            key, op, value = found.groups()
            requirement = Requirement(key, "=" if op == "==" else op, (_selector_value(value, part),))
        elif (found := _EXISTS_RE.match(part)):
            bang, key = found.groups()
            requirement = Requirement(key, "!exists" if bang else "exists")
        else:
            raise ValueError(f"label selector requirement {part!r} is not one of: {SELECTOR_FORMS}")
        try:
            parse_label_key(requirement.key)
        except ValueError as e:
            raise ValueError(f"label selector requirement {part!r}: {e}") from None
        requirements.append(requirement)
    return tuple(requirements)


def selector_text(requirements) -> str:
    return ",".join(r.text() for r in requirements)


def selector_matches(requirements, labels) -> bool:
    return all(r.matches(labels) for r in requirements)
