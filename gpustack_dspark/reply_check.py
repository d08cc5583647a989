"""Does a finished reply's text follow its JSON schema? One answer for the proxy and the worker.

Two places judge a finished reply against the schema its request asked for: the server
plugin's JSON format check (`routing/format_check.py`: counted, after the reply went out) and
the replica's reply check (`worker/middleware.py`: a reply that fails is withheld). They judge
with this one module, so a reply is never good on one side and bad on the other. It runs on
both sides (the server's `[server]` and the worker's `[worker]` extra both bring jsonschema,
imported only when a schema is checked) and imports nothing of ours.

Numbers are judged as the decimal numbers the JSON text writes, not as binary floats: with
floats `37.3` is not a multiple of `0.01` (37.3 / 0.01 = 3729.9999999999995), and a replica
withheld such a reply as invalid. So the reply and the schema are both read with
`parse_float=Decimal` (integers stay `int`; one too long for `int()` becomes a `LongInteger`),
and the validator is jsonschema's own for the schema's draft with two keywords made exact:
`multipleOf` (draft 3: `divisibleBy`), by `is_multiple`'s integer arithmetic on the digits,
and the `integer` type, which counts an integral Decimal where the draft counts `1.0`.

Bounded: compiled validators are kept by the digest of the schema's canonical text, at most
`VALIDATORS_KEPT`, least recently used dropped first; `is_multiple` is linear in the digits
whatever the exponents (`1e999999999` costs what `1e9` does).
"""

import decimal
import hashlib
import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, List, Optional, Tuple

NOT_JSON = "not_json"
SCHEMA_MISMATCH = "schema_mismatch"
VALIDATORS_KEPT = 64
_INT_DIGITS = 4000  # below Python's int() limit (4300 digits); longer integer literals stay Decimal


class LongInteger(Decimal):
    """An integer literal too long for `int()`: exact, and an integer in every draft."""


def _number(text: str) -> Any:
    try:
        return Decimal(text)
    except decimal.InvalidOperation:  # an exponent beyond Decimal's range: what float makes of it
        return float(text)


def _integer(text: str) -> Any:
    return int(text) if len(text) <= _INT_DIGITS else LongInteger(text)


_DECODER = json.JSONDecoder(parse_float=_number, parse_int=_integer)  # one, not one per call


def loads(text: Any) -> Any:
    """JSON with its numbers exact: fractions and exponents as Decimal, integers as int."""
    if isinstance(text, (bytes, bytearray)):
        text = text.decode(json.detect_encoding(text), "surrogatepass")
    return _DECODER.decode(text)


_PARTS = re.compile(r"-?(\d*)\.?(\d*)(?:E([+-]?\d+))?\Z", re.I)


def _digits_and_exponent(value: Decimal) -> Tuple[str, int]:
    """A finite, non-zero `value` as coefficient digits without trailing zeros and a power of
    ten. Read off its text, which is linear in its length (`as_tuple()` is not)."""
    whole, fraction, exponent = _PARTS.match(str(value)).groups()
    digits = (whole + fraction).lstrip("0")
    stripped = digits.rstrip("0")
    return stripped, int(exponent or 0) - len(fraction) + (len(digits) - len(stripped))


def _finite(value: Any) -> Optional[Decimal]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        return Decimal(repr(value)) if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return value if value.is_finite() else None
    return None


def is_multiple(value: Any, factor: Any) -> bool:
    """Whether `value` is an integer multiple of `factor` (> 0), judged exactly on the decimal
    numbers (a float is taken as its shortest text). Non-finite numbers are multiples of nothing.

    With value = X·10^a and factor = M·10^b (X, M without trailing zeros): for a < b the
    lowest digit of `value` sits below any multiple of `factor`; otherwise `value` is a
    multiple iff M divides X·10^(a-b), i.e. (X mod M)·(10^(a-b) mod M) ≡ 0 (mod M)."""
    x, m = _finite(value), _finite(factor)
    if x is None or m is None or m <= 0:
        return False
    if x == 0:
        return True
    x_digits, x_exp = _digits_and_exponent(x)
    m_digits, m_exp = _digits_and_exponent(m)
    if x_exp < m_exp:
        return False
    with decimal.localcontext() as ctx:
        ctx.prec = max(len(x_digits), 2 * len(m_digits)) + 2  # every step below is exact
        ctx.traps[decimal.Inexact] = True
        modulus = Decimal(m_digits)
        return (Decimal(x_digits) % modulus) * pow(Decimal(10), Decimal(x_exp - m_exp), modulus) % modulus == 0


