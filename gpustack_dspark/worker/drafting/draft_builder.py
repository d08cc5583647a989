"""One request's draft: grammar-forced tokens first, statistical tokens fill the rest.

Pure: the grammar, the tokenizer and the statistical predictor come in as small interfaces,
so the rules are testable without vLLM. The grammar is walked forward while the draft is
built (forced strings appear again after each statistical token, e.g. the next key after a
value) and rolled back before returning: the request's real grammar state is untouched.

Confidence: forced tokens 1; a statistical token carries the chance that the draft is still
right after it (the product of the estimates so far). The draft is cut at the first token
whose confidence is below the threshold.

Kinds: the grammar forces *text*, not tokens. A token of forced text is `forced` only when it
is the one token the grammar allows there (no other token spells a piece of the forced text,
none runs past it): its masked probability is 1, so it is accepted at any temperature. Where
other spellings are allowed (`"` and `",` and `","` before the next key), the token is
`spelled`: drafted the same way, but the model picks among spellings, and at temperature > 0
it is accepted with the model's probability of this spelling. The speculation budget learns
each kind's acceptance separately.

Sampled (requests at temperature > 0, with a `Sampler`): where the grammar forces nothing, the
statistical token is *drawn* from what followed the context (its counts, interpolated over the
context lengths, among the candidates the grammar allows), and the draft carries that
distribution q. vLLM's rejection sampler keeps
a token drawn from q with probability min(1, p/q) and otherwise resamples max(0, p - q): the
target's distribution p either way (speculative sampling), and a token is kept with
probability sum(min(p, q)) instead of p(the most frequent one). Where the model at
temperature spreads its mass over many values (a number, a date, a name), the most frequent
continuation is kept a few times in a hundred while a draw from the counts is kept about as
often as the counts resemble the model. A token drawn from q and verified without q (one-hot)
is still exact: only the acceptance is lower. So nothing here can bias the output; what must
hold for the gain to be exact is that q is the distribution the token was drawn from and
that whether a position is verified does not depend on the token drawn there (the estimate
and the threshold are computed from the counts, before the draw).
"""

import random

from dataclasses import dataclass, field
from typing import Callable, Dict, Iterable, List, Optional, Protocol, Sequence, Set, Tuple

FORCED, SPELLED, STATISTICAL, SAMPLED = "forced", "spelled", "statistical", "sampled"

Dist = Tuple[Tuple[int, ...], Tuple[float, ...]]  # (token ids, their draft probabilities)


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
    # Each token's own estimate (forced 1): the speculation budget's survival starts from it.
    confidences: List[float] = field(default_factory=list)
    # Per token, the distribution a sampled token was drawn from; None for the others (one-hot).
    dists: List[Optional[Dist]] = field(default_factory=list)

    def add(self, token: int, kind: str, confidence: float = 1.0, dist: Optional[Dist] = None) -> None:
        self.tokens.append(token)
        self.kinds.append(kind)
        self.confidences.append(confidence)
        self.dists.append(dist)

    def sampled(self) -> bool:
        return any(d is not None for d in self.dists)


class Spellings:
    """Which token texts of the vocabulary spell a piece of a given text (pure, built once)."""

    def __init__(self, texts: Iterable[Tuple[int, str]]) -> None:
        self.by_text: Dict[str, int] = {}
        self.proper_prefixes: Set[str] = set()
        self.longest = 0
        for token, text in texts:
            if not text or "\ufffd" in text:
                continue  # special or partial-UTF-8 tokens spell no JSON text
            self.by_text.setdefault(text, token)
            self.longest = max(self.longest, len(text))
            for end in range(1, len(text)):
                self.proper_prefixes.add(text[:end])

    def sole(self, text: str, token_text: str) -> bool:
        """Is the token spelled `token_text` the only one the grammar allows before forced `text`?"""
        if not token_text or not text.startswith(token_text):
            return False
        for end in range(1, min(len(text), self.longest) + 1):
            if end != len(token_text) and text[:end] in self.by_text:
                return False  # another token spells a shorter or longer piece of the text
        # A token that starts with all of the forced text and goes on may be allowed too.
        return len(text) > self.longest or text not in self.proper_prefixes


