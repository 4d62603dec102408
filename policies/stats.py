"""Paired comparison of two weights versions on the same held-out entries.

`paired_test(a, b)`: per-entry scores of version A and version B (avg@k on the same entries, in
the same order). The statistic is the mean difference d = mean(b_i - a_i); its p-value is the
two-sided exact sign-flip permutation test (under H0 each entry's difference is as likely to be
negated), exact up to 16 non-zero differences and Monte Carlo (20,000 draws, fixed seed) beyond.
Entries where both versions score the same carry no evidence either way and do not change d's sign
distribution. No normality is assumed: scores on a handful of tasks are far from normal.

`fewer_successes(base, base_k, version, version_k)`: per-entry success counts of two versions sampled a
different number of times (the guard samples the base 8 times an entry, once, and each version 4 times). Under
H0 (each entry's success rate is the same for both), given an entry's total successes t the version's count is
hypergeometric (t draws from base_k + version_k samples, version_k of them the version's), independently across
entries; the one-sided p-value is P(S <= the version's total) under the convolution of those (the stratified
conditional exact test, as in Cochran-Mantel-Haenszel). Near the floor a base sampled more often is what gives a
test power. A version that solves nothing on 40 entries x 4, against a base that solved 6 entries once each in
x4 (a 3.8% rate), is p = 2 x 0.5^6 = 0.031 by sign flips at best and (4/8)^6 = 0.016 here; against the same rate
known from x8 (12 successes, one an entry) it is (8/12)^12 = 0.0077; at a 1.9% rate (6 successes in x8) it is
(8/12)^6 = 0.088, and nothing at this floor can tell a loss from chance.

`wilson(p, n)`: the 95% Wilson score interval of a rate, for the live page's curve (`policies/evaluation/evolution.py`).
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


def fewer_successes(base: list[int], base_k: int, version: list[int], version_k: int) -> float:
    """One-sided exact p-value that the version succeeds less often than the base (see the module docstring)."""
    from math import comb

    if len(base) != len(version):
        raise ValueError("fewer_successes needs the same entries for both versions")
    dist = [1.0]  # P(S = s) for the entries so far
    for b, v in zip(base, version):
        t = b + v
        if t == 0:
            continue
        lo, hi = max(0, t - base_k), min(version_k, t)
        pmf = [
            comb(version_k, x) * comb(base_k, t - x) / comb(base_k + version_k, t) if lo <= x <= hi else 0.0
            for x in range(hi + 1)
        ]
        out = [0.0] * (len(dist) + hi)
        for s, ps in enumerate(dist):
            if ps:
                for x, px in enumerate(pmf):
                    out[s + x] += ps * px
        dist = out
    observed = sum(version)
    return min(1.0, sum(dist[: observed + 1]))


def wilson(p: float, n: int, z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval of a success rate `p` observed over `n` trials (95% at z = 1.96); (0, 1) for n = 0.
    Unlike p +/- z·se it stays inside [0, 1] and is not empty at p = 0, where the 135M model mostly is."""
    if n <= 0:
        return 0.0, 1.0
    centre, half = p + z * z / (2 * n), z * ((p * (1 - p) + z * z / (4 * n)) / n) ** 0.5
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))
