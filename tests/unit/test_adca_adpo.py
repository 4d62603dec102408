"""ADCA and ADPO pinned to hand-computed values."""

import math

from policies.learning.adca import adpo_clip_high, adpo_scale, step_advantages, step_rewards, token_advantages


def test_adca_two_trajectories_by_hand():
    # traj 0: GOOD, GOOD (outcome 1); traj 1: BAD (outcome 0); alpha 0.1
    labels, outcomes = [["GOOD", "GOOD"], ["BAD"]], [1.0, 0.0]
    # per-trajectory means 1 and -1 -> mu 0; squared deviations 1 and 1 -> var 1 -> z = p
    # outcomes: mean 0.5, population std 0.5 -> u = +1, -1
    r = step_rewards(labels, outcomes, alpha=0.1)
    assert [[round(x, 6) for x in t] for t in r] == [[0.1, 1.1], [-1.1]]
    a = step_advantages(labels, outcomes, alpha=0.1)
    assert [[round(x, 6) for x in t] for t in a] == [[1.2, 1.1], [-1.1]]


def test_adca_equal_trajectory_weight_and_nonzero_mean():
    labels, outcomes = [["GOOD", "BAD", "BAD", "BAD"], ["GOOD"]], [0.0, 0.0]
    # means -0.5 and 1 -> mu 0.25; devs: traj0 (0.5625 + 3 * 1.5625) / 4 = 1.3125, traj1 0.5625 -> var 0.9375
    sd = math.sqrt(0.9375 + 1e-8)
    r = step_rewards(labels, outcomes, alpha=0.2)
    assert math.isclose(r[0][0], 0.2 * 0.75 / sd, rel_tol=1e-9) and math.isclose(r[0][1], 0.2 * -1.25 / sd, rel_tol=1e-9)
    assert math.isclose(r[1][0], 0.2 * 0.75 / sd, rel_tol=1e-9)  # outcome std 0 -> u = 0


def test_tokens_get_their_step_advantage():
    t = token_advantages([[-1, 0, 0, -1, 1, 1]], [[2.0, -3.0]], 7)
    assert t.tolist() == [[0.0, 2.0, 2.0, 0.0, -3.0, -3.0, 0.0]]


def test_adpo_scale_and_clip():
    assert adpo_scale(0.3) == 0.6 and adpo_scale(0.8) == 1.0 and math.isclose(adpo_scale(0.55), 0.8)
    assert adpo_scale(0.1) == 0.6 and adpo_scale(0.95) == 1.0
    assert math.isclose(adpo_clip_high(0.3), 0.3) and adpo_clip_high(0.8) == 0.2 and math.isclose(adpo_clip_high(0.55), 0.25)


def test_self_consistency():
    from policies.learning.adca import self_consistency

    assert self_consistency([1, 1, 1, 0]) == 0.75 and self_consistency([0, 0, 1, 1]) == 0.5
    assert self_consistency([0.0, 0.1, 0.2, 0.3]) == 1.0
