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
  string's characters after its opening quote (keys included: the grammar forces those first),
  or a bare number or literal's characters; None between values. `kind()` tells a key's string
  from a value's (it follows the objects and arrays it is in). `after(text)` is the prefix
  once `text` follows, without moving the cursor (a draft's tokens are not the reply yet).
- `PromptText.continuation(prefix)`: the text that follows the longest tail of `prefix` found in
  the prompt, where that tail starts the prefix or one of its words and, in the prompt, a word
  (the character before it is no letter or digit); the last such place in the prompt (the
  user's latest text comes after any worked example). At most `limit` characters, never across
  a line break or into a chat template's marker (`<|`). None when no tail of at least
  `min_chars` characters is found.
  "" when the tail ends the prompt's line.
- Where a copied value ends is learned (`ValueEnds`, one per replica): each value the reply
  closes that is found in the prompt counts the word after it there as *ending* a value, and
  each word inside it as *continuing* one; the token that closed it is counted per kind (string,
  scalar). Where the text after the value so far starts with a word that ended values more
  often than it continued them (at least `MIN_ENDS` times), the closing token most often seen
  is proposed instead of the copy, so the draft runs on through the grammar-forced next key
  rather than stopping at the value's end.
- `PromptCopy` holds both for one request: `feed(pairs)` takes the reply's new (token, text)
  pairs, `proposal(draft_texts, encode)` the next token and its estimate, or None. Nothing here
  decides whether a token is drafted: the grammar and the draft policy do.
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
                self.in_scalar = True
                self.value += ch
                continue
            if self.in_scalar:
                self.closed = (SCALAR, self.value)
            self.in_scalar, self.value = False, ""
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
                self.expect_key = bool(self.stack) and self.stack[-1] == "{"
            elif ch == ":":
                self.expect_key = False
        if len(self.value) > self.keep:
            self.value = self.value[-self.keep:]

    def prefix(self) -> Optional[str]:
        return self.value if (self.in_string or self.in_scalar) else None

    def kind(self) -> str:
        return (KEY if self.in_key else STRING) if self.in_string else SCALAR

    def moved(self, text: str) -> "ValueCursor":
        """A copy of this cursor after `text` (this one stays where it is)."""
        moved = dataclasses.replace(self, stack=list(self.stack))
        if text:
            moved.feed(text)
        return moved

    def after(self, text: str) -> Optional[str]:
        return self.moved(text).prefix()


class PromptText:
    def __init__(self, text: str, min_chars: int = MIN_CHARS, limit: int = LIMIT) -> None:
        self.text, self.min_chars, self.limit = text, min_chars, limit

    def continuation(self, prefix: Optional[str]) -> Optional[str]:
        if not prefix or len(prefix) < self.min_chars:
            return None
        for start in _word_starts(prefix):
            tail = prefix[start:]
            if len(tail) < self.min_chars:
                return None
            found = self.last_word_match(tail)
            if found is not None:
                rest = self.text[found + len(tail):found + len(tail) + self.limit]
                for stop in _STOPS:
                    cut = rest.find(stop)
                    if cut >= 0:
                        rest = rest[:cut]
                return rest
        return None

    def last_word_match(self, tail: str) -> Optional[int]:
        end = len(self.text)
        while True:
            at = self.text.rfind(tail, 0, end)
            if at < 0:
                return None
            if at == 0 or not self.text[at - 1].isalnum():
                return at
            end = at + len(tail) - 1


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
    """Which words end a copied value, and which tokens close one (one per replica)."""

    ended: Dict[str, int] = dataclasses.field(default_factory=dict)
    continued: Dict[str, int] = dataclasses.field(default_factory=dict)
    closers: Dict[str, Dict[int, int]] = dataclasses.field(default_factory=dict)

    def observe(self, prompt: PromptText, kind: str, value: str, token: int) -> None:
        """The reply closed a value of `kind` with `token` (a key teaches nothing here)."""
        if kind == KEY:
            return
        counts = self.closers.setdefault(kind, {})
        counts[token] = counts.get(token, 0) + 1
        if not value or prompt.last_word_match(value) is None:
            return  # not copied from the prompt: nothing to learn about where copies end
        _count(self.ended, word_key(prompt.continuation(value) or ""))
        for i in range(1, len(value)):
            if value[i - 1].isalnum() and not value[i].isalnum():
                _count(self.continued, word_key(value[i:]))

    def closing(self, kind: str, rest: str) -> Optional[Tuple[int, float]]:
        """The token to close a value of `kind` before `rest`, and its estimate; None where the
        word `rest` starts with has not ended values more often than it continued them."""
        word = word_key(rest)
        ended, continued = self.ended.get(word, 0), self.continued.get(word, 0)
        counts = self.closers.get(kind)
        if ended < MIN_ENDS or ended <= continued or not counts:
            return None
        token = max(counts.items(), key=lambda kv: (kv[1], -kv[0]))[0]
        return token, ended / (ended + continued + 1)


def _count(counts: Dict[str, int], word: str) -> None:
    if word in counts or len(counts) < WORDS:
        counts[word] = counts.get(word, 0) + 1


class PromptCopy:
    """One request's text copier: the prompt's text and the reply's JSON cursor."""

    def __init__(self, prompt_text: str, ends: Optional[ValueEnds] = None) -> None:
        self.prompt = PromptText(prompt_text)
        self.cursor = ValueCursor()
        self.ends = ends
        self.fed = 0  # reply tokens fed so far

    def feed(self, pairs: Sequence[Tuple[int, str]]) -> None:
        for token, text in pairs:
            self.cursor.feed(text)
            if self.cursor.closed is not None and self.ends is not None:
                self.ends.observe(self.prompt, *self.cursor.closed, token)
        self.fed += len(pairs)

    def proposal(self, draft_texts: Sequence[str],
                 encode: Callable[[str], Sequence[int]]) -> Optional[Tuple[int, float]]:
        cursor = self.cursor.moved("".join(draft_texts))
        rest = self.prompt.continuation(cursor.prefix())
        if rest is None:
            return None
        if self.ends is not None:
            closing = self.ends.closing(cursor.kind(), rest)
            if closing is not None:
                return closing
        tokens = encode(rest) if rest else ()
        return (tokens[0], ESTIMATE) if tokens else None


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
