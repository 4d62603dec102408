"""Bookkeeping around the judge: its call budget (a token bucket), which groups the environment labels alone are
audited by it, and how often it agrees with the environment's verifiable step labels (confusion counts, accuracy,
Cohen's kappa).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass

from actors.events import Sample
from envs.tool_fit import calls_fit

STEP_SHAPING = 0.1  # weight of the mean step signal added to the environment outcome

# ----------------------------------------------------------------------------- budget


class Budget:
    """Judge prompts per minute (token bucket); `take(n)` is all-or-nothing."""

    def __init__(self, per_minute: float, clock=time.monotonic):
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, float(per_minute))
        self.tokens = self.capacity
        self.clock = clock
        self.t = clock()

    def take(self, n: int) -> bool:
        now = self.clock()
        self.tokens = min(self.capacity, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if n <= self.tokens:
            self.tokens -= n
            return True
        return False


def audited(group_id: str, share: float) -> bool:
    """Whether the judge also labels a group whose every step the environment labels (`judge.audit_share`): only to
    measure their agreement, since the learner trains on the environment's labels there. Decided by the group id, so a
    redelivered group is decided the same way."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    return int(hashlib.sha256(group_id.encode()).hexdigest()[:8], 16) / 2**32 < share


# ----------------------------------------------------------------------------- agreement


def env_labels(sample: Sample) -> list[str]:
    """Verifiable step labels: GOOD when the environment's step signal is positive."""
    return ["GOOD" if s > 0 else "BAD" for s in sample.step_signals]


def score_rollout(sample: Sample, fit_credit: float = 0.0) -> tuple[float, list[str]]:
    """(outcome, step labels) for one rollout from its environment signals: the outcome + 0.1 x the mean step signal.
    With `fit_credit` (one-call environments, `rollout.fit_credit`), a sample the environment did not accept whose
    calls fit the declared tools gains that much: it ranks between an accepted call and one that misses a required
    parameter or a type."""
    sig = sample.step_signals
    shaped = sample.outcome + STEP_SHAPING * (sum(sig) / len(sig) if sig else 0.0)
    if fit_credit and sample.outcome < 1.0 and calls_fit(sample):
        shaped += fit_credit
    return round(shaped, 6), env_labels(sample)


def choose_labels(mode: str, verified: list[str] | None, judged: list[str] | None) -> list[str] | None:
    """The labels the learner trains on (`judge.step_labels`): the judge's in `judge` mode when it answered, else the
    environment's verified labels where it has them, else the judge's."""
    if mode == "judge" and judged is not None:
        return judged
    return verified if verified else judged


@dataclass
class Agreement:
    """Judge vs environment step labels, accumulated (confusion counts)."""

    gg: int = 0  # judge GOOD, env GOOD
    gb: int = 0  # judge GOOD, env BAD
    bg: int = 0
    bb: int = 0

    def add(self, judge: list[str], env: list[str]) -> None:
        for j, e in zip(judge, env):
            key = ("g" if j == "GOOD" else "b") + ("g" if e == "GOOD" else "b")
            setattr(self, key, getattr(self, key) + 1)

    @property
    def n(self) -> int:
        return self.gg + self.gb + self.bg + self.bb

    def accuracy(self) -> float | None:
        return (self.gg + self.bb) / self.n if self.n else None

    def kappa(self) -> float | None:
        """Cohen's kappa (agreement beyond chance)."""
        if not self.n:
            return None
        po = (self.gg + self.bb) / self.n
        pj, pe = (self.gg + self.gb) / self.n, (self.gg + self.bg) / self.n
        pc = pj * pe + (1 - pj) * (1 - pe)
        return 0.0 if pc >= 1 else (po - pc) / (1 - pc)

    def as_dict(self) -> dict:
        acc, k = self.accuracy(), self.kappa()
        return {
            "steps": self.n,
            "accuracy": None if acc is None else round(acc, 4),
            "kappa": None if k is None else round(k, 4),
            "confusion": {
                "judge_good_env_good": self.gg,
                "judge_good_env_bad": self.gb,
                "judge_bad_env_good": self.bg,
                "judge_bad_env_bad": self.bb,
            },
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict())
