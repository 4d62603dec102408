"""What the broadcaster decides with before users see a version: the held-out promotion gate. Pure functions plus
the held-out evaluation of one version.

Gate (before any user sees a candidate), on fixed held-out entries:
  success = mean over environments of avg@1 (greedy) on the first `gate.heldout_tasks` entries (a second
            look, on `gate.second_look_tasks` entries of the environments where the candidate fell short,
            decides when it fell short; an environment where live solved none of them is not run when the
            candidate passes without it: `decide`);
  nll     = mean per-token negative log-likelihood of the reference first action of the first
            `gate.nll_entries` entries of each environment (`Environment.reference_action`).
  promote  iff  (success_c >= success_live - gate.tolerance  or  the deciding look's paired one-sided
                p >= gate.success_alpha)  and  nll_c <= nll_live + gate.nll_tolerance
                and  nll_c <= nll_base + gate.base_nll_tolerance  (no ratchet of small drifts).
Success on a handful of tasks is coarse (one task flips it by 1/n); the likelihood of known-good
actions is continuous, so damaged weights fail the gate even when neither version solves a task. Whether
a served version is below the base is the guard's question (policies/promotion/guard.py), on a suite with power.

The canary and live watch on users' feedback after promotion are in policies/promotion/feedback_checks.py.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Callable

from policies.chat import assistant_text, render
from policies.promotion.models import GateScore
from policies.stats import paired_test
from policies.weights.model_store import atomic_write_bytes


# ---------------------------------------------------------------------------- held-out evaluation
def _references(envs: dict, n: int) -> list[tuple[str, object]]:
    """(entry id, reference action) for the first `n` held-out entries of each environment that has one."""
    out = []
    for env in envs.values():
        ref_of = getattr(env, "reference_action", None)
        if ref_of is None:
            continue
        got = 0
        for eid in env.entries("heldout"):
            if got >= n:
                break
            ref = ref_of(eid)
            if ref is not None:
                out.append((eid, ref))
                got += 1
    return out


def reference_pairs(envs: dict, n: int) -> list[tuple[str, str]]:
    """(prompt, reference completion) for the first `n` held-out entries of each environment that has
    reference actions."""
    return [(render(ref.messages, ref.tools), assistant_text(ref.action) + "<|im_end|>") for _, ref in _references(envs, n)]


def gate_heldout(envs: dict, gate_settings) -> dict[str, list[str]]:
    """env -> the held-out entries the gate's episodes may use: the first look's, then the second look's."""
    n = max(gate_settings.heldout_tasks, gate_settings.second_look_tasks)
    return {name: env.entries("heldout")[:n] for name, env in envs.items()}


def gate_entries(envs: dict, gate_settings) -> set[str]:
    """Every held-out entry the gate looks at (episodes or reference likelihood): a measurement that selects
    nothing on them leaves these out (the gate chose which versions were served by them)."""
    seen = {e for ids in gate_heldout(envs, gate_settings).values() for e in ids}
    return seen | {eid for eid, _ in _references(envs, gate_settings.nll_entries)}


def reference_nll(engine, pairs: list[tuple[str, str]]) -> float:
    """Mean per-token NLL of the reference completions (lower is better)."""
    scored = engine.sequence_logprobs(pairs)
    tokens = sum(n for _, n in scored)
    return -sum(lp for lp, _ in scored) / max(1, tokens)


def _nll_checks(
    cand: GateScore, live: GateScore, nll_tolerance: float, base: GateScore | None, base_tolerance: float
) -> list[str]:
    why, c = [], cand.nll
    if c is not None and live.nll is not None and c > live.nll + nll_tolerance:
        why.append(f"reference NLL {c:.3f} > live {live.nll:.3f} + {nll_tolerance}")
    if base and c is not None and base.nll is not None and c > base.nll + base_tolerance:
        # small steps each within the tolerance to live must not add up to a model far from the base
        why.append(f"reference NLL {c:.3f} > base {base.nll:.3f} + {base_tolerance} (drift)")
    return why


def clearly_worse(
    cand: GateScore, live: GateScore, nll_tolerance: float, base: GateScore | None = None, base_tolerance: float = math.inf
) -> str | None:
    """Early stop: the likelihood check alone (seconds) already fails the candidate, so the greedy held-out
    episodes (most of a gate's time) need not run. None when the full evaluation must decide."""
    why = _nll_checks(cand, live, nll_tolerance, base, base_tolerance)
    return "; ".join(why) + " (stopped early: held-out episodes not run)" if why else None


