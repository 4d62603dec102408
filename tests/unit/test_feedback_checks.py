"""The feedback checks after promotion: a significant drop (margin and one-sided Welch z), the canary's verdict
and the live watch."""

import math

from policies.promotion.feedback_checks import canary_verdict, significant_drop, watch_verdict


def test_significant_drop_is_margin_and_welch_z():
    # means 1.0 vs -1.0 with no spread: a certain drop
    d = significant_drop([-1.0] * 8, [1.0] * 8, margin=0.3)
    assert d.worse and "z=inf" in d.reason
    # hand-computed: version [1,-1,1,-1] mean 0, var 4/3; baseline [1,1,1,-1] mean 0.5, var 1
    # se = sqrt(4/3/4 + 1/4) = sqrt(7/12) = 0.7638; z = 0.5 / 0.7638 = 0.6547 < 1.645 -> not significant
    d = significant_drop([1, -1, 1, -1], [1, 1, 1, -1], margin=0.3)
    assert not d.worse and f"z={0.5 / math.sqrt(7 / 12):.2f}" in d.reason
    # a significant but small drop stays below the margin
    assert not significant_drop([0.9] * 30 + [0.8] * 30, [1.0] * 30 + [0.9] * 30, margin=0.3).worse


def test_canary_verdict():
    kw = dict(min_feedback=4, margin=0.3, max_s=600)
    assert canary_verdict([1, 1, 1], [1, 1, 1, 1], elapsed_s=10, **kw)[0] == "wait"
    assert canary_verdict([-1] * 4, [1] * 4, elapsed_s=10, **kw)[0] == "rollback"
    assert canary_verdict([1, -1, 1, 1], [1, 1, -1, 1], elapsed_s=10, **kw)[0] == "live"
    verdict, why = canary_verdict([1], [], elapsed_s=601, **kw)
    assert verdict == "live" and "no feedback evidence" in why


def test_watch_verdict_compares_windows():
    assert watch_verdict([-1] * 3, [1] * 10, window=4, margin=0.3) == (False, "")  # not enough yet
    roll, why = watch_verdict([1] * 10 + [-1] * 4, [1] * 4, window=4, margin=0.3)
    assert roll and "live feedback dropped" in why  # only the last `window` ratings count
    assert not watch_verdict([-1] * 4 + [1] * 4, [1] * 4, window=4, margin=0.3)[0]
