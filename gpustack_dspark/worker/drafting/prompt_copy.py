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
  or a bare number or literal's characters; None between values. `after(text)` is the prefix
  once `text` follows, without moving the cursor (a draft's tokens are not the reply yet).
- `PromptText.continuation(prefix)`: the text that follows the longest tail of `prefix` found in
  the prompt, where that tail starts the prefix or one of its words and, in the prompt, a word
  (the character before it is no letter or digit); the last such place in the prompt (the
  user's latest text comes after any worked example). At most `limit` characters, never across
  a line break or into a chat template's marker (`<|`). None when no tail of at least
  `min_chars` characters is found.
- `PromptCopy` holds both for one request: `feed(texts)` takes the reply's new token texts,
  `proposal(draft_texts, encode)` the next token and the estimate it carries (`ESTIMATE`), or
  None. Nothing here decides whether a token is drafted: the grammar and the draft policy do.
"""

import dataclasses
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence, Tuple

# A copied token's estimate: drafts are cut and the speculation budget ranks by it, and the
# budget's acceptance model corrects it by what was kept (it is no frequency: one sighting).
ESTIMATE = 0.75
# At temperature > 0, the share of a sampled draft token's proposal on the copied token.
SHARE = 0.8
MIN_CHARS = 2
LIMIT = 48
_SCALAR = frozenset("0123456789+-.eEtrufalsn")
_STOPS = ("\n", "<|")


@dataclass
class ValueCursor:
    in_string: bool = False
    escaped: bool = False
    in_scalar: bool = False
    value: str = ""
    keep: int = 96  # the prefix's last characters kept: a longer one is looked up by its tail

    def feed(self, text: str) -> None:
        for ch in text:
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string, self.value = False, ""
                    continue
                self.value += ch
            elif ch == '"':
                self.in_string, self.in_scalar, self.value = True, False, ""
            elif ch in _SCALAR:
                self.in_scalar = True
                self.value += ch
            else:
                self.in_scalar, self.value = False, ""
        if len(self.value) > self.keep:
            self.value = self.value[-self.keep:]

    def prefix(self) -> Optional[str]:
        return self.value if (self.in_string or self.in_scalar) else None

    def after(self, text: str) -> Optional[str]:
        if not text:
            return self.prefix()
        moved = dataclasses.replace(self)
        moved.feed(text)
        return moved.prefix()


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
            found = self._last_word_match(tail)
            if found is not None:
                rest = self.text[found + len(tail):found + len(tail) + self.limit]
                for stop in _STOPS:
                    cut = rest.find(stop)
                    if cut >= 0:
                        rest = rest[:cut]
                return rest or None
        return None

    def _last_word_match(self, tail: str) -> Optional[int]:
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


class PromptCopy:
    """One request's text copier: the prompt's text and the reply's JSON cursor."""

    def __init__(self, prompt_text: str) -> None:
        self.prompt = PromptText(prompt_text)
        self.cursor = ValueCursor()
        self.fed = 0  # reply tokens fed so far

    def feed(self, texts: Sequence[str]) -> None:
        self.cursor.feed("".join(texts))
        self.fed += len(texts)

    def proposal(self, draft_texts: Sequence[str],
                 encode: Callable[[str], Sequence[int]]) -> Optional[Tuple[int, float]]:
        rest = self.prompt.continuation(self.cursor.after("".join(draft_texts)))
        if not rest:
            return None
        tokens = encode(rest)
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
