"""bench.extraction: seeded extraction tasks with a known truth, their bodies, and the scores."""

import json
import math
import os
import re
import subprocess
import sys

import jsonschema
import pytest

from gpustack_dspark.bench import extraction as x
from gpustack_dspark.worker.schema_check import structural_problem, xgrammar_unsupported

SEEDS = range(200)


def _leaves(value, path=""):
    if isinstance(value, dict):
        for key, sub in value.items():
            yield from _leaves(sub, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for i, sub in enumerate(value):
            yield from _leaves(sub, f"{path}[{i}]")
    else:
        yield path, value


def _stated(text, literal):
    return re.search(r"(?<![\w.\-])" + re.escape(literal) + r"(?!\w|[.\-:]\d)", text) is not None


def _user(t):
    return t.messages[-1]["content"]


def _first(family, check):
    return next(t for t in (x.task(family, s) for s in range(1000)) if check(t))


@pytest.mark.parametrize("family", x.FAMILIES)
def test_every_truth_follows_its_schema_and_every_leaf_is_stated(family):
    validator = jsonschema.Draft202012Validator(x.task(family, 0).schema)
    for seed in SEEDS:
        t = x.task(family, seed)
        assert t.family == family and t.seed == seed
        validator.validate(t.truth)
        text = _user(t)
        for path, value in _leaves(t.truth):
            if isinstance(value, bool):
                yes, no = x.BOOL_PHRASES[(family, path)]
                said = yes if value else no
                unsaid = no if value else yes
                assert any(p in text for p in said) and not any(p in text for p in unsaid), (path, text)
            elif isinstance(value, str):
                assert _stated(text, value), (path, value, text)
            else:
                assert _stated(text, json.dumps(value)), (path, value, text)  # "19.99", never "19.9"


def test_the_boolean_phrases_never_contain_one_another():
    for yes, no in x.BOOL_PHRASES.values():
        for a in yes:
            for b in no:
                assert a not in b and b not in a


@pytest.mark.parametrize("family", x.FAMILIES)
def test_the_schemas_are_bounded_and_compile_for_the_engines(family):
    schema = x.task(family, 0).schema
    assert structural_problem(schema) is None and xgrammar_unsupported(schema) is None

    def walk(node):
        if node.get("type") == "object":
            assert node["additionalProperties"] is False and node["required"] == list(node["properties"])
            for sub in node["properties"].values():
                walk(sub)
        elif node.get("type") == "array":
            assert 1 <= node["minItems"] <= node["maxItems"] <= 4
            walk(node["items"])
        elif node.get("type") == "string":
            assert "enum" in node or "maxLength" in node or node["pattern"].endswith("$")
    walk(schema)


def test_the_families_cover_nesting_enums_booleans_numbers_and_dates():
    schemas = json.dumps([x.task(f, 0).schema for f in x.FAMILIES])
    for keyword in ('"enum"', '"boolean"', '"integer"', '"number"', '"maxItems"', r'"^\\d{4}-\\d{2}-\\d{2}$"'):
        assert keyword in schemas, keyword
    assert x.task("contact", 0).schema["properties"]["address"]["type"] == "object"
    assert x.task("order", 0).schema["properties"]["items"]["maxItems"] == 3
    assert x.task("event", 0).schema["properties"]["attendees"]["maxItems"] == 4


@pytest.mark.parametrize("family", x.FAMILIES)
def test_the_prompt_is_short_with_one_example_from_another_seed(family):
    layouts = set()
    validator = jsonschema.Draft202012Validator(x.task(family, 0).schema)
    for seed in SEEDS:
        t = x.task(family, seed)
        system, example_text, example_json, user = t.messages
        assert [m["role"] for m in t.messages] == ["system", "user", "assistant", "user"]
        assert system["content"] == (f"Extract the {family} from the user's text as JSON. "
                                     "Use only values stated in the text.")
        example = example_json["content"]
        assert json.loads(example) != t.truth and user["content"] != example_text["content"]
        validator.validate(json.loads(example))
        assert len(" ".join(m["content"] for m in t.messages).split()) < 350
        assert 1 <= user["content"].count(". ") + 1 <= 6
        assert t.max_tokens >= len(json.dumps(t.truth)) + 32
        layouts.add(" ".join(re.sub(r"[^A-Za-z ]", "", user["content"]).split()[:2]))
    assert len(layouts) >= 3  # several sentence templates per family


def test_tasks_are_deterministic_in_any_process_and_rebuilt_from_their_seed():
    first = x.tasks(3, 12)
    assert first == x.tasks(3, 12) and x.tasks(3, 5) == first[:5]
    assert [t.family for t in first] == list(x.FAMILIES) * 2
    assert all(x.task(t.family, t.seed) == t for t in first)
    code = ("import json; from gpustack_dspark.bench import extraction as x; "
            "print(json.dumps([[t.seed, t.messages, t.truth] for t in x.tasks(3, 12)]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert json.loads(out) == [[t.seed, t.messages, t.truth] for t in first]


def test_no_two_user_texts_are_equal_across_rounds_and_seeds():
    texts = [_user(t) for seed in range(5) for t in x.tasks(seed, 120)]
    assert len(set(texts)) == len(texts) == 600
    seeds = [t.seed for seed in range(5) for t in x.tasks(seed, 120)]
    assert len(set(seeds)) == len(seeds)


def test_a_repeated_text_is_written_again_from_another_seed(monkeypatch):
    real = x.task
    repeat = x._derive(1, 1)
    monkeypatch.setattr(x, "task", lambda family, seed, example: real(family, x._derive(1, 0) if seed == repeat else seed,
                                                                      example))
    got = x.tasks(1, 2, families=("order",))
    assert _user(got[0]) != _user(got[1]) and got[1].seed == x._derive(1, 1, 1)


def test_a_per_family_example_is_shared_by_the_familys_tasks_whose_texts_stay_new():
    shared = x.tasks(5, 24, example="per-family")
    fresh = x.tasks(5, 24)
    assert [_user(t) for t in shared] == [_user(t) for t in fresh]  # the same texts and truths
    assert [t.truth for t in shared] == [t.truth for t in fresh]
    for family in x.FAMILIES:
        prompts = {json.dumps(t.messages[:3]) for t in shared if t.family == family}
        assert len(prompts) == 1  # system message and worked example: one prefix per family
        assert len({json.dumps(t.messages[:3]) for t in fresh if t.family == family}) == 4
    assert len({json.dumps(t.messages[:3]) for t in shared}) == len(x.FAMILIES)
    assert x.TaskStream(5, example="per-family")[23] == shared[23]
    # The one task written from the family example's own seed gets the next example.
    own = x.task("order", x._derive("example", "order", 0), example="per-family")
    assert own.messages[1]["content"] == x._written("order", x._derive("example", "order", 1))[1]
    assert shared[0].messages[1]["content"] == _user(own) != own.messages[1]["content"]
    with pytest.raises(ValueError, match=r"example 'shared' is unknown \(allowed: per-request, per-family\)"):
        x.tasks(5, 3, example="shared")


def test_money_is_written_with_two_decimals():
    for family, key in (("order", "unit_price"), ("invoice", "amount"), ("invoice", "total"), ("product", "price")):
        for seed in SEEDS:
            for path, value in _leaves(x.task(family, seed).truth):
                if path.endswith(key):
                    assert json.dumps(value) == f"{value:.2f}", (family, path, value)


def test_tasks_takes_the_families_given_in_turn():
    got = x.tasks(9, 5, families=("ticket", "event"))
    assert [t.family for t in got] == ["ticket", "event", "ticket", "event", "ticket"]
    assert x.tasks(9, 0) == []


@pytest.mark.parametrize("call", [lambda: x.task("recipe", 1), lambda: x.tasks(1, 3, ["order", "recipe"]),
                                  lambda: x.tasks(1, 3, "recipe")])
def test_an_unknown_family_is_named_with_the_allowed_ones(call):
    with pytest.raises(ValueError, match=r"'recipe'.*allowed: order, invoice, contact, ticket, event, product"):
        call()


def test_bad_numbers_are_refused():
    with pytest.raises(ValueError, match="count -1"):
        x.tasks(1, -1)
    with pytest.raises(ValueError, match="seed '1'"):
        x.task("order", "1")
    with pytest.raises(ValueError, match="failed -2"):
        x.summarize([], failed=-2)


def test_body_is_a_json_schema_chat_request():
    t = x.task("invoice", 4)
    b = x.body(t, "smol")
    assert b == {"model": "smol", "messages": t.messages, "max_tokens": t.max_tokens, "temperature": 0.0,
                 "response_format": {"type": "json_schema",
                                     "json_schema": {"name": "invoice", "schema": t.schema}}}
    assert "top_p" not in b and "seed" not in b
    sampled = x.body(t, "smol", temperature=0.7, top_p=0.9, seed=0)
    assert (sampled["temperature"], sampled["top_p"], sampled["seed"]) == (0.7, 0.9, 0)
    b["messages"][0]["content"] = "changed"
    b["response_format"]["json_schema"]["schema"]["type"] = "array"
    assert t.messages[0]["content"] != "changed" and t.schema["type"] == "object"


def test_free_text_bodies_are_plain_distinct_and_seeded():
    bodies = x.free_text_bodies(5, 300, "smol", max_tokens=32, temperature=0.5)
    prompts = [b["messages"][0]["content"] for b in bodies]
    assert len(set(prompts)) == 300
    assert all(set(b) == {"model", "messages", "max_tokens", "temperature"} for b in bodies)
    assert all(b["max_tokens"] == 32 and b["temperature"] == 0.5 and len(b["messages"]) == 1 for b in bodies)
    assert x.free_text_bodies(5, 300, "smol", 32, 0.5) == bodies
    assert prompts[:20] != [b["messages"][0]["content"] for b in x.free_text_bodies(6, 20, "smol")]
    extraction_texts = {_user(t) for t in x.tasks(5, 60)}
    assert not extraction_texts & set(prompts)


# --- score ---------------------------------------------------------------------------------

def _reply(t, change=None):
    value = json.loads(json.dumps(t.truth))
    if change:
        change(value)
    return json.dumps(value)


def _leaf_count(t):
    return len(list(_leaves(t.truth)))


@pytest.mark.parametrize("family", x.FAMILIES)
def test_the_truth_scores_every_field(family):
    for seed in range(20):
        t = x.task(family, seed)
        s = x.score(t, _reply(t), "stop")
        assert s == x.Score(family, True, "stop", _leaf_count(t), _leaf_count(t), ())


def test_one_changed_leaf_costs_one_field_and_names_its_path():
    t = _first("order", lambda t: len(t.truth["items"]) >= 2)
    n = _leaf_count(t)

    def change(v):
        v["items"][1]["unit_price"] += 1
    s = x.score(t, _reply(t, change), "stop")
    assert (s.valid, s.right, s.total, s.wrong) == (True, n - 1, n, ("items[1].unit_price",))
    s = x.score(t, _reply(t, lambda v: v.update(city="Atlantis")), "length")
    assert (s.right, s.wrong, s.finish) == (n - 1, ("city",), "length")


def test_nested_and_missing_leaves_are_wrong_and_extra_elements_add_nothing():
    t = _first("contact", lambda t: True)
    n = _leaf_count(t)
    s = x.score(t, _reply(t, lambda v: v["address"].pop("postal_code")), "stop")
    assert (s.valid, s.right, s.wrong) == (False, n - 1, ("address.postal_code",))
    e = _first("event", lambda t: len(t.truth["attendees"]) == 3)
    n = _leaf_count(e)
    s = x.score(e, _reply(e, lambda v: v["attendees"].pop()), "stop")
    assert (s.right, s.total, s.wrong) == (n - 1, n, ("attendees[2]",))
    s = x.score(e, _reply(e, lambda v: v["attendees"].append("Extra Person")), "stop")
    assert (s.valid, s.right, s.total) == (True, n, n)
    o = _first("order", lambda t: len(t.truth["items"]) == 2)
    s = x.score(o, _reply(o, lambda v: v["items"].pop()), "stop")
    assert s.wrong == ("items[1].name", "items[1].quantity", "items[1].unit_price")


def test_an_unparseable_reply_is_invalid_with_nothing_right():
    t = x.task("ticket", 2)
    for content in ('{"customer": "Ann', "", "not json", None):
        s = x.score(t, content, "length")
        assert (s.valid, s.right, s.total, s.finish) == (False, 0, _leaf_count(t), "length")
        assert len(s.wrong) == s.total
    s = x.score(t, "[1, 2]", None)
    assert (s.valid, s.right, s.finish) == (False, 0, "")


def test_numbers_compare_numerically():
    t = _first("order", lambda t: True)
    n = _leaf_count(t)

    def as_float(v):
        v["items"][0]["quantity"] = float(v["items"][0]["quantity"])  # 3 and 3.0
        v["items"][0]["unit_price"] += 1e-9
    assert x.score(t, _reply(t, as_float), "stop").right == n
    assert x.score(t, _reply(t, lambda v: v["items"][0].update(unit_price=v["items"][0]["unit_price"] + 0.01)),
                   "stop").wrong == ("items[0].unit_price",)
    s = x.score(t, _reply(t, lambda v: v["items"][0].update(quantity=str(v["items"][0]["quantity"]))), "stop")
    assert (s.valid, s.wrong) == (False, ("items[0].quantity",))


def test_strings_ignore_case_and_surrounding_whitespace_but_enums_and_booleans_are_exact():
    t = _first("ticket", lambda t: t.truth["refund_requested"])
    n = _leaf_count(t)
    loud = " " + "  ".join(t.truth["customer"].upper().split()) + "\n"
    assert x.score(t, _reply(t, lambda v: v.update(customer=loud)), "stop").right == n
    assert x.score(t, _reply(t, lambda v: v.update(priority=v["priority"].title())), "stop").wrong == ("priority",)
    assert x.score(t, _reply(t, lambda v: v.update(refund_requested=1)), "stop").wrong == ("refund_requested",)
    assert x.score(t, _reply(t, lambda v: v.update(subject=v["subject"] + "s")), "stop").wrong == ("subject",)


# --- summaries -----------------------------------------------------------------------------

def test_summarize_counts_and_the_wilson_interval():
    scores = [x.Score("order", True, "stop", 10, 10, ()),
              x.Score("ticket", True, "length", 4, 6, ("priority", "subject")),
              x.Score("order", False, "", 0, 4, ("a", "b", "c", "d"))]
    s = x.summarize(scores, failed=1)
    assert (s.requests, s.valid, s.finished_stop, s.finished_length, s.failed) == (4, 2, 1, 1, 1)
    assert (s.fields_right, s.fields_total, s.accuracy) == (14, 20, 0.7)
    # Wilson, p = 0.7, n = 20, z = 1.96: centre (0.7 + 0.09604) / 1.19207 = 0.66777,
    # half 1.64416 * sqrt(0.0105 + 0.0024009) = 0.18675.
    assert s.accuracy_ci95 == pytest.approx((0.48102, 0.85452), abs=2e-5)
    assert s.per_family == {"order": (10, 14), "ticket": (4, 6)}
    assert x.summary_line(s) == ("valid 2/4, finished stop 1 / length 1, failed 1, "
                                 "fields right 14/20 (70.0%, 95% CI 48.1-85.5%)")


def test_format_errors_are_invalid_replies_not_cut_at_max_tokens_and_results_are_scored_by_their_index():
    scores = [x.Score("order", False, "stop", 0, 4, ()), x.Score("order", False, "length", 0, 4, ()),
              x.Score("order", True, "stop", 4, 4, ())]
    assert x.summarize(scores).format_errors == 1

    class Result:  # what load.Result carries
        def __init__(self, index, content, finish_reason):
            self.index, self.content, self.finish_reason = index, content, finish_reason

    tasks = x.tasks(3, 2)
    scored = x.score_results(tasks, [Result(1, json.dumps(tasks[1].truth), "stop"), Result(0, "{", "length")])
    assert [(s.family, s.valid, s.right == s.total, s.finish) for s in scored] == [
        (tasks[1].family, True, True, "stop"), (tasks[0].family, False, False, "length")]


def test_summary_line_of_the_worked_case_and_of_nothing():
    scores = [x.Score("order", True, "stop", 3, 3, ())] * 20 + [x.Score("event", True, "stop", 2, 3, ("date",))] * 4
    scores[0] = x.Score("order", True, "length", 3, 3, ())
    line = x.summary_line(x.summarize(scores))
    assert line == "valid 24/24, finished stop 23 / length 1, failed 0, fields right 68/72 (94.4%, 95% CI 86.6-97.8%)"
    empty = x.summarize([])
    assert math.isnan(empty.accuracy) and empty.accuracy_ci95 == (0.0, 1.0)
    assert x.summary_line(empty) == "valid 0/0, finished stop 0 / length 0, failed 0, fields right 0/0"


def test_a_reply_less_request_scored_as_error_counts_failed_with_its_fields_wrong():
    t = x.task("product", 1)
    s = x.summarize([x.score(t, "", "error")], failed=2)
    assert (s.requests, s.failed, s.valid, s.fields_right, s.fields_total) == (3, 3, 0, 0, _leaf_count(t))


def test_wilson_edges():
    assert x.wilson(0, 0) == (0.0, 1.0)
    low, high = x.wilson(10, 10)
    assert high == 1.0 and low == pytest.approx(0.72247, abs=1e-5)  # n / (n + z^2)
    low, high = x.wilson(0, 10)
    assert low == 0.0 and high == pytest.approx(1 - 0.72247, abs=1e-5)
