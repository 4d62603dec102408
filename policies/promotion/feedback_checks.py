"""What the broadcaster decides with after promotion: the canary and live checks on users' feedback (the gate
before it is in policies/promotion/gate.py). Pure functions.

Canary and live watch, on feedback scores in [-1, 1] grouped by the weights
version that answered. A version is rolled back when its mean is below the baseline's by at least
`gate.rollback_margin` and the drop is significant (one-sided Welch z >= 1.645, i.e. 95%), so a
few unlucky ratings do not roll back a good version, while a broken one (all negative) is caught.
  canary: after `canary_min_feedback` rated requests on both sides of the split since the canary
          started -> rolled back if worse, else live; after `canary_max_s` without enough
          feedback -> live (it passed the gate).
  watch:  the last `watch_feedback` ratings of the live version against the last as many of the
          version it replaced, while that one was live -> rolled back if worse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

Z_95 = 1.645


@dataclass
class Drop:
    worse: bool
    reason: str


def _mean_var(xs: list[float]) -> tuple[float, float]:
    m = sum(xs) / len(xs)
    return m, sum((x - m) ** 2 for x in xs) / max(1, len(xs) - 1)


def significant_drop(version: list[float], baseline: list[float], margin: float) -> Drop:
    """Is `version`'s mean below `baseline`'s by >= margin, with a one-sided Welch z >= 1.645?"""
    mv, vv = _mean_var(version)
    mb, vb = _mean_var(baseline)
    diff = mb - mv
    se = math.sqrt(vv / len(version) + vb / len(baseline))
    z = diff / se if se > 0 else (math.inf if diff > 0 else 0.0)
    stats = f"mean {mv:.2f} (n={len(version)}) vs {mb:.2f} (n={len(baseline)}), z={z:.2f}"
    return Drop(diff >= margin and z >= Z_95, stats)


def canary_verdict(
    canary: list[float], baseline: list[float], *, min_feedback: int, margin: float, elapsed_s: float, max_s: float
) -> tuple[str, str]:
    """("wait" | "live" | "rollback", reason) for a running canary."""
    if len(canary) >= min_feedback and len(baseline) >= min_feedback:
        d = significant_drop(canary, baseline, margin)
        return ("rollback", f"canary feedback worse: {d.reason}") if d.worse else ("live", f"canary feedback {d.reason}")
    if elapsed_s >= max_s:
        return "live", f"no feedback evidence after {elapsed_s:.0f}s ({len(canary)} canary / {len(baseline)} live ratings)"
    return "wait", ""


def handoff_verdict(
    canary: list[float], baseline: list[float], *, elapsed_s: float, min_s: float | None, margin: float
) -> tuple[bool, str]:
    """(may it go live now?, reason) for a running canary whose successor has passed its gate against it: after
    `min_s`, unless its feedback so far is `margin` or more below live's (then it runs to its own verdict)."""
    if min_s is None or elapsed_s < min_s:
        return False, ""
    if canary and baseline and _mean_var(baseline)[0] - _mean_var(canary)[0] >= margin:
        return False, ""
    return True, f"no feedback against it after {elapsed_s:.0f}s of canary ({len(canary)} canary / {len(baseline)} live ratings)"


def watch_verdict(live: list[float], previous: list[float], *, window: int, margin: float) -> tuple[bool, str]:
    """(roll back?, reason) for the live version against the version it replaced."""
    if len(live) < window or len(previous) < window:
        return False, ""
    d = significant_drop(live[-window:], previous[-window:], margin)
    return d.worse, f"live feedback dropped: {d.reason}" if d.worse else d.reason
