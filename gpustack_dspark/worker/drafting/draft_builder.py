"""One request's draft: grammar-forced tokens first, statistical tokens fill the rest.

Pure: the grammar, the tokenizer and the statistical predictor come in as small interfaces,
so the rules are testable without vLLM. The grammar is walked forward while the draft is
built (forced strings appear again after each statistical token, e.g. the next key after a
value) and rolled back before returning: the request's real grammar state is untouched.

Confidence: forced tokens 1; a statistical token carries the chance that the draft is still
right after it (the product of the estimates so far). The draft is cut at the first token
whose confidence is below the threshold.
"""

from dataclasses import dataclass, field
from typing import Callable, List, Optional, Protocol, Sequence, Tuple

FORCED, STATISTICAL = "forced", "statistical"


class GrammarWalker(Protocol):
    def accept_token(self, token: int) -> bool: ...
    def rollback(self, num_tokens: int) -> None: ...
    def find_jump_forward_string(self) -> str: ...
    def is_completed(self) -> bool: ...
    def is_terminated(self) -> bool: ...
    def only_allowed_token(self) -> Optional[int]: ...


@dataclass(frozen=True)
class DraftPolicy:
    length: int
    threshold: float
    forced: bool = True
    statistical: bool = True


@dataclass
class Draft:
    tokens: List[int] = field(default_factory=list)
    kinds: List[str] = field(default_factory=list)
    cut_by_threshold: bool = False

    def add(self, token: int, kind: str) -> None:
        self.tokens.append(token)
        self.kinds.append(kind)


Encode = Callable[[str], Sequence[int]]
Predict = Callable[[List[int]], Optional[Tuple[int, float]]]


def forced_tokens(grammar: GrammarWalker, encode: Encode) -> Sequence[int]:
    """The tokens the grammar forces from here: its jump-forward string, tokenized as the
    model's tokenizer would; once the document is complete, the stop token if it is the only
    one allowed."""
    text = grammar.find_jump_forward_string()
    if text:
        return encode(text)
    if grammar.is_completed():
        stop = grammar.only_allowed_token()
        return [stop] if stop is not None else []
    return []


def build_draft(grammar: GrammarWalker, encode: Encode, predict: Predict, policy: DraftPolicy) -> Draft:
    draft = Draft()
    confidence = 1.0
    try:
        while len(draft.tokens) < policy.length and not grammar.is_terminated():
            if policy.forced and _take_forced(grammar, encode, draft, policy.length):
                continue
            if not policy.statistical:
                break
            guess = predict(draft.tokens)
            if guess is None:
                break
            token, estimate = guess
            if confidence * estimate < policy.threshold:
                draft.cut_by_threshold = True
                break
            if not grammar.accept_token(token):
                break
            confidence *= estimate
            draft.add(token, STATISTICAL)
    finally:
        grammar.rollback(len(draft.tokens))
    return draft


def _take_forced(grammar: GrammarWalker, encode: Encode, draft: Draft, length: int) -> bool:
    took = False
    for token in forced_tokens(grammar, encode):
        # A tokenization the grammar refuses (rare boundary cases) ends the forced run.
        if len(draft.tokens) >= length or not grammar.accept_token(token):
            break
        draft.add(token, FORCED)
        took = True
    return took
