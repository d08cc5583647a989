"""Frequency index of token n-grams: the statistical half of DSpark drafting. Pure Python.

It answers "after these tokens, what came next, and how often?" from three indexes: the
request's prompt (as prompt lookup does: an extraction's values are copied from it), its reply
so far, and the outputs of recent requests (as suffix decoding does). Their counts are merged:
the longest context that was seen wins; the estimate is count / (total + 1), so a continuation
seen once is never "certain" — only grammar-forced tokens carry confidence 1. `source` says
which index a drafted token came from (the acceptance-by-source counters).
"""

import heapq
from collections import deque
from typing import Deque, Dict, List, Optional, Sequence, Tuple

Counts = Dict[int, int]


class NgramIndex:
    """n-gram (n = 1..max_n) → counts of the token that followed it."""

    def __init__(self, max_n: int = 4) -> None:
        self.max_n = max_n
        self.table: Dict[Tuple[int, ...], Counts] = {}

    def add(self, tokens: Sequence[int], start: int = 0, sign: int = 1, end: Optional[int] = None) -> None:
        """Count every (context → next) pair whose next token is at a position in [start, end)."""
        table, max_n = self.table, self.max_n
        for pos in range(max(start, 1), len(tokens) if end is None else min(end, len(tokens))):
            nxt = tokens[pos]
            for n in range(1, min(max_n, pos) + 1):
                key = tuple(tokens[pos - n:pos])
                counts = table.get(key)
                if counts is None:
                    if sign < 0:
                        continue
                    counts = table[key] = {}
                value = counts.get(nxt, 0) + sign
                if value > 0:
                    counts[nxt] = value
                else:
                    counts.pop(nxt, None)
                    if not counts:
                        del table[key]

    def remove(self, tokens: Sequence[int]) -> None:
        self.add(tokens, 0, sign=-1)


class RequestHistory:
    """The request-local indexes, fed incrementally as the request's tokens grow: the prompt's
    pairs (next token among the first `prompt_len`) and the reply's (next token after them; its
    context may reach into the prompt)."""

    def __init__(self, max_n: int, prompt_len: int = 0) -> None:
        self.prompt = NgramIndex(max_n)
        self.reply = NgramIndex(max_n)
        self.prompt_len = prompt_len
        self.indexed = 0
        self.copy = None  # the request's prompt_copy.PromptCopy, made by the layer on its first draft

    def update(self, tokens: Sequence[int]) -> None:
        if len(tokens) > self.indexed:
            split = min(self.prompt_len, len(tokens))
            if self.indexed < split:
                self.prompt.add(tokens, start=self.indexed, end=split)
            self.reply.add(tokens, start=max(self.indexed, split))
            self.indexed = len(tokens)


class SharedHistory:
    """Outputs of the last `capacity` finished requests (evicted ones are un-counted)."""

    def __init__(self, max_n: int, capacity: int = 256) -> None:
        self.index = NgramIndex(max_n)
        self.capacity = capacity
        self.outputs: Deque[Tuple[int, ...]] = deque()

    def add_output(self, tokens: Sequence[int]) -> None:
        if self.capacity <= 0 or len(tokens) < 2:
            return
        kept = tuple(tokens)
        self.outputs.append(kept)
        self.index.add(kept)
        while len(self.outputs) > self.capacity:
            self.index.remove(self.outputs.popleft())


def continuations(context: Sequence[int], indexes: Sequence[NgramIndex], min_n: int = 1) -> Optional[Counts]:
    """What followed the longest context any index has seen (counts merged over the indexes);
    None when no context of length >= min_n was seen."""
    max_n = max((ix.max_n for ix in indexes), default=0)
    for n in range(min(max_n, len(context)), min_n - 1, -1):
        merged = _merged(tuple(context[len(context) - n:]), indexes)
        if merged:
            return merged
    return None


