"""Sampled drafts (temperature > 0), their pure parts: the draw from continuation counts, the
draft that carries its distributions, the hand-off rows the rejection sampler gets, and the
budget rule that keeps the verification exact. vLLM's rejection sampler with these rows is
tested in tests/integration/test_drafting_layer.py (two-sample test against plain vLLM).
"""

import math
import random
from collections import Counter

import pytest

from gpustack_dspark.worker.drafting import draft_probs
from gpustack_dspark.worker.drafting.budget import decide
from gpustack_dspark.worker.drafting.draft_builder import (FORCED, SAMPLED, STATISTICAL, Calibration, DraftPolicy,
                                                           Sampler, build_draft)
from gpustack_dspark.worker.drafting.ngram_index import NgramIndex, continuations, interpolated, predict


class BranchingGrammar:
    """Position i allows the tokens in `allowed[i]`; forced text {position: text} as in xgrammar."""

    def __init__(self, allowed, forced=None):
        self.allowed, self.forced = [set(a) for a in allowed], dict(forced or {})
        self.taken = []

    def accept_token(self, token):
        pos = len(self.taken)
        if pos >= len(self.allowed) or token not in self.allowed[pos]:
            return False
        self.taken.append(token)
        return True

    def rollback(self, n):
        assert n <= len(self.taken)
        del self.taken[len(self.taken) - n:]

    def find_jump_forward_string(self):
        return self.forced.get(len(self.taken), "")

    def is_completed(self):
        return len(self.taken) == len(self.allowed)

    def is_terminated(self):
        return False

    def only_allowed_token(self):
        return None


def test_continuations_merge_the_longest_context_and_predict_reads_them():
    own, shared = NgramIndex(3), NgramIndex(3)
    own.add([1, 2, 3, 1, 2, 4])
    shared.add([9, 1, 2, 4, 9, 1, 2, 5])
    assert continuations([1, 2], [own, shared]) == {3: 1, 4: 2, 5: 1}
    assert continuations([9, 1, 2], [own, shared]) == {4: 1, 5: 1}  # only `shared` saw (9, 1, 2)
    assert predict([1, 2], [own, shared]) == (4, 2 / 5)
    assert continuations([7], [own, shared]) is None


def from_counts(counts):
    """A proposer over fixed counts, with the statistical estimate n / (n + k)."""
    def propose(draft):
        if not counts:
            return None
        n = sum(counts.values())
        return dict(counts), n / (n + len(counts))
    return propose


def test_interpolation_passes_mass_from_long_contexts_to_shorter_ones():
    index = NgramIndex(2)
    # After 7: 1 (x3), 2 (x1). After (5, 7): 1 only, seen twice.
    index.add([5, 7, 1, 9, 5, 7, 1, 9, 8, 7, 1, 9, 6, 7, 2])
    dist, estimate = interpolated([5, 7], [index])
    assert estimate == pytest.approx(2 / 3)  # (5, 7): n = 2, k = 1
    # (5, 7) keeps 2/3 for token 1; the last third goes to (7,): 1 with 3/4, 2 with 1/4.
    assert dist == pytest.approx({1: 2 / 3 + 1 / 3 * 3 / 4, 2: 1 / 3 * 1 / 4})
    assert interpolated([4], [index]) is None
    # A long context seen often keeps nearly all: the walk stops there.
    often = NgramIndex(2)
    often.add([5, 7, 1] * 60 + [6, 7, 2])
    dist, _ = interpolated([5, 7], [often], rest=0.05)
    assert set(dist) == {1} and dist[1] == pytest.approx(1.0)
    # Only the `top` most frequent continuations of each context are taken.
    wide = NgramIndex(1)
    wide.add([0, 1, 0, 2, 0, 3, 0, 3, 0, 3, 0, 2])
    assert set(interpolated([0], [wide], top=2)[0]) == {3, 2}


