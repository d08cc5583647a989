"""prompt_copy: a value the reply writes is found in the prompt by its text, and what follows it
there is proposed."""

import pytest

from gpustack_dspark.worker.drafting.prompt_copy import (ESTIMATE, KEY, SCALAR, SHARE, STRING, PromptCopy,
                                                         PromptText, ValueCursor, ValueEnds, mixed, word_key)

EXAMPLE = '<|im_start|>user\nBen Kim from Leeds ordered 2 mugs.<|im_end|>\n<|im_start|>assistant\n' \
          '{"customer":"Ben Kim","city":"Leeds","quantity":2}<|im_end|>\n'
USER = '<|im_start|>user\nAnna Berg from Oslo ordered 3 desk lamps at 24.50 each, 7 Lake Road, Oslo.<|im_end|>\n' \
       '<|im_start|>assistant\n'
PROMPT = EXAMPLE + USER


def cursor_after(text: str) -> ValueCursor:
    cursor = ValueCursor()
    cursor.feed(text)
    return cursor


@pytest.mark.parametrize("reply, prefix", [
    ('{"customer":"Ann', "Ann"),
    ('{"customer":"Anna Berg","city":', None),
    ('{"customer":"Anna Berg","quantity":3', "3"),
    ('{"price": 24.5', "24.5"),
    ('{"ok": tr', "tr"),
    ('{"note":"say \\"hi', 'say \\"hi'),
    ('{"a":[1,', None),
    ('{"customer":"', ""),
])
def test_the_cursor_knows_the_scalar_being_written(reply, prefix):
    assert cursor_after(reply).prefix() == prefix


def test_a_moved_copy_reads_ahead_without_moving_the_cursor():
    cursor = cursor_after('{"customer":"An')
    assert cursor.moved("na Berg").prefix() == "Anna Berg"
    assert cursor.moved('na","city":"O').prefix() == "O"
    assert cursor.prefix() == "An"


def test_a_long_value_keeps_its_tail():
    cursor = ValueCursor(keep=8)
    cursor.feed('{"text":"' + "word " * 10)
    assert cursor.prefix() == "rd word "[-8:]


def test_the_users_text_comes_after_the_worked_example():
    text = PromptText(PROMPT)
    assert text.continuation("Anna") == " Berg from Oslo ordered 3 desk lamps at 24.50 ea"
    assert text.continuation("Anna Berg") == " from Oslo ordered 3 desk lamps at 24.50 each, 7"
    # "Ben Kim" is in the example only, last in its reply: copied from there, up to the marker.
    assert text.continuation("Ben Kim") == '","city":"Leeds","quantity":2}'
    # The last place wins: "Oslo" ends the user's text.
    assert text.continuation("Os") == "lo."
    assert text.continuation("24") == ".50 each, 7 Lake Road, Oslo."


@pytest.mark.parametrize("prefix", ["A", "", None, "nna", "Zed", "erg"])
def test_too_short_absent_or_inside_a_word_is_no_copy(prefix):
    assert PromptText(PROMPT).continuation(prefix) is None


def test_a_reworded_value_is_copied_from_its_last_word_found():
    text = PromptText(PROMPT)
    assert text.continuation("Lake Rd, Os") == "lo."
    assert text.continuation("The desk") == " lamps at 24.50 each, 7 Lake Road, Oslo."


def test_the_continuation_stops_at_a_line_break_or_a_template_marker():
    text = PromptText("Name: Rosa Costa\nCity: Turin<|im_end|>")
    assert text.continuation("Rosa") == " Costa"
    assert text.continuation("Tu") == "rin"
    assert PromptText("Rosa\nnext").continuation("Rosa") == ""  # found, at the line's end


def chars(text):
    return [ord(c) for c in text]


def pairs(texts):
    return [(100 + i, text) for i, text in enumerate(texts)]


def test_the_copier_follows_the_reply_and_the_draft():
    copy = PromptCopy(PROMPT)
    copy.feed(pairs(['{"', "customer", '":"', "Anna"]))
    assert copy.fed == 4
    assert copy.proposal([], chars) == (ord(" "), ESTIMATE)
    # A draft that went on with " Berg": the copy goes on after it.
    assert copy.proposal([" Berg"], chars) == (ord(" "), ESTIMATE)
    assert copy.proposal([" Berg", '","', "city", '":"', "O"], chars) is None  # one character
    assert copy.proposal([" Berg", '","', "city", '":"', "Os"], chars) == (ord("l"), ESTIMATE)
    copy.feed(pairs(['"}']))
    assert copy.proposal([], chars) is None  # between values


def test_a_sampled_proposal_puts_its_share_on_the_copied_token():
    weights, estimate = mixed((7, ESTIMATE), ({7: 0.5, 9: 0.5}, 0.4))
    assert weights == pytest.approx({7: SHARE + (1 - SHARE) * 0.5, 9: (1 - SHARE) * 0.5})
    assert sum(weights.values()) == pytest.approx(1.0) and estimate == ESTIMATE
    assert mixed((7, ESTIMATE), None) == ({7: 1.0}, ESTIMATE)
    counted = ({9: 1.0}, 0.9)
    assert mixed(None, counted) is counted
    assert mixed(None, None) is None


@pytest.mark.parametrize("reply, kind", [
    ('{"cust', KEY), ('{"customer":"An', STRING), ('{"a":1,"b', KEY), ('{"a":["x","y', STRING),
    ('[{"k":[1,2]},{"z', KEY), ('{"n": 12', SCALAR),
])
def test_the_cursor_tells_a_key_from_a_value(reply, kind):
    assert cursor_after(reply).kind() == kind


