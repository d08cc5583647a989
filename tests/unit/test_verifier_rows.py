"""The verifier's rows as the proposal for drawn draft tokens (worker/drafting/verifier_rows.py):
the per-context averages, their out-of-sample estimate, the interpolation with the counts,
and the mapping of the rejection sampler's rows back to requests. That the runner hands the
rows back and that drafts drawn from them stay exact is tested in real vLLM
(tests/integration/test_drafting_layer.py)."""

import random

import pytest

from gpustack_dspark.worker.drafting.verifier_rows import (RowsConfig, Tables, VerifierRows, rows_by_request,
                                                           setting_of)


def row(dist):
    tokens = tuple(dist)
    return tokens, tuple(dist[t] for t in tokens)


def overlap(p, q):
    return sum(min(p.get(t, 0.0), q.get(t, 0.0)) for t in set(p) | set(q))


def test_a_context_averages_its_rows_and_scores_each_before_adding_it():
    rows = VerifierRows(RowsConfig(max_n=2, forgetting=1.0))
    rows.add([5, 1, 2], row({7: 0.6, 8: 0.4}))
    rows.add([9, 1, 2], row({7: 0.2, 9: 0.8}))
    entry = rows.table[(1, 2)]
    assert entry.rows == 2
    assert entry.mean() == pytest.approx({7: 0.4, 8: 0.2, 9: 0.4})
    # the second row against the mean of the first alone: min(.2, .6) + min(.8, 0) = 0.2
    assert entry.scored / entry.unit == 1 and entry.overlap / entry.unit == pytest.approx(0.2)
    assert rows.table[(2,)].rows == 2 and (5, 1, 2) not in rows.table  # lengths 1..max_n only
    assert rows.table[(1, 2)] is not rows.table[(2,)]


def test_the_proposal_takes_longest_contexts_first_and_leaves_the_rest_to_the_counts():
    rows = VerifierRows(RowsConfig(max_n=2, prior_rows=2.0, forgetting=1.0))
    for _ in range(2):
        rows.add([1, 2], row({7: 1.0}))   # after (1, 2): 7, twice
    rows.add([3, 2], row({8: 1.0}))       # after (2,): 7, 7, 8
    counts = ({9: 1.0}, 0.5)
    dist, estimate = rows.proposal([1, 2], lambda: counts)
    # (1, 2): 2 rows keep 2/4 of the mass for 7; (2,): 3 rows keep 3/5 of the half left, as
    # 2/3 for 7 and 1/3 for 8; the counts get what is left: 0.5 * 0.4 = 0.2 for 9
    assert dist == pytest.approx({7: 0.5 + 0.3 * 2 / 3, 8: 0.3 / 3, 9: 0.2})
    assert estimate == pytest.approx(1.0)  # (1, 2)'s second row was scored against the first: all of it
    # a context the verifier has not seen draws from the counts as before
    assert rows.proposal([4, 5], lambda: counts) == counts
    assert rows.proposal([4, 5], lambda: None) is None


def test_its_estimate_follows_what_the_mean_row_would_have_kept():
    rng = random.Random(3)
    rows = VerifierRows(RowsConfig(max_n=1, forgetting=1.0))
    truth = {1: 0.5, 2: 0.3, 3: 0.2}
    seen = []
    for _ in range(200):  # rows scattered around a mean: each its own prompt's distribution
        noisy = {t: p * rng.uniform(0.5, 1.5) for t, p in truth.items()}
        total = sum(noisy.values())
        noisy = {t: p / total for t, p in noisy.items()}
        seen.append(noisy)
        rows.add([4], row(noisy))
    dist, estimate = rows.proposal([4], lambda: None)
    assert dist == pytest.approx(truth, abs=0.03)
    expected = sum(overlap(r, truth) for r in seen) / len(seen)
    assert estimate == pytest.approx(expected, abs=0.03) and estimate < 0.97


def test_memory_is_bounded_per_context_and_in_contexts():
    rows = VerifierRows(RowsConfig(max_n=1, capacity=3, keep=2))
    for token in range(10):
        rows.add([token], row({100: 0.5, 101: 0.3, 102: 0.1, 103: 0.05, 104: 0.05}))
    assert list(rows.table) == [(7,), (8,), (9,)]  # the least recently added evicted
    assert all(len(entry.sums) <= 5 for entry in rows.table.values())
    many = VerifierRows(RowsConfig(max_n=1, keep=2))
    many.add([1], row({t: 0.2 for t in range(5)}))  # 5 > 2 * keep: pruned to the 2 heaviest
    assert len(many.table[(1,)].sums) == 2


def test_decay_lets_a_changed_model_take_over():
    rows = VerifierRows(RowsConfig(max_n=1, forgetting=0.9))
    for _ in range(50):
        rows.add([1], row({5: 1.0}))
    for _ in range(50):
        rows.add([1], row({6: 1.0}))
    dist, _ = rows.proposal([1], lambda: None)
    assert dist[6] > 0.99


def test_each_sampling_setting_keeps_its_own_table():
    class Params:
        def __init__(self, temperature, top_p=1.0, top_k=0):
            self.temperature, self.top_p, self.top_k = temperature, top_p, top_k

    tables = Tables(limit=2)
    assert setting_of(Params(0.7, 0.9)) == (0.7, 0.9, 0)
    a = tables.get(setting_of(Params(0.7, 0.9)))
    assert tables.get(setting_of(Params(0.7, 0.9))) is a
    b = tables.get(setting_of(Params(1.0)))
    assert b is not a
    tables.get(setting_of(Params(0.5)))  # a third setting evicts the least recently used
    assert setting_of(Params(0.7, 0.9)) not in tables.tables
    b.add([1], row({2: 1.0}))
    assert tables.rows_added() == 1


def test_rows_by_request_maps_the_batch_rows_to_the_marked_positions():
    # two requests with drafts (3 and 2 positions), one without; rows in batch order
    tokens = [[10, 11], [12, 13], [14, 15], [20, 21], [22, 23]]
    probs = [[0.9, 0.1], [0.5, 0.5], [1.0, 0.0], [0.7, 0.3], [0.6, 0.4]]
    wanted = {"a": [None, "q", "q"], "c": ["q", None]}
    out = rows_by_request(["a", "b", "c"], [3, 0, 2], tokens, probs, wanted)
    assert out == {"a": {1: ((12, 13), (0.5, 0.5)), 2: ((14,), (1.0,))},  # a zero dropped
                   "c": {0: ((20, 21), (0.7, 0.3))}}
    assert rows_by_request(["a"], [3], tokens, probs, {}) == {}


def test_lazy_decay_matches_decaying_every_sum_and_survives_rescaling():
    f = 0.5  # large steps: the unit passes 1e6 after 20 rows and is rescaled
    rows = VerifierRows(RowsConfig(max_n=1, forgetting=f))
    expected = {}
    for i in range(45):
        dist = {i % 3: 0.75, 3: 0.25}
        expected = {t: v * f for t, v in expected.items()}
        for t, p in dist.items():
            expected[t] = expected.get(t, 0.0) + p
        rows.add([9], row(dist))
    entry = rows.table[(9,)]
    total = sum(expected.values())
    assert entry.mean() == pytest.approx({t: v / total for t, v in expected.items()})
    assert entry.rows == pytest.approx(sum(f ** k for k in range(45)))
    assert entry.unit < 1e6 * 2
