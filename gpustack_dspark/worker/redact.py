"""Secret values out of what the replica shows and logs (pure).

`/dspark/info` is open beside the health path and the launcher logs the vLLM argv, so the
values of secret-bearing flags (`--api-key`, `--hf-token`, anything named *token*, *password*,
*secret*, *credential*) and environment variables are replaced by `REDACTED` there. Names are
matched by whole words of the flag or variable name, so `--max-num-batched-tokens` and
`--tokenizer` are not secrets; JSON-valued flags are redacted key by key.
"""

import json
import re
from typing import Any, Dict, List, Mapping, Sequence

REDACTED = "REDACTED"
_SECRET_WORDS = {"token", "password", "passwd", "secret", "credential", "credentials", "apikey"}
_WORD_SPLIT = re.compile(r"[-_.\s]+")


def is_secret_name(name: str) -> bool:
    """True for names like --api-key, --hf-token, HF_TOKEN, VLLM_API_KEY, db_password, client-secret."""
    words = [w for w in _WORD_SPLIT.split(name.strip().lstrip("-").lower()) if w]
    if any(w in _SECRET_WORDS for w in words):
        return True
    return any(a == "api" and b == "key" or a == "access" and b == "key" or a == "private" and b == "key"
               for a, b in zip(words, words[1:]))


def _redact_json_value(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and v not in (None, "") else _redact_json_value(v))
                for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_json_value(v) for v in value]
    return value


def _redact_json_text(text: str) -> str:
    stripped = text.lstrip()
    if not stripped.startswith(("{", "[")):
        return text
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):
        return text
    redacted = _redact_json_value(value)
    return text if redacted == value else json.dumps(redacted, separators=(",", ":"))


def redact_argv(argv: Sequence[str]) -> List[str]:
    """The argv with every secret flag's value(s) replaced; `--flag=value` and `--flag value`."""
    out: List[str] = []
    secret_values = False
    for token in argv:
        if token.startswith("-") and len(token) > 1 and not _is_number(token):
            secret_values = False
            name, eq, value = token.partition("=")
            if is_secret_name(name):
                out.append(f"{name}={REDACTED}" if eq else name)
                secret_values = not eq
                continue
            out.append(f"{name}={_redact_json_text(value)}" if eq else token)
            continue
        # Values after a secret flag (vLLM's --api-key takes several) until the next flag.
        out.append(REDACTED if secret_values else _redact_json_text(token))
    return out


def redact_env(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: (REDACTED if is_secret_name(k) and v else v) for k, v in env.items()}


def redact_text(text: str, secrets: Sequence[str]) -> str:
    """Known secret values (e.g. the API key) out of free text such as a log line."""
    for secret in secrets:
        # Short values and flags ("true", "1") are no secrets worth blanking every log line for.
        if secret and len(secret) >= 6 and secret.lower() not in ("true", "false", "none", "null") \
                and not _is_number(secret):
            text = text.replace(secret, REDACTED)
    return text


def _is_number(token: str) -> bool:
    try:
        float(token)
        return True
    except ValueError:
        return False


def secret_values(argv: Sequence[str]) -> List[str]:
    """The values redact_argv hides (for filtering them out of free text)."""
    values: List[str] = []
    for original, shown in zip(argv, redact_argv(argv)):
        if original == shown:
            continue
        name, eq, value = original.partition("=")
        text = value if eq and original.startswith("-") else original
        if shown.endswith(REDACTED) and not shown.endswith(f'"{REDACTED}"'):
            values.append(text)
        else:  # a JSON value with secret keys: their values
            values.extend(_json_secrets(text))
    return [v for v in values if v]


def _json_secrets(text: str) -> List[str]:
    try:
        stack = [json.loads(text)]
    except (ValueError, RecursionError):
        return []
    out: List[str] = []
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if is_secret_name(str(k)) and isinstance(v, str):
                    out.append(v)
                else:
                    stack.append(v)
        elif isinstance(item, list):
            stack.extend(item)
    return out