def test_the_sampler_keeps_what_the_grammar_allows_and_draws_from_its_weights():
    counts = {10: 6, 11: 3, 12: 1, 13: 5}  # 13 is not allowed here
    grammar = BranchingGrammar([{10, 11, 12}])
    sampler = Sampler(from_counts(counts), random.Random(0))
    (tokens, probs), estimate = sampler.candidates(grammar, [])
    assert tokens == (10, 11, 12) and probs == pytest.approx((0.6, 0.3, 0.1))
    assert estimate == pytest.approx(15 / 19)  # the proposer's: n / (n + k) over what it saw
    assert grammar.taken == []  # every candidate was tried and rolled back
    drawn = Counter(sampler.draw((tokens, probs)) for _ in range(20000))
    for token, p in zip(tokens, probs):
        assert drawn[token] / 20000 == pytest.approx(p, abs=0.015), drawn
    # One continuation seen c times: the statistical token's own estimate, c / (c + 1).
    one = Sampler(from_counts({10: 4}), random.Random(0)).candidates(grammar, [])
    assert one == (((10,), (1.0,)), pytest.approx(4 / 5))
    # Nothing allowed, nothing seen: no draw.
    assert Sampler(from_counts({13: 9}), random.Random(0)).candidates(grammar, []) is None
    assert Sampler(from_counts({}), random.Random(0)).candidates(grammar, []) is None


def test_the_sampler_keeps_only_the_heaviest_candidates():
    counts = {t: 100 - t for t in range(40)}
    grammar = BranchingGrammar([set(range(40))])
    (tokens, probs), _ = Sampler(from_counts(counts), random.Random(0), top=5).candidates(grammar, [])
    assert tokens == (0, 1, 2, 3, 4) and math.isclose(sum(probs), 1.0)


def test_a_sampled_draft_carries_its_distributions_and_forced_tokens_stay_one_hot():
    # '{' forced, then a value from {1, 2}, then ',' forced, then a value from {3, 4}.
    grammar = BranchingGrammar([{ord("{")}, {1, 2}, {ord(",")}, {3, 4}], forced={0: "{", 2: ","})
    seen = {(ord("{"),): {1: 30, 2: 10}, (ord("{"), 1, ord(",")): {3: 5, 4: 5},
            (ord("{"), 2, ord(",")): {3: 5, 4: 5}}

    def counts(draft):
        return seen.get(tuple(draft))

    def propose(draft):
        return from_counts(counts(draft))(draft)

    def encode(text):
        return [ord(c) for c in text]

    policy = DraftPolicy(length=8, threshold=0.3)
    draft = build_draft(grammar, encode, lambda d: None, policy, sampler=Sampler(propose, random.Random(1)))
    assert draft.kinds == [FORCED, SAMPLED, FORCED, SAMPLED]
    assert draft.dists[0] is None and draft.dists[2] is None
    assert draft.dists[1] == ((1, 2), (0.75, 0.25)) and draft.dists[3] == ((3, 4), (0.5, 0.5))
    assert draft.tokens[1] in (1, 2) and draft.tokens[3] in (3, 4)
    assert draft.confidences[1] == pytest.approx(40 / 42) and draft.sampled()
    assert grammar.taken == []
    # Over many drafts the value tokens follow the counts (drawn, not the most frequent).
    rng = random.Random(2)
    firsts = Counter(build_draft(grammar, encode, lambda d: None, policy, sampler=Sampler(propose, rng)).tokens[1]
                     for _ in range(4000))
    assert firsts[2] / 4000 == pytest.approx(0.25, abs=0.03), firsts
    # Without a sampler (greedy requests): the most frequent continuation, one-hot.
    greedy = build_draft(grammar, encode, lambda d: (max(counts(d), key=counts(d).get), 0.9) if counts(d) else None,
                         policy)
    assert greedy.kinds == [FORCED, STATISTICAL, FORCED, STATISTICAL] and greedy.tokens[1] == 1
    assert not greedy.sampled()