def test_feeding_reports_the_value_each_token_closed():
    cursor = ValueCursor()
    closed = []
    for text in ['{"', "customer", '":"', "Anna", " Berg", '","', "quantity", '":', "3", ',"']:
        cursor.feed(text)
        closed.append(cursor.closed)
    assert [c for c in closed if c] == [(KEY, "customer"), (STRING, "Anna Berg"), (KEY, "quantity"), (SCALAR, "3")]


@pytest.mark.parametrize("rest, word", [(" from Oslo", "from"), (", 7 Lake", ","), ("s at", "s"), ("", ""),
                                        ("  Each day", "each"), (".50", ".")])
def test_a_word_key_is_the_first_word_or_mark(rest, word):
    assert word_key(rest) == word


def test_where_copied_values_end_is_learned_from_the_replies_and_the_closer_proposed():
    ends = ValueEnds()
    prompts = ["Anna Berg from Oslo ordered 3 lamps.", "Ben Kim from Leeds ordered 5 mugs.",
               "Carla Rossi from Lyon ordered 2 desks."]
    for n, prompt in enumerate(prompts):
        copy = PromptCopy(prompt, ends)
        name, city, qty = prompt.split(" from ")[0], prompt.split()[3], prompt.split()[5]
        copy.feed([(1, '{"'), (2, "customer"), (3, '":"'), (4, name), (5, '","'), (6, "city"), (3, '":"'),
                   (7, city), (5, '","'), (8, "quantity"), (9, '":'), (10, qty), (11, "}")])
        if n == 0:  # one sighting is not enough to close a value
            fresh = PromptCopy("Dora Lee from Rome ordered 4 cups.", ends)
            fresh.feed([(1, '{"'), (2, "customer"), (3, '":"'), (4, "Dora Lee")])
            assert fresh.proposal([], chars) == (ord(" "), ESTIMATE)
    assert ends.ended["from"] == 3 and ends.ended["ordered"] == 3
    assert ends.closers[STRING] == {5: 6} and ends.closers[SCALAR] == {11: 3}
    assert KEY not in ends.closers  # keys teach nothing
    copy = PromptCopy("Dora Lee from Rome ordered 4 cups.", ends)
    copy.feed([(1, '{"'), (2, "customer"), (3, '":"'), (4, "Dora")])
    assert copy.proposal([], chars) == (ord(" "), ESTIMATE)  # " Lee": a name's word goes on
    token, estimate = copy.proposal([" Lee"], chars)  # before " from": the value's end
    assert token == 5 and estimate == pytest.approx(3 / 4)
    # A word that continued values as often as it ended them does not close one.
    ends.continued["from"] = 3
    assert copy.proposal([" Lee"], chars) == (ord(" "), ESTIMATE)


def test_a_value_is_found_at_or_after_where_the_last_one_ended():
    text = PromptText("Oslo office. Anna Berg from Oslo, Anna Berg again")
    first = text.locate("Oslo")
    assert first == text.text.rindex("Oslo")  # no position yet: the last place
    assert text.locate("Oslo", after=0) == 0
    assert text.locate("Anna Berg", after=20) == text.text.rindex("Anna Berg")
    assert text.continuation("Anna", after=0) == " Berg from Oslo, Anna Berg again"


def test_the_next_word_passes_over_marks_and_words_that_end_values():
    text = PromptText("Anna Berg from Oslo, ordered 3 lamps.\nNext line")
    end = len("Anna Berg")
    assert text.next_word(end, lambda w: w == "from") == text.text.index("Oslo")
    assert text.next_word(end + len(" from Oslo"), lambda w: w == "ordered") == text.text.index("3")
    assert text.next_word(text.text.index("lamps") + 5, lambda w: False) is None  # the line ends


@pytest.mark.parametrize("reply, start", [
    ('{"customer":"', True), ('{"customer":"A', False), ('{"qty":', True), ('{"qty":3', False),
    ('{"a":[', True), ('{"a":[1,', True), ('{"a":1,', False), ('{"', False), ('{"a":1}', False),
])
def test_the_cursor_knows_where_a_value_starts(reply, start):
    assert cursor_after(reply).value_start() is start


def test_the_next_value_is_drafted_from_the_word_after_the_last_one_once_that_was_learned():
    ends = ValueEnds()
    for prompt in ["Anna Berg from Oslo ordered 3 lamps.", "Ben Kim from Leeds ordered 5 mugs.",
                   "Carla Rossi from Lyon ordered 2 desks."]:
        name, city, qty = prompt.split(" from ")[0], prompt.split()[3], prompt.split()[5]
        PromptCopy(prompt, ends).feed([(1, '{"'), (2, "customer"), (3, '":"'), (4, name), (5, '","'), (6, "city"),
                                       (3, '":"'), (7, city), (5, '","'), (8, "quantity"), (9, '":'), (10, qty),
                                       (11, "}")])
    # Starts were tried for city and quantity of each reply; right once "from" and "ordered"
    # had ended two values each (from the second reply on).
    assert (ends.starts_tried, ends.starts_right) == (6, 4)
    copy = PromptCopy("Dora Lee from Rome ordered 4 cups.", ends)
    copy.feed([(1, '{"'), (2, "customer"), (3, '":"')])
    assert copy.proposal([], chars) is None  # the first value: no last one to go on from
    copy.feed([(4, "Dora Lee"), (5, '","'), (6, "city"), (3, '":"')])
    assert copy.proposal([], chars) == (ord("R"), ends.start_estimate())
    assert copy.proposal(["Rome", '","', "quantity", '":'], chars) == (ord("4"), ends.start_estimate())
    assert ends.start_estimate() == pytest.approx(5 / 8)
