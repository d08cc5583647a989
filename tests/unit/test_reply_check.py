"""The one reply checker (gpustack_dspark/reply_check.py) the proxy and the worker share:
numbers judged as the decimals the JSON text writes, messages, unusable schemas, the bound."""

import time
from decimal import Decimal

import jsonschema
import pytest

from gpustack_dspark import reply_check as rc

PRICE = {"type": "object", "properties": {"price": {"type": "number", "multipleOf": 0.01}}, "required": ["price"]}


def _price(text):
    return rc.check('{"price": %s}' % text, PRICE)


def test_the_held_out_fault_binary_floats_call_37_3_no_multiple_of_0_01():
    # What the checks did before: jsonschema on floats withholds a good reply.
    assert not jsonschema.Draft202012Validator(PRICE).is_valid({"price": 37.3})
    assert _price("37.3") is None


@pytest.mark.parametrize("text", [
    "37.3", "37.30", "-37.3", "0", "-0.0", "7", "1e2", "1E+2", "100e-2", "0.07", "1.1", "0.3",
    "12345678901234567890.12",  # beyond a double's 17 digits
    "1e400",  # beyond a double's range (float: inf)
    "9" * 5000,  # an integer literal too long for int()
])
def test_multiples_of_0_01_are_served(text):
    assert _price(text) is None, text


@pytest.mark.parametrize("text", ["37.305", "-37.305", "0.001", "1e-400", "12345678901234567890.123", "1.000000000000000001"])
def test_true_non_multiples_are_caught(text):
    problem = _price(text)
    assert problem is not None and problem.kind == rc.SCHEMA_MISMATCH, text
    assert str(problem).startswith("at price: ") and "is not a multiple of 0.01" in str(problem)


@pytest.mark.parametrize("value, factor, expected", [
    (10, 3, False), (12, 3, True), (Decimal("7.5"), Decimal("2.5"), True), (Decimal("7.6"), Decimal("2.5"), False),
    (0.3, 0.1, True), (Decimal("1"), Decimal("0.3"), False), (Decimal("0.9"), Decimal("0.3"), True),
    (Decimal("1E+5"), 4, True), (Decimal("1E+5"), 64, False), (Decimal("1E+5"), 32, True),
    (Decimal("-4.5"), Decimal("1.5"), True), (Decimal("1E+999999999999999999"), Decimal("0.01"), True),
    (Decimal("1E-999999999"), Decimal("0.01"), False), (float("inf"), 1, False), (Decimal("NaN"), 1, False),
    (5, 0, False), (True, 1, False),
])
def test_is_multiple_is_exact(value, factor, expected):
    assert rc.is_multiple(value, factor) is expected


def test_is_multiple_is_linear_in_the_digits():
    started = time.perf_counter()
    assert rc.is_multiple(Decimal("7" * 1_000_000 + ".35"), Decimal("0.05"))
    assert not rc.is_multiple(Decimal("7" * 1_000_000 + ".35"), Decimal("0.1"))
    assert time.perf_counter() - started < 5  # ~0.1 s here; int() on these digits takes minutes


def test_integers_and_the_other_numeric_keywords_on_decimals():
    integer = {"type": "integer"}
    for text in ("1", "1.0", "1e2", "-3", "9" * 5000):
        assert rc.check(text, integer) is None, text
    assert rc.check("1.5", integer).kind == rc.SCHEMA_MISMATCH
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#", "type": "integer"}
    assert rc.check("1", draft4) is None and rc.check("9" * 5000, draft4) is None
    assert rc.check("1.0", draft4) is not None  # draft 4 has no integral floats (jsonschema's own reading)
    # Schema numbers are read the same way, so 1.1 meets 1.1 (a float 1.1 would not equal Decimal 1.1).
    exact = {"minimum": 1.1, "maximum": 1.1, "enum": [1.1, 2], "const": 1.1}
    assert rc.check("1.1", exact) is None and rc.check("1.10", exact) is None
    assert rc.check("1.2", {"exclusiveMaximum": 1.2}).kind == rc.SCHEMA_MISMATCH
    assert rc.check("2", {"enum": [2.0]}) is None and rc.check("[1, 1.0]", {"uniqueItems": True}) is not None
    draft3 = {"$schema": "http://json-schema.org/draft-03/schema#", "divisibleBy": 0.5}
    assert rc.check("7", draft3) is None and rc.check("7.25", draft3).kind == rc.SCHEMA_MISMATCH


def test_messages_read_as_the_json_text():
    assert str(rc.check('{"price": 37.3', PRICE)).startswith("not JSON: Expecting")
    assert rc.check("hello", None).kind == rc.NOT_JSON
    below = str(rc.check('{"n": 1.5}', {"properties": {"n": {"minimum": 2.5}}}))
    assert below == "at n: 1.5 is less than the minimum of 2.5", below
    assert str(rc.check('{"n": "x"}', {"type": "integer"})).startswith("at (root): ")
    assert rc.check("[1, 2]", {}) is None and rc.check("[1, 2]", None) is None


def test_an_unusable_schema_checks_json_only():
    assert rc.check('{"n": 1}', {"type": 12}) is None
    assert rc.check('{"n": 1', {"type": 12}).kind == rc.NOT_JSON


def test_validators_are_compiled_once_per_schema_and_bounded():
    cache = rc._Validators(kept=4)
    first = cache.get(PRICE)
    assert cache.get(dict(reversed(list(PRICE.items())))) is first  # the same schema, keys in another order
    for i in range(10):
        cache.get({"maximum": i})
    assert len(cache) == 4
    assert cache.get(PRICE) is not first  # dropped as least recently used, compiled again
    assert len(rc._validators) <= rc.VALIDATORS_KEPT
