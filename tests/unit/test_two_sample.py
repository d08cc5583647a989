"""The exactness tests' two-sample test (tests/bench/exactness.py) on samples of known
distributions: how often it rejects when both samples come from one distribution (its false
rejections: at most its level, and p-values spread, not stuck at 1) and how often it catches
two distributions a total-variation distance of 0.2 apart at the sizes the tests use (its
power). Seeded: the figures are the same every run."""

import numpy as np

from tests.bench.exactness import two_sample, tv_distance

P = np.array([.4, .25, .15, .1, .1])
Q = np.array([.25, .2, .15, .2, .2])  # TV 0.2 from P: the wrong verifier's was 0.5 and more


def _p_values(first, second, trials, n, seed):
    rng = np.random.default_rng(seed)
    return np.array([two_sample(rng.choice(5, n, p=first).tolist(), rng.choice(5, n, p=second).tolist(),
                                permutations=499, bootstrap=10, seed=trial).p_value for trial in range(trials)])


def test_one_distribution_is_rejected_at_most_at_the_level_and_p_values_spread():
    p_values = _p_values(P, P, trials=120, n=200, seed=11)
    assert (p_values <= 0.05).mean() <= 0.10, sorted(p_values)[:12]
    assert (p_values <= 0.001).sum() <= 1
    assert 0.35 <= p_values.mean() <= 0.65 and (p_values < 0.5).sum() >= 40, sorted(p_values)


def test_two_distributions_apart_are_caught_at_the_sizes_the_tests_use():
    assert abs(0.5 * np.abs(P - Q).sum() - 0.2) < 1e-9
    p_values = _p_values(P, Q, trials=40, n=200, seed=12)
    assert (p_values <= 0.01).mean() >= 0.9, sorted(p_values)


def test_total_variation_of_two_samples():
    assert tv_distance(["a", "a", "b", "b"], ["a", "b", "b", "b"]) == 0.25
    assert tv_distance([1, 2], [3]) == 1.0