def _integral(value: Decimal) -> bool:
    return value.is_finite() and (value == 0 or _digits_and_exponent(value)[1] >= 0)


def _text(value: Any) -> str:
    return str(value) if isinstance(value, Decimal) else repr(value)


_DECIMAL_REPR = re.compile(r"(?:Decimal|LongInteger)\('([^']*)'\)")


@dataclass(frozen=True)
class Problem:
    """Why a reply fails: `kind` NOT_JSON or SCHEMA_MISMATCH; `detail` the parser's message or
    jsonschema's most relevant error; `where` the failing value's path (schema mismatches)."""
    kind: str
    detail: str
    where: str = ""

    def __str__(self) -> str:
        if self.kind == NOT_JSON:
            return f"not JSON: {self.detail}"
        return f"at {self.where or '(root)'}: {self.detail[:200]}"


_exact_classes: dict = {}  # one per draft


def _exact_class(base: Any) -> Any:
    """jsonschema's validator class `base` with `multipleOf` and `integer` judged exactly."""
    if base in _exact_classes:
        return _exact_classes[base]
    from jsonschema import ValidationError, validators

    def multiple_of(validator, factor, instance, schema):
        if validator.is_type(instance, "number") and not is_multiple(instance, factor):
            yield ValidationError(f"{_text(instance)} is not a multiple of {_text(factor)}")

    types = base.TYPE_CHECKER
    floats_count = types.is_type(1.0, "integer")  # drafts 6+: 1.0 is an integer; 3 and 4: it is not

    def is_integer(checker, instance):
        if isinstance(instance, LongInteger):
            return True
        if isinstance(instance, Decimal):
            return floats_count and _integral(instance)
        return types.is_type(instance, "integer")

    keywords = {k: multiple_of for k in ("multipleOf", "divisibleBy") if k in base.VALIDATORS}
    cls = validators.extend(base, keywords, type_checker=types.redefine("integer", is_integer))
    _exact_classes[base] = cls
    return cls


class _Validators:
    """Compiled exact validators by schema digest (None: an unusable schema), at most `kept`."""

    def __init__(self, kept: int = VALIDATORS_KEPT) -> None:
        self.kept = kept
        self._items: "OrderedDict[str, Any]" = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def get(self, schema: Any) -> Any:
        try:
            text = json.dumps(schema, sort_keys=True, default=str)
        except (TypeError, ValueError):
            return None
        key = hashlib.sha256(text.encode()).hexdigest()
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
        validator = _compile(schema, text)
        with self._lock:
            self._items[key] = validator
            while len(self._items) > self.kept:
                self._items.popitem(last=False)
        return validator


def _compile(schema: Any, text: str) -> Any:
    try:
        import jsonschema

        base = jsonschema.validators.validator_for(schema)
        base.check_schema(schema)  # the schema as the request wrote it, against its meta-schema
        return _exact_class(base)(loads(text))
    except Exception:  # an unusable schema: replies are checked as JSON only
        return None


_validators = _Validators()


def check(content: Any, schema: Any = None) -> Optional[Problem]:
    """The problem of one finished reply's text against `schema` (None: JSON only), or None
    when it is fine. An unusable schema judges the text as JSON only."""
    try:
        value = loads(content)
    except ValueError as e:
        return Problem(NOT_JSON, getattr(e, "msg", str(e)))
    if schema is None:
        return None
    validator = _validators.get(schema)
    if validator is None:
        return None
    from jsonschema.exceptions import best_match

    error = best_match(validator.iter_errors(value))
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return Problem(SCHEMA_MISMATCH, _DECIMAL_REPR.sub(r"\1", error.message), where)


def one_of_overlaps(content: Any, schema: Any) -> List[Tuple[Tuple[Any, ...], List[int]]]:
    """Where a finished reply breaks a `oneOf` by satisfying more than one branch: (the schema
    path of that `oneOf`, from the root; the branches it satisfies), for each such place. Empty
    when there is none, or the text is no JSON, or a branch cannot be judged on its own (a
    `$ref` relative to a document the branch is not)."""
    try:
        value = loads(content)
    except ValueError:
        return []
    validator = _validators.get(schema)
    if validator is None:
        return []
    out = []
    for error in validator.iter_errors(value):
        if error.validator != "oneOf" or not isinstance(error.validator_value, list):
            continue
        try:
            matched = [i for i, branch in enumerate(error.validator_value)
                       if validator.evolve(schema=branch).is_valid(error.instance)]
        except Exception:
            continue
        if len(matched) > 1:
            out.append((tuple(error.schema_path), matched))
    return out
