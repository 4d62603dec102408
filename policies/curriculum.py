"""The ladder the questioner climbs: per environment, the difficulty rung dataset tasks come from.

An environment with `level_of(entry_id)` (the code env: 0 = one call that prints a sum, up to loops)
has rungs. Every judged group of a dataset task records the policy's own success rate on it (share
of its samples with outcome >= 0.5; reference samples are not the policy's). A rung is mastered once
at least `min_groups` groups were seen there and the mean success of its last `window` groups reaches
`mastery` (the top of Agent0's 0.3-0.8 band: above it a task mostly agrees with itself and teaches
little). The current rung is the lowest one not mastered, so the policy works where it succeeds
sometimes, or, at the floor, where a verified reference still shows it the way (mixed-policy GRPO).
Environments without levels are a single rung.
"""
from __future__ import annotations


class Ladder:
    def __init__(self, window: int = 8, min_groups: int = 4, mastery: float = 0.8, state: dict | None = None):
        self.window, self.min_groups, self.mastery = window, min_groups, mastery
        # env -> str(level) -> recent success rates, newest last (str keys: the state is JSON)
        self.recent: dict[str, dict[str, list[float]]] = {e: {k: list(v) for k, v in lv.items()}
                                                          for e, lv in (state or {}).items()}

    def record(self, env: str, level: int, outcomes: list[float]) -> None:
        if not outcomes:
            return
        rates = self.recent.setdefault(env, {}).setdefault(str(level), [])
        rates.append(sum(o >= 0.5 for o in outcomes) / len(outcomes))
        del rates[: max(0, len(rates) - self.window)]

    def success(self, env: str, level: int) -> float | None:
        rates = self.recent.get(env, {}).get(str(level), [])
        return sum(rates) / len(rates) if rates else None

    def mastered(self, env: str, level: int) -> bool:
        rates = self.recent.get(env, {}).get(str(level), [])
        return len(rates) >= self.min_groups and sum(rates) / len(rates) >= self.mastery

    def rung(self, env: str, levels: list[int]) -> int:
        """The lowest of `levels` not yet mastered (the highest when all are)."""
        levels = sorted(set(levels))
        return next((lv for lv in levels if not self.mastered(env, lv)), levels[-1])

    def state(self) -> dict:
        return self.recent

    def summary(self, levels_of: dict[str, list[int]]) -> dict:
        """env -> {"rung", "success" per level seen} (status / health)."""
        out = {}
        for env, levels in levels_of.items():
            seen = {lv: round(s, 3) for lv in sorted(set(levels)) if (s := self.success(env, lv)) is not None}
            out[env] = {"rung": self.rung(env, levels), "success": seen}
        return out


def schedule(names: list[str], weights: dict[str, int]) -> list[str]:
    """One cycle of turns between environments, each `weights[name]` times (1 when unnamed, 0 leaves it out),
    spread evenly (smooth weighted round robin): {"a": 3, "b": 1} -> a a b a. Deterministic, so a
    persisted turn counter resumes it."""
    w = {n: int(weights.get(n, 1)) for n in sorted(names)}
    if any(v < 0 for v in w.values()):
        raise ValueError(f"environment weights must be >= 0: {weights}")
    w = {n: v for n, v in w.items() if v > 0}
    if not w:
        raise ValueError(f"every environment has weight 0: {weights}")
    cur, out = dict.fromkeys(w, 0), []
    for _ in range(sum(w.values())):
        for n in w:
            cur[n] += w[n]
        pick = max(w, key=lambda n: (cur[n], -sorted(w).index(n)))
        cur[pick] -= sum(w.values())
        out.append(pick)
    return out
