"""Paired comparison of two weights versions on the same held-out entries.

`paired_test(a, b)`: per-entry scores of version A and version B (avg@k on the same entries, in
the same order). The statistic is the mean difference d = mean(b_i - a_i); its p-value is the
two-sided exact sign-flip permutation test (under H0 each entry's difference is as likely to be
negated), exact up to 16 non-zero differences and Monte Carlo (20,000 draws, fixed seed) beyond.
Entries where both versions score the same carry no evidence either way and do not change d's sign
distribution. No normality is assumed: scores on a handful of tasks are far from normal.
"""
from __future__ import annotations

import itertools
import random


def paired_test(a: list[float], b: list[float], draws: int = 20_000, seed: int = 0) -> dict:
    if len(a) != len(b) or not a:
        raise ValueError("paired_test needs two equally long, non-empty score lists")
    d = [y - x for x, y in zip(a, b)]
    n, obs = len(d), sum(d) / len(d)
    nz = [x for x in d if abs(x) > 1e-12]
    if not nz:
        return {"n": n, "mean_diff": 0.0, "p_value": 1.0, "wins": 0, "losses": 0}
    if len(nz) <= 16:
        sums = [abs(sum(s * x for s, x in zip(signs, nz))) for signs in itertools.product((1, -1), repeat=len(nz))]
        extreme = sum(1 for v in sums if v >= abs(sum(nz)) - 1e-12)
        p = extreme / len(sums)
    else:
        rng, target = random.Random(seed), abs(sum(nz)) - 1e-12
        hits = sum(1 for _ in range(draws) if abs(sum(x if rng.random() < 0.5 else -x for x in nz)) >= target)
        p = (hits + 1) / (draws + 1)
    return {"n": n, "mean_diff": obs, "p_value": p, "wins": sum(x > 0 for x in nz), "losses": sum(x < 0 for x in nz)}
