"""prompt_copy: a value the reply writes is found in the prompt by its text, and what follows it
there is proposed."""

import pytest

from gpustack_dspark.worker.drafting.prompt_copy import (ESTIMATE, SHARE, PromptCopy, PromptText, ValueCursor,
                                                         mixed)

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


def test_after_reads_ahead_without_moving_the_cursor():
    cursor = cursor_after('{"customer":"An')
    assert cursor.after("na Berg") == "Anna Berg"
    assert cursor.after('na","city":"O') == "O"
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
    assert PromptText("Rosa\nnext").continuation("Rosa") is None


def chars(text):
    return [ord(c) for c in text]


def test_the_copier_follows_the_reply_and_the_draft():
    copy = PromptCopy(PROMPT)
    copy.feed(['{"', "customer", '":"', "Anna"])
    assert copy.fed == 4
    assert copy.proposal([], chars) == (ord(" "), ESTIMATE)
    # A draft that went on with " Berg": the copy goes on after it.
    assert copy.proposal([" Berg"], chars) == (ord(" "), ESTIMATE)
    assert copy.proposal([" Berg", '","', "city", '":"', "O"], chars) is None  # one character
    assert copy.proposal([" Berg", '","', "city", '":"', "Os"], chars) == (ord("l"), ESTIMATE)
    copy.feed(['"}'])
    assert copy.proposal([], chars) is None  # between values


def test_a_sampled_proposal_puts_its_share_on_the_copied_token():
    weights, estimate = mixed((7, ESTIMATE), ({7: 0.5, 9: 0.5}, 0.4))
    assert weights == pytest.approx({7: SHARE + (1 - SHARE) * 0.5, 9: (1 - SHARE) * 0.5})
    assert sum(weights.values()) == pytest.approx(1.0) and estimate == ESTIMATE
    assert mixed((7, ESTIMATE), None) == ({7: 1.0}, ESTIMATE)
    counted = ({9: 1.0}, 0.9)
    assert mixed(None, counted) is counted
    assert mixed(None, None) is None