def _merged(key: Tuple[int, ...], indexes: Sequence[NgramIndex]) -> Counts:
    merged: Counts = {}
    for ix in indexes:
        counts = ix.table.get(key) if len(key) <= ix.max_n else None
        if counts:
            for token, count in counts.items():
                merged[token] = merged.get(token, 0) + count
    return merged


PROMPT, REPLY, HISTORY, LEARNED = "prompt", "reply", "history", "learned"
SOURCES = (PROMPT, REPLY, HISTORY, LEARNED)


def source(context: Sequence[int], token: int, named: Sequence[Tuple[str, NgramIndex]]) -> str:
    """Which index a drafted `token` came from: the one that saw it most often after the longest
    context any of them saw it after (ties: the first in `named`); LEARNED when none saw it
    (a token drawn from the verifier's rows)."""
    max_n = max((ix.max_n for _, ix in named), default=0)
    for n in range(min(max_n, len(context)), 0, -1):
        key = tuple(context[len(context) - n:])
        best, most = None, 0
        for name, ix in named:
            counts = ix.table.get(key) if n <= ix.max_n else None
            count = counts.get(token, 0) if counts else 0
            if count > most:
                best, most = name, count
        if best is not None:
            return best
    return LEARNED


def interpolated(context: Sequence[int], indexes: Sequence[NgramIndex], top: int = 24,
                 rest: float = 0.03) -> Optional[Tuple[Dict[int, float], float]]:
    """A distribution of the next token for drawing draft tokens (temperature > 0), and the
    estimate n / (n + k) of the longest context seen (n observations of k continuations).

    Witten-Bell interpolation over the context lengths, longest first: a context seen n times
    with k continuations keeps n / (n + k) of the mass for its own counts and passes k / (n + k)
    to the next shorter context, down to one token (which keeps all it is passed). Where the
    model spreads its mass over many values, a long context has seen only a few of them; the
    shorter ones have seen more (on order JSON at temperature 0.7, offline against the model's
    own distribution: kept 0.46 of the time at value tokens, against 0.39 from the longest
    context alone and 0.18 for the most frequent token). Each context adds its `top` most
    frequent continuations; the walk stops once less than `rest` of the mass is left to pass on
    (the distribution is then renormalised)."""
    max_n = max((ix.max_n for ix in indexes), default=0)
    dist: Dict[int, float] = {}
    mass, estimate = 1.0, None
    for n in range(min(max_n, len(context)), 0, -1):
        merged = _merged(tuple(context[len(context) - n:]), indexes)
        if not merged:
            continue
        total, kinds = sum(merged.values()), len(merged)
        if estimate is None:
            estimate = total / (total + kinds)
        keep = mass * (total / (total + kinds) if n > 1 else 1.0)
        best = heapq.nlargest(top, merged.items(), key=lambda kv: (kv[1], -kv[0])) if kinds > top else merged.items()
        shown = sum(count for _, count in best)
        for token, count in best:
            dist[token] = dist.get(token, 0.0) + keep * count / shown
        mass -= keep
        if mass < rest:
            break
    if estimate is None:
        return None
    norm = sum(dist.values())
    return {token: p / norm for token, p in dist.items()}, estimate


def predict(context: Sequence[int], indexes: Sequence[NgramIndex],
            min_n: int = 1) -> Optional[Tuple[int, float]]:
    """The most frequent next token after the longest context any index has seen, with its
    estimate count / (total + 1); None when no context of length >= min_n was seen."""
    merged = continuations(context, indexes, min_n)
    if not merged:
        return None
    token, count = max(merged.items(), key=lambda kv: (kv[1], -kv[0]))
    return token, count / (sum(merged.values()) + 1)


def tail(tokens: Sequence[int], extra: List[int], n: int) -> List[int]:
    """The last n tokens of tokens + extra, without copying the whole sequence."""
    need = n - len(extra)
    head = list(tokens[len(tokens) - need:]) if need > 0 else []
    return (head + extra)[-n:] if n > 0 else []
