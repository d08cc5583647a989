"""Drafting a value copied from the prompt by its text, not its token ids. Pure.

Why: a value inside JSON is tokenized unlike the same words in a sentence. SmolLM2 writes
"Oslo" after `":"` as `Os` `lo` while the user's text has ` Oslo`, and "Anna" after a quote
as `Anna` while the text has ` Anna`. The n-gram indexes (ngram_index) key on token ids, so
the reply's context is never seen in the prompt and a copied value is drafted from its second
word at best. Here the value the reply is writing is looked up as text in the prompt, and the
text that follows it there is proposed, encoded as the model continues it: the value so far
ends at a token boundary, so the rest is encoded on its own.

Contract:
- `ValueCursor` follows the reply's JSON text. `prefix()` is the scalar being written: a
  string's characters after its opening quote, or a bare number or literal's characters; None
  between values. `kind()` tells a key's string from a value's (it follows the objects and
  arrays it is in); `value_start()` is true where the next value has not begun (an empty string
  value, or after `:`, `[`, or `,` in an array). `moved(text)` is a copy after `text` (a draft's
  tokens are not the reply yet); `closed` names the value the last `feed` closed.
- `PromptText.match(prefix, after)`: the longest tail of `prefix` found in the prompt, where the
  tail starts the prefix or one of its words and, in the prompt, a word (the character before it
  is no letter or digit); the first such place at or after `after` (where the reply's last
  copied value ended: extraction copies in the text's order), else the last (the user's latest
  text comes after any worked example). `continuation` is the text after it: at most `limit`
  characters, never across a line break or into a chat template's marker (`<|`); "" at the
  line's end; None when no tail of at least `min_chars` characters is found.
- `ValueEnds` (one per replica) learns from each value the reply closes that is found in the
  prompt: the word after it there *ended* a value, each word inside it *continued* one, the token
  that closed it is counted per kind (string, scalar), and whether it started at the first word
  after the last copied value that is no mark and no word that ends values (`start_estimate`).
  A word ends values once it ended them at least `MIN_ENDS` times and more often than it
  continued them.
- `PromptCopy` (one request): `feed(pairs)` takes the reply's new (token, text) pairs;
  `proposal(draft_texts, encode)` is the next token and its estimate, or None:
  - at a value's start, the first token of the text from the next such word (after the first
    value: before it there is no last one);
  - inside a value found in the prompt, the closing token most often seen where the text after
    it starts with a word that ends values (the draft runs on through the grammar-forced next
    key instead of stopping at the value's end), else the first token of the text after it.
  Nothing here decides whether a token is drafted: the grammar and the draft policy do.
"""

import dataclasses
from dataclasses import dataclass
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

# A copied token's estimate: drafts are cut and the speculation budget ranks by it, and the
# budget's acceptance model corrects it by what was kept (it is no frequency: one sighting).
ESTIMATE = 0.75
# At temperature > 0, the share of a sampled draft token's proposal on the copied token.
SHARE = 0.8
MIN_CHARS = 2
LIMIT = 48
_SCALAR = frozenset("0123456789+-.eEtrufalsn")
_STOPS = ("\n", "<|")
MIN_ENDS = 2
WORDS = 4096  # the most words ValueEnds counts (a new one past it is not counted)
STRING, SCALAR, KEY = "string", "scalar", "key"


@dataclass
class ValueCursor:
    in_string: bool = False
    escaped: bool = False
    in_scalar: bool = False
    in_key: bool = False  # the string is an object's key
    value: str = ""
    keep: int = 96  # the prefix's last characters kept: a longer one is looked up by its tail
    closed: Optional[Tuple[str, str]] = None  # (kind, value) of the last value `feed` closed
    stack: List[str] = dataclasses.field(default_factory=list)  # open "{" and "["
    expect_key: bool = False
    at_value: bool = False  # between values, where one starts next (after ":", "[", or "," in an array)

    def feed(self, text: str) -> None:
        self.closed = None
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.closed = (KEY if self.in_key else STRING, self.value)
                    self.in_string, self.value = False, ""
                    continue
                self.value += ch
                continue
            if ch in _SCALAR:
                self.in_scalar, self.at_value = True, False
                self.value += ch
                continue
            if self.in_scalar:
                self.closed = (SCALAR, self.value)
            self.in_scalar, self.value = False, ""
            if ch in " \t\n\r":
                continue
            in_array = bool(self.stack) and self.stack[-1] == "["
            self.at_value = (ch == ":") or (ch == "[") or (ch == "," and in_array)
            if ch == '"':
                self.in_string, self.in_key = True, self.expect_key
            elif ch in "{[":
                self.stack.append(ch)
                self.expect_key = ch == "{"
            elif ch in "}]":
                if self.stack:
                    self.stack.pop()
                self.expect_key = False
            elif ch == ",":
                self.expect_key = not in_array and bool(self.stack)
            elif ch == ":":
                self.expect_key = False
        if len(self.value) > self.keep:
            self.value = self.value[-self.keep:]

    def prefix(self) -> Optional[str]:
        return self.value if (self.in_string or self.in_scalar) else None

    def value_start(self) -> bool:
        """Nothing of the next value written yet: an empty string value, or just before a scalar."""
        if self.in_string:
            return not self.in_key and not self.value
        return self.at_value and not self.in_scalar

    def kind(self) -> str:
        return (KEY if self.in_key else STRING) if self.in_string else SCALAR

    def moved(self, text: str) -> "ValueCursor":
        """A copy of this cursor after `text` (this one stays where it is)."""
        moved = dataclasses.replace(self, stack=list(self.stack))
        if text:
            moved.feed(text)
        return moved