def drop_p(cand: list[float], live: list[float]) -> float:
    """One-sided p-value that the candidate does worse than live on the same entries (per-entry outcomes in the
    same order): the exact sign-flip test of `policies/stats.paired_test`, whose null distribution is symmetric,
    so P(S <= observed) is half the two-sided p. 1.0 when the candidate is not below live there."""
    t = paired_test(live, cand)
    return t["p_value"] / 2 if t["mean_diff"] < 0 else 1.0


def gate(
    cand: GateScore,
    live: GateScore,
    tolerance: float,
    nll_tolerance: float,
    base: GateScore | None = None,
    base_tolerance: float = math.inf,
    p: float | None = None,
    alpha: float = 1.0,
) -> tuple[bool, str]:
    """(promote?, reason) from `GateScores` scores of the candidate, live and (its NLL) the base. Falling short of
    live's success by more than `tolerance` rejects when `p` (`drop_p` on the entries both were scored on) is
    below `alpha`, or when no `p` is given (the point rule)."""
    why, note = [], ""
    if cand.success + tolerance < live.success:
        short = f"held-out success {cand.success:.3f} < live {live.success:.3f} - {tolerance}"
        if p is None or p < alpha:
            why.append(short + (f" (paired p = {p:.3f})" if p is not None else ""))
        else:
            note = f" ({short}, but not significantly: paired p = {p:.3f} >= {alpha})"
    why += _nll_checks(cand, live, nll_tolerance, base, base_tolerance)
    if why:
        return False, "; ".join(why)
    nll = f", reference NLL {cand.nll:.3f} vs {live.nll:.3f}" if cand.nll is not None and live.nll is not None else ""
    return True, f"held-out success {cand.success:.3f} vs live {live.success:.3f}{nll}{note}"


def decide(
    score: Callable[..., GateScore],
    cand: str,
    live: str,
    g,
    base: GateScore | None,
    first: dict[str, int],
    full: dict[str, int],
    paired: Callable[[str, str, dict], float] | None = None,
) -> tuple[bool, str, GateScore, GateScore]:
    """(promote?, reason, candidate's scores, live's scores): the gate on the first `first[env]` held-out
    entries; when the candidate falls short of live's success there, a second look scores both on
    `full[env]` entries of each environment where it fell short, and that decides. Live was promoted
    because it did well on the first entries, so its score there is biased upward; one greedy entry out
    of two flips a gate. Episodes that cannot change the decision are not run: an environment where live
    solved none of its first entries, when the candidate passes with 0 there (its `success` is then that
    lower bound). A candidate that is then rejected or superseded never runs them; one that is served runs
    them when it is the next gate's comparator. `score(version, counts=...)` returns `GateScores.view`-shaped
    scores. With `paired(cand, live, counts)` (`GateScores.drop_p`), the deciding look rejects on success only
    when the drop is significant at `g.success_alpha`: a version that did well on these few entries by luck is
    then not a bar no successor clears (a 60-minute hour served nothing new for its last 20 minutes that way)."""
    lv = score(live, counts=first)
    # where live solved none of its first entries the candidate cannot fall short: with 0 there (the least it
    # can score) it may already pass, and then those episodes cannot change the decision and are not run
    zero = [e for e in first if lv.envs.get(e, 0.0) <= 0.0]
    part = {e: n for e, n in first.items() if e not in zero}
    c = score(cand, counts=part) if part else score(cand, success=False)
    low = sum(c.envs[e] for e in part) / max(1, len(first))
    if zero and low + g.tolerance >= lv.success_or(0.0):
        c = c.model_copy(update={"success": low})  # a lower bound: the environments in `zero` were not run
        ok, why = gate(c, lv, g.tolerance, g.nll_tolerance, base, g.base_nll_tolerance)
        return ok, f"{why} ({', '.join(zero)} not run: live solved none of its first entries there)", c, lv
    c = score(cand, counts=first)
    ok, why = gate(c, lv, g.tolerance, g.nll_tolerance, base, g.base_nll_tolerance)  # short: look again
    again = {e: full[e] if c.envs.get(e, 0.0) < lv.envs.get(e, 0.0) else n for e, n in first.items()}
    if ok or clearly_worse(c, lv, g.nll_tolerance, base, g.base_nll_tolerance):
        return ok, why, c, lv
    if again != first:
        c, lv = score(cand, counts=again), score(live, counts=again)
    p = paired(cand, live, again) if paired else None
    ok, why2 = gate(c, lv, g.tolerance, g.nll_tolerance, base, g.base_nll_tolerance, p, g.success_alpha)
    if again == first:
        return ok, why2, c, lv
    looked = ", ".join(f"{n} {e}" for e, n in again.items() if n != first[e])
    return ok, f"{why2} (second look on {looked} entries; on the first {min(first.values())}: {why})", c, lv


