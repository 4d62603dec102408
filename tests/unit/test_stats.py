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
