"""The paired test that decides whether a version really beats the base on the same held-out entries."""

import pytest

from policies.stats import paired_test


def test_paired_test_hand_computed():
    # differences +1, +1, +1, 0: three non-zero, all positive; 2 of the 8 sign patterns reach |sum| 3
    r = paired_test([0, 0, 0, 0.5], [1, 1, 1, 0.5])
    assert r["mean_diff"] == pytest.approx(0.75) and r["p_value"] == pytest.approx(2 / 8)
    assert r["wins"] == 3 and r["losses"] == 0
    # differences +1, -1: every pattern's |sum| >= 0 -> p = 1
    assert paired_test([0, 1], [1, 0])["p_value"] == pytest.approx(1.0)
    assert paired_test([0.5, 0.5], [0.5, 0.5]) == {"n": 2, "mean_diff": 0.0, "p_value": 1.0, "wins": 0, "losses": 0}


def test_paired_test_large_uses_monte_carlo_and_detects_a_clear_gain():
    a = [0.0] * 30
    b = [0.25] * 20 + [0.0] * 10
    r = paired_test(a, b)
    assert r["p_value"] < 1e-3 and r["mean_diff"] == pytest.approx(20 * 0.25 / 30)
    with pytest.raises(ValueError):
        paired_test([1.0], [1.0, 0.0])


def test_fewer_successes_is_the_stratified_exact_test_on_hand_computed_cases():
    from math import comb

    from policies.stats import fewer_successes

    # one entry, one sample each, the base's success vs the version's failure: either could have had it
    assert fewer_successes([1], 1, [0], 1) == pytest.approx(0.5)
    # 3 successes among 16 + 4 samples, none the version's: C(16,3) / C(20,3)
    assert fewer_successes([3], 16, [0], 4) == pytest.approx(comb(16, 3) / comb(20, 3))
    # entries are independent: 26 entries with one base success each and none of the version's -> 0.8 ** 26
    assert fewer_successes([1] * 26 + [0] * 14, 16, [0] * 40, 4) == pytest.approx(0.8**26)
    # the same counts at the same k: the version's total is the middle of its distribution, far from significant
    assert fewer_successes([1, 1, 1, 0], 4, [1, 1, 1, 0], 4) > 0.5
    # a version that does better is never "fewer"
    assert fewer_successes([1, 0, 0], 16, [4, 4, 4], 4) == pytest.approx(1.0)
    # entries nobody solved carry nothing
    assert fewer_successes([0] * 10 + [3], 16, [0] * 11, 4) == fewer_successes([3], 16, [0], 4)
