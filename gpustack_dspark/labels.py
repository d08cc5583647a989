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