def test_the_threshold_is_decided_before_the_draw():
    grammar = BranchingGrammar([{1, 2, 3, 4}])
    rng = random.Random(5)
    state = rng.getstate()
    # 2 observations of 2 values: estimate 0.5 < 0.6, so no token is drawn at all.
    draft = build_draft(grammar, lambda t: [], lambda d: None, DraftPolicy(length=4, threshold=0.6),
                        sampler=Sampler(from_counts({1: 1, 2: 1}), rng))
    assert draft.tokens == [] and draft.cut_by_threshold
    assert rng.getstate() == state


def test_hand_off_rows_are_one_hot_except_where_q_was_drawn():
    dists = {"a": ((5, 6, 7), [None, ((6, 9), (0.5, 0.5)), None]),
             "b": ((1,), [((1, 2), (0.25, 0.75))])}
    # vLLM scheduled all of a, none of c, and b was rebuilt differently (never verified with q).
    step = draft_probs.scheduled(dists, {"a": [5, 6, 7], "b": [3], "c": []})
    assert step == {"a": [None, ((6, 9), (0.5, 0.5)), None]}
    # A trimmed draft keeps its leading rows; one without a sampled row left carries none.
    assert draft_probs.scheduled(dists, {"a": [5, 6]}) == {"a": [None, ((6, 9), (0.5, 0.5))]}
    assert draft_probs.scheduled(dists, {"a": [5]}) == {}
    cells = draft_probs.entries(["x", "a", "y"], [1, 3, 0], [4, 5, 6, 7], step)
    assert cells == [(0, 4, 1.0), (1, 5, 1.0), (2, 6, 0.5), (2, 9, 0.5), (3, 7, 1.0)]


def test_a_sampled_draft_is_cut_by_the_cutoff_decided_before_it_was_drawn():
    model = (0.010, 0.002)  # 10 ms + 2 ms per token: a few slots are worth it, not all
    drafts = [[0.9, 0.8, 0.2, 0.1], [0.9, 0.8, 0.2, 0.1]]
    free = decide(drafts, base_tokens=2, base_output=2, model=model, slot_cap=64, previous_cutoff=0.15,
                  hysteresis=0.0)
    held = decide(drafts, base_tokens=2, base_output=2, model=model, slot_cap=64, previous_cutoff=0.15,
                  hysteresis=0.0, held=[False, True])
    assert free.lengths[0] == held.lengths[0]  # a one-hot draft: this step's decision
    assert held.lengths[1] == 3  # the previous cutoff 0.15: 0.9, 0.8, 0.2 kept
    # The held length does not depend on the draft's later slots (which follow its earlier draws).
    other = decide([drafts[0], [0.9, 0.8, 0.2, 0.19]], base_tokens=2, base_output=2, model=model, slot_cap=64,
                   previous_cutoff=0.15, hysteresis=0.0, held=[False, True])
    assert other.lengths[1] == 4  # its first three slots kept as before: 0.19 >= 0.15 adds the fourth
    # Undecided: as built (within the cap); off: nothing.
    assert decide(drafts, 2, 2, model, 64, None, 0.0, held=[True, True]).lengths == [4, 4]
    assert decide(drafts, 2, 2, model, 64, math.inf, 0.0, held=[True, True]).lengths == [0, 0]
    # The prefill cap still holds, by rank among the best slots.
    assert decide(drafts, 2, 2, model, 3, None, 0.0, held=[True, True]).lengths == [2, 1]


def test_the_calibration_scales_the_estimate_to_what_was_kept():
    calibration = Calibration(prior=8.0)
    assert calibration.ratio() == 1.0
    for i in range(400):  # raw estimates of 0.8, kept half the time
        calibration.observe(0.8, i % 2 == 0)
    assert calibration.ratio() == pytest.approx(0.5 / 0.8, abs=0.03)
    grammar = BranchingGrammar([{1, 2}])
    (_, _), scaled = Sampler(from_counts({1: 8, 2: 8}), random.Random(0), scale=calibration.ratio()).candidates(
        grammar, [])
    assert scaled == pytest.approx(16 / 18 * calibration.ratio())
    # Capped at 1: a calibration above 1 never makes a token certain.
    assert Sampler(from_counts({1: 99}), random.Random(0), scale=1.5).candidates(grammar, [])[1] == 1.0