class GateScores:
    """Each version's gate scores, cached on disk per version (the live version's never change, so a gate
    evaluates only the candidate): the reference-action NLL and the greedy outcome of each held-out entry
    scored so far (`heldout[env]` in order; a first look scores the first `first` of them, a second look
    more). Cached scores hold only for the same suite: entries, reference actions and decoding settings."""

    def __init__(
        self,
        path: Path,
        envs: dict,
        heldout: dict[str, list[str]],
        pairs,
        *,
        max_new_tokens: int,
        call_prefix: bool,
        first: int | None = None,
    ):
        self.path, self.envs, self.heldout, self.pairs = Path(path), envs, heldout, pairs
        self.opts = {"max_new_tokens": max_new_tokens, "call_prefix": call_prefix}
        full = {e: len(ids) for e, ids in heldout.items()}
        self.looks = ({e: min(n, first) if first else n for e, n in full.items()}, full)  # (first look, full)
        self.suite = hashlib.sha256(json.dumps([heldout, pairs, max_new_tokens, call_prefix]).encode()).hexdigest()[:16]
        cached = json.loads(self.path.read_text()) if self.path.exists() else {}
        fresh = cached.get("_suite") == self.suite
        self.scores: dict[str, dict] = {v: x for v, x in cached.items() if isinstance(x, dict) and fresh}

    def score(
        self, engine, version: str, weights: Callable[[], str], success: bool = True, counts: dict[str, int] | None = None
    ) -> GateScore:
        """The version's scores on the first `counts[env]` entries (the first look by default), loading
        `weights()` into `engine` when something is missing; `success=False` computes only the likelihood part
        (seconds)."""
        from policies.rollout import evaluate

        counts = counts or self.looks[0]
        sc = self.scores.setdefault(version, {})
        done = sc.setdefault("outcomes", {})
        todo = {e: self.heldout[e][len(done.get(e, [])) : n] for e, n in counts.items()} if success else {}
        need_nll = bool(self.pairs) and "nll" not in sc
        if need_nll or any(todo.values()):
            if engine.version != version:
                engine.load_weights(weights(), version)
            if need_nll:
                sc["nll"] = reference_nll(engine, self.pairs)
            for e, ids in todo.items():
                if ids:
                    res = evaluate(engine, self.envs[e], ids, k=1, **self.opts)
                    done.setdefault(e, []).extend(res["entries"][i][0] for i in ids)
            atomic_write_bytes(self.path, json.dumps({**self.scores, "_suite": self.suite}).encode())
        return self.view(version, counts if success else {})

    def unscored(self, version: str) -> dict[str, int]:
        """env -> size of the first look, for the environments where the version's outcomes are not all cached."""
        done = self.scores.get(version, {}).get("outcomes", {})
        return {e: n for e, n in self.looks[0].items() if len(done.get(e, [])) < n}

    def view(self, version: str, counts: dict[str, int]) -> GateScore:
        """nll, the mean greedy outcome of the first counts[env] entries of each environment and their mean over
        environments, from what is cached."""
        sc = self.scores.get(version, {})
        per = {e: sc.get("outcomes", {}).get(e, [])[:n] for e, n in counts.items()}
        envs = {e: sum(x) / max(1, len(x)) for e, x in per.items()}
        return GateScore(nll=sc.get("nll"), envs=envs, success=sum(envs.values()) / max(1, len(envs)) if counts else None)

    def drop_p(self, cand: str, live: str, counts: dict[str, int]) -> float:
        """`drop_p` on the cached outcomes of the first `counts[env]` entries of each environment, pooled."""
        got = {
            v: [x for e, n in counts.items() for x in self.scores.get(v, {}).get("outcomes", {}).get(e, [])[:n]]
            for v in (cand, live)
        }
        if len(got[cand]) != len(got[live]) or not got[cand]:
            raise ValueError(f"gate outcomes of {cand} and {live} are not scored on the same entries: {counts}")
        return drop_p(got[cand], got[live])

    def recent(self, n: int = 5) -> dict:
        return {v: {k: round(x, 3) for k, x in self.view(v, self.looks[0]).flat().items()} for v in list(self.scores)[-n:]}