class PromptText:
    def __init__(self, text: str, min_chars: int = MIN_CHARS, limit: int = LIMIT) -> None:
        self.text, self.min_chars, self.limit = text, min_chars, limit

    def match(self, prefix: Optional[str], after: Optional[int] = None) -> Optional[Tuple[int, int]]:
        """(start, end) in the prompt of the longest tail of `prefix` found there (module
        docstring): the first place at or after `after`, else the last; None if none is."""
        if not prefix or len(prefix) < self.min_chars:
            return None
        for start in _word_starts(prefix):
            tail = prefix[start:]
            if len(tail) < self.min_chars:
                return None
            found = self.locate(tail, after)
            if found is not None:
                return found, found + len(tail)
        return None

    def continuation(self, prefix: Optional[str], after: Optional[int] = None) -> Optional[str]:
        found = self.match(prefix, after)
        return None if found is None else self.line_from(found[1])

    def line_from(self, at: int) -> str:
        """The prompt's text from `at`, at most `limit` characters, up to a line break or marker."""
        rest = self.text[at:at + self.limit]
        for stop in _STOPS:
            cut = rest.find(stop)
            if cut >= 0:
                rest = rest[:cut]
        return rest

    def locate(self, tail: str, after: Optional[int] = None) -> Optional[int]:
        """Where `tail` starts a word in the prompt: the first place at or after `after`, else
        the last place."""
        if after is not None:
            at = self.text.find(tail, after)
            while at >= 0:
                if at == 0 or not self.text[at - 1].isalnum():
                    return at
                at = self.text.find(tail, at + 1)
        end = len(self.text)
        while True:
            at = self.text.rfind(tail, 0, end)
            if at < 0:
                return None
            if at == 0 or not self.text[at - 1].isalnum():
                return at
            end = at + len(tail) - 1

    def next_word(self, at: int, skip: Callable[[str], bool], words: int = 8) -> Optional[int]:
        """Where the first word at or after `at` starts that `skip` does not pass over (marks
        are passed over too), within `words` words and the line; None past them."""
        text = self.text
        for _ in range(words):
            while at < len(text) and text[at] == " ":
                at += 1
            if at >= len(text) or any(text.startswith(stop, at) for stop in _STOPS):
                return None
            word = word_key(text[at:])
            if word.isalnum() and not skip(word):
                return at
            at += 1
            while at < len(text) and text[at].isalnum():
                at += 1
        return None


def _word_starts(text: str) -> Iterable[int]:
    """0 and every position after a character that is no letter or digit, in order."""
    yield 0
    for i in range(1, len(text)):
        if not text[i - 1].isalnum() and text[i].isalnum():
            yield i


def word_key(rest: str) -> str:
    """The word a text starts with, as ValueEnds counts it: its first run of letters or digits
    after any spaces, lowercased, or its first other character; "" for an empty text (a line's
    end)."""
    text = rest.lstrip(" ")
    if not text:
        return ""
    if not text[0].isalnum():
        return text[0]
    end = 1
    while end < len(text) and text[end].isalnum():
        end += 1
    return text[:end].lower()


