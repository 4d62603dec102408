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

import random


class Ladder:
    def __init__(self, window: int = 8, min_groups: int = 4, mastery: float = 0.8, state: dict | None = None):
        self.window, self.min_groups, self.mastery = window, min_groups, mastery
        # env -> str(level) -> recent success rates, newest last (str keys: the state is JSON)
        self.recent: dict[str, dict[str, list[float]]] = {
            e: {k: list(v) for k, v in lv.items()} for e, lv in (state or {}).items()
        }

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


def ordered_pool(entries: list[str], round_: int, seed: int = 0) -> list[str]:
    pool = sorted(entries)
    random.Random(f"{seed}:{round_}").shuffle(pool)
    return pool


def train_pool(envs: dict) -> list[str]:
    """ "env<TAB>entry" for every train entry of every environment (held-out entries never appear)."""
    return [f"{name}\t{e}" for name, env in envs.items() for e in env.entries("train")]


class DatasetPools:
    """Dataset tasks: per environment, its train pool in a fixed shuffled order per round, with a persisted
    cursor; environments take turns by weight (`schedule`), and a laddered one skips entries off its rung."""

    def __init__(self, envs: dict, st: dict):
        self.envs = envs
        self.pools = {name: sorted(env.entries("train")) for name, env in envs.items()}
        self.pools = {name: pool for name, pool in self.pools.items() if pool}
        self.cursors: dict[str, dict] = st.get("cursors", {})  # env -> {"round", "pos"}
        self.turn = st.get("turn", 0)
        self.levels = {
            name: sorted({env.level_of(e) for e in self.pools[name]}) if hasattr(env, "level_of") else [0]
            for name, env in envs.items()
            if name in self.pools
        }

    def state(self) -> dict:
        return {"cursors": self.cursors, "turn": self.turn}

    def next_entry(self, ladder: Ladder, env_weights: dict[str, int]) -> tuple[str, int]:
        """("env<TAB>entry", round) of the next dataset task."""
        turns = schedule(list(self.pools), env_weights)
        name = turns[self.turn % len(turns)]
        self.turn += 1
        env, pool = self.envs[name], self.pools[name]
        rung = ladder.rung(name, self.levels[name])
        cur = self.cursors.get(name, {"round": 0, "pos": 0})
        r, p = cur["round"], cur["pos"]
        order = ordered_pool(pool, r)
        for _ in range(2 * len(pool)):  # at most two passes: every rung has entries
            if p >= len(pool):
                r, p = r + 1, 0
                order = ordered_pool(pool, r)
            entry = order[p]
            p += 1
            if not hasattr(env, "level_of") or env.level_of(entry) == rung:
                break
        self.cursors[name] = {"round": r, "pos": p}
        return f"{name}\t{entry}", r
