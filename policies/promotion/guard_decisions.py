"""The guard's decisions, pure: one check of a version against the base (`Check`), its verdict (`look`: a
sequential test with a futility stop), what a `below` verdict undoes (`rollback_plan`), where a rollback goes
(`anchor`), the suite a check scores (`guard_suite`) and the rest after a check (`rest_s`). The background
scorer that makes checks is `policies/promotion/guard.py`; the module docstring there says how the test works.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.stats import fewer_successes
from policies.weights.model_store import BASE_VERSION


@dataclass
class Check:
    version: str
    env: str
    per_entry: list[float]  # the version's avg@k on the entries scored so far, in suite order
    base: list[float]  # the base's avg@base_k on the same entries
    suite_entries: int
    k: int
    base_k: int = 8
    duration_s: float = 0.0
    verdict: str = ""  # "" while running, then not_below | below
    stats: dict = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        return len(self.per_entry) >= self.suite_entries

    def event(self):
        from actors.events import HeldoutScored, derived_id

        return HeldoutScored(
            event_id=derived_id("heldout_scored", f"{self.version}:{self.env}:{len(self.per_entry)}:{self.verdict}"),
            version=self.version,
            env=self.env,
            entries=len(self.per_entry),
            suite_entries=self.suite_entries,
            k=self.k,
            verdict=self.verdict,
            duration_s=self.duration_s,
            reason=self.summary(),
            **self.stats,
        )

    def summary(self) -> str:
        s = self.stats
        return (
            f"{self.env} {100 * s['base_avg']:.1f}% -> {100 * s['avg']:.1f}% ({100 * s['delta']:+.1f} points, "
            f"p={s['p_value']:.4f}, +{s['wins']}/-{s['losses']}, {len(self.per_entry)} of {self.suite_entries} "
            f"entries x{self.k} vs the base's x{self.base_k}{', stopped early' if not self.complete else ''})"
        )


def compare(version: list[float], k: int, base: list[float], base_k: int) -> dict:
    """Success rates and the one-sided exact p that the version succeeds less often (per-entry avg@k in)."""
    avg, base_avg = sum(version) / len(version), sum(base) / len(base)
    p = fewer_successes([round(x * base_k) for x in base], base_k, [round(x * k) for x in version], k)
    return {
        "avg": avg,
        "base_avg": base_avg,
        "delta": avg - base_avg,
        "p_value": p,
        "wins": sum(v > b for v, b in zip(version, base)),
        "losses": sum(v < b for v, b in zip(version, base)),
    }


def look(check: Check, early_fraction: float, alpha: float) -> str:
    """After a chunk: "" (go on), "not_below" or "below". Early only for futility (no loss so far)."""
    if not check.per_entry:
        return ""
    check.stats = compare(check.per_entry, check.k, check.base, check.base_k)
    if check.complete:
        return "below" if check.stats["delta"] < 0 and check.stats["p_value"] < alpha else "not_below"
    # no loss so far, and evidence of it: a version that solved nothing yet has not shown it is no worse
    if len(check.per_entry) >= early_fraction * check.suite_entries and check.stats["delta"] >= 0 and check.stats["avg"] > 0:
        return "not_below"
    return ""


def rest_s(busy_s: float, duty: float) -> float:
    """How long the guard waits after a check of `busy_s` seconds so that checking takes at most `duty` of the wall
    time: busy_s * (1 / duty - 1); none at duty 1 (the next check whenever it is idle)."""
    return max(0.0, busy_s * (1.0 / duty - 1.0))


def rollback_plan(
    bad: str, why: str, live: str, canary: str | None, passed: str | None, history: list[str], checks: dict[str, str], descends
) -> list[tuple[str, str, str | None, str]]:
    """What a `below` verdict on `bad` undoes, in order: ("supersede", passed, None, reason), ("rollback", canary,
    live, reason), ("rollback", live, to, reason). A version is undone when it is `bad` or descends from it
    (`descends(a, b)`: a is b or was trained from it) and was not checked no worse itself (`checks`: version ->
    verdict); live goes back to the newest version that went live and was checked no worse, never one that
    descends from `bad`, else the base; a running canary ends with the live version it was measured against."""

    def hit(v):
        return v is not None and checks.get(v) != "not_below" and descends(v, bad)

    def reason(v):
        return why if v == bad else f"descends from {bad}, {why}"

    to = next((v for v in reversed(history) if checks.get(v) == "not_below" and not descends(v, bad)), BASE_VERSION)
    out = [("supersede", passed, None, reason(passed))] if hit(passed) else []
    live_goes = hit(live) and live != to
    if hit(canary) or (canary is not None and live_goes):  # a canary whose baseline goes ends with it
        out.append(("rollback", canary, live, reason(canary) if hit(canary) else f"{live}, its baseline, goes: {why}"))
    if live_goes:
        out.append(("rollback", live, to, f"{reason(live)}; back to {to}, the newest live version no worse than the base"))
    return out


def guard_suite(envs: dict, g) -> dict[str, list[str]]:
    """env -> entries the guard scores: the named environments only, `g.per_category` held-out entries of each named
    category, the categories interleaved so that a first half (an early stop) holds all of them."""
    from policies.evaluation.heldout import suite

    return {
        env: interleave(ids, envs[env].category_of)
        for env, ids in suite(envs, {env: g.per_category for env in g.suite}, g.suite).items()
    }


def interleave(entries: list[str], category_of) -> list[str]:
    """Round-robin over the categories, each in its own order: add_1, muladd_1, add_2, muladd_2, ..."""
    by: dict[str, list[str]] = {}
    for e in entries:
        by.setdefault(category_of(e), []).append(e)
    lists = list(by.values())
    return [e for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst) for e in [lst[i]]]


def anchor(history: list[str], checks: dict[str, str]) -> str | None:
    """The newest version that went live and was checked no worse than the base: where a rollback goes (its
    file is kept)."""
    return next((v for v in reversed(history) if checks.get(v) == "not_below"), None)