@dataclass
class ValueEnds:
    """Where copied values end and the next one starts, learned from the replies (one per replica)."""

    ended: Dict[str, int] = dataclasses.field(default_factory=dict)
    continued: Dict[str, int] = dataclasses.field(default_factory=dict)
    closers: Dict[str, Dict[int, int]] = dataclasses.field(default_factory=dict)
    starts_tried: int = 0
    starts_right: int = 0

    def observe(self, prompt: PromptText, kind: str, value: str, token: int, at: Optional[int],
                predicted: Optional[int]) -> None:
        """The reply closed a value of `kind` with `token`; `at`: where the value starts a word in
        the prompt (None: not copied from it); `predicted`: where the next-word rule said the
        value would start (None: it said nothing)."""
        counts = self.closers.setdefault(kind, {})
        counts[token] = counts.get(token, 0) + 1
        if at is None:
            return  # not copied from the prompt: nothing to learn about where copies end
        _count(self.ended, word_key(prompt.line_from(at + len(value))))
        for i in range(1, len(value)):
            if value[i - 1].isalnum() and not value[i].isalnum():
                _count(self.continued, word_key(value[i:]))
        if predicted is not None:
            self.starts_tried += 1
            self.starts_right += int(predicted == at)

    def ends_values(self, word: str) -> bool:
        ended = self.ended.get(word, 0)
        return ended >= MIN_ENDS and ended > self.continued.get(word, 0)

    def closing(self, kind: str, rest: str) -> Optional[Tuple[int, float]]:
        """The token to close a value of `kind` before `rest`, and its estimate; None where the
        word `rest` starts with has not ended values more often than it continued them."""
        word = word_key(rest)
        counts = self.closers.get(kind)
        if not counts or not self.ends_values(word):
            return None
        ended, continued = self.ended[word], self.continued.get(word, 0)
        token = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]
        return token, ended / (ended + continued + 1)

    def start_estimate(self) -> float:
        """How often a value started at the next word after the last one (Laplace-smoothed)."""
        return (self.starts_right + 1) / (self.starts_tried + 2)


def _count(counts: Dict[str, int], word: str) -> None:
    if word in counts or len(counts) < WORDS:
        counts[word] = counts.get(word, 0) + 1


class PromptCopy:
    """One request's text copier: the prompt's text, the reply's JSON cursor, and where in the
    prompt the reply's last copied value ended."""

    def __init__(self, prompt_text: str, ends: Optional[ValueEnds] = None) -> None:
        self.prompt = PromptText(prompt_text)
        self.cursor = ValueCursor()
        self.ends = ends or ValueEnds()
        self.last_end: Optional[int] = None
        self.fed = 0  # reply tokens fed so far

    def feed(self, pairs: Sequence[Tuple[int, str]]) -> None:
        for token, text in pairs:
            self.cursor.feed(text)
            at = self._closed_at(self.cursor, self.last_end)
            if self.cursor.closed is not None and self.cursor.closed[0] != KEY:
                kind, value = self.cursor.closed
                self.ends.observe(self.prompt, kind, value, token, at, self._next_start(self.last_end))
            if at is not None:
                self.last_end = at + len(self.cursor.closed[1])
        self.fed += len(pairs)

    def _closed_at(self, cursor: ValueCursor, last_end: Optional[int]) -> Optional[int]:
        """Where the value (not a key) the cursor's last feed closed starts in the prompt, if it
        was copied from it."""
        closed = cursor.closed
        if closed is None or closed[0] == KEY or not closed[1]:
            return None
        return self.prompt.locate(closed[1], last_end)

    def _next_start(self, last_end: Optional[int]) -> Optional[int]:
        if last_end is None:
            return None
        return self.prompt.next_word(last_end, self.ends.ends_values)

    def _after(self, draft_texts: Sequence[str]) -> Tuple[ValueCursor, Optional[int]]:
        """The cursor and the last copied value's end once the draft's tokens are written."""
        cursor, last_end = self.cursor.moved(""), self.last_end
        for text in draft_texts:
            cursor.feed(text)
            at = self._closed_at(cursor, last_end)
            if at is not None:
                last_end = at + len(cursor.closed[1])
        return cursor, last_end

    def proposal(self, draft_texts: Sequence[str],
                 encode: Callable[[str], Sequence[int]]) -> Optional[Tuple[int, float]]:
        cursor, last_end = self._after(draft_texts)
        prefix = cursor.prefix()
        if cursor.value_start():
            start = self._next_start(last_end)
            if start is None:
                return None
            rest, estimate = self.prompt.line_from(start), self.ends.start_estimate()
        else:
            rest = self.prompt.continuation(prefix, last_end)
            if rest is None:
                return None
            closing = self.ends.closing(cursor.kind(), rest)
            if closing is not None:
                return closing
            estimate = ESTIMATE
        tokens = encode(rest) if rest else ()
        return (tokens[0], estimate) if tokens else None


def mixed(copied: Optional[Tuple[int, float]],
          counted: Optional[Tuple[dict, float]]) -> Optional[Tuple[dict, float]]:
    """A sampled draft token's proposal (draft_builder.Sampler): `SHARE` of the mass on the
    copied token, the rest on the counts' distribution; the estimate the larger of the two.
    Either alone when the other is None. Exactness does not depend on it: the token is
    verified against this very distribution."""
    if copied is None:
        return counted
    token, estimate = copied
    weights = {token: SHARE}
    if counted is None:
        return {token: 1.0}, estimate
    dist, counted_estimate = counted
    for other, weight in dist.items():
        weights[other] = weights.get(other, 0.0) + (1.0 - SHARE) * weight
    return weights, max(estimate, counted_estimate)