class Sampler:
    """Draws a request's statistical tokens (temperature > 0) from a proposed distribution.

    `propose(draft)` gives weights of the next token (ngram_index.interpolated: continuation
    counts over the context lengths) and the estimate that the draft is still right after it
    (as a statistical token's: n / (n + k) for n observations of k continuations, so one
    continuation seen c times gives c / (c + 1)). q = the weights of the `top` heaviest tokens
    the grammar allows here, normalised."""

    def __init__(self, propose: Callable[[List[int]], Optional[Tuple[Dict[int, float], float]]],
                 rng: random.Random, top: int = 24, scale: float = 1.0) -> None:
        self.propose, self.rng, self.top = propose, rng, top
        self.scale = scale
        """The estimate's calibration (`Calibration.ratio()`): what drawn tokens were kept over
        what was estimated for them, so the threshold cuts where acceptance really falls."""

    def candidates(self, grammar: GrammarWalker, draft: List[int]) -> Optional[Tuple[Dist, float]]:
        """(q, estimate) at the end of `draft`, or None when nothing allowed was seen."""
        proposed = self.propose(draft)
        if not proposed:
            return None
        weights, estimate = proposed
        ranked = sorted(weights.items(), key=lambda kv: (-kv[1], kv[0]))[: self.top]
        allowed = [(token, weight) for token, weight in ranked if weight > 0 and _allows(grammar, token)]
        if not allowed:
            return None
        total = sum(weight for _, weight in allowed)
        dist = (tuple(token for token, _ in allowed), tuple(weight / total for _, weight in allowed))
        return dist, min(1.0, estimate * self.scale)

    def draw(self, dist: Dist) -> int:
        tokens, probs = dist
        u, total = self.rng.random(), 0.0
        for token, prob in zip(tokens, probs):
            total += prob
            if u < total:
                return token
        return tokens[-1]


@dataclass
class Calibration:
    """Drawn tokens' acceptance over their raw estimates (decayed sums, `prior` pseudo-
    observations at ratio 1). The raw n / (n + k) says how well the counts are known, not how
    close the model's own spread is to them: on order JSON at temperature 0.7 it was about 0.8
    where 0.55-0.65 of the drawn tokens were kept, so fixed-length drafts ran long through
    values and cost more verify time than they saved at 8-16 requests. Learned from what was
    verified before a draft is built, so it never depends on a token drawn in it."""

    forgetting: float = 0.995
    prior: float = 8.0
    kept: float = 0.0
    predicted: float = 0.0

    def observe(self, raw_estimate: float, accepted: bool) -> None:
        self.kept = self.kept * self.forgetting + (1.0 if accepted else 0.0)
        self.predicted = self.predicted * self.forgetting + raw_estimate

    def ratio(self) -> float:
        return (self.kept + self.prior) / (self.predicted + self.prior)


def _allows(grammar: GrammarWalker, token: int) -> bool:
    if grammar.accept_token(token):
        grammar.rollback(1)
        return True
    return False


Encode = Callable[[str], Sequence[int]]
Predict = Callable[[List[int]], Optional[Tuple[int, float]]]
TokenText = Callable[[int], str]


def next_forced_token(grammar: GrammarWalker, encode: Encode, predict: Predict, token_text: TokenText,
                      draft: List[int], text: Optional[str] = None) -> Optional[int]:
    """The next token of the text the grammar forces from here, or None.

    The text is certain, its tokenization is not: a model may spell a key in other pieces
    than the tokenizer's canonical split. So the statistical guess is taken when it spells a
    prefix of the forced text (it learned how this model writes it), else the first token of
    the canonical split. Once the document is complete, the stop token if it is the only one
    allowed.
    """
    if text is None:
        text = grammar.find_jump_forward_string()
    if not text:
        return grammar.only_allowed_token() if grammar.is_completed() else None
    guess = predict(draft)
    if guess is not None:
        piece = token_text(guess[0])
        if piece and text.startswith(piece):
            return guess[0]
    canonical = encode(text)
    return canonical[0] if canonical else None


def build_draft(grammar: GrammarWalker, encode: Encode, predict: Predict, policy: DraftPolicy,
                token_text: TokenText = lambda _: "", spellings: Optional[Spellings] = None,
                sampler: Optional[Sampler] = None) -> Draft:
    draft = Draft()
    confidence = 1.0
    try:
        while len(draft.tokens) < policy.length and not grammar.is_terminated():
            if policy.forced:
                text = grammar.find_jump_forward_string()
                token = next_forced_token(grammar, encode, predict, token_text, draft.tokens, text)
                # The stop token after a complete document is the only one allowed: forced.
                kind = FORCED if (not text or spellings is None
                                  or spellings.sole(text, token_text(token) if token is not None else "")) else SPELLED
                # A tokenization the grammar refuses (rare boundary cases) ends the forced run.
                if token is not None and grammar.accept_token(token):
                    draft.add(token, kind)
                    continue
            if not policy.statistical:
                break
            if sampler is not None:
                found = sampler.candidates(grammar, draft.tokens)
                if found is None:
                    break
                dist, estimate = found
                if confidence * estimate < policy.threshold:  # decided before the draw
                    draft.cut_by_threshold = True
                    break
                token = sampler.draw(dist)
                if not grammar.accept_token(token):
                    break  # allowed a moment ago: cannot happen with a deterministic grammar
                confidence *= estimate
                draft.add(token, SAMPLED, estimate, dist)
                continue
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
            draft.add(token, STATISTICAL, estimate)
    finally:
        grammar.rollback(len(draft.tokens))
    return draft

