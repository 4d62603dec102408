"""Weight broadcaster: the promotion gate, the canary, live monitoring and rollback.

Each version moves through the lifecycle in `actors/lifecycles.py`; every change is an `evo.weights_status`
event, and the decisions use `policies/gate.py`.
- `evo.weights_published`: the file's sha256 is verified (poison otherwise) and the version is staged. An
  operator's forced publish (`main.py promote V --force`) goes live at once.
- tick: the newest staged version is evaluated (older staged ones are superseded) against the live one on the
  fixed held-out suite. Pass: it becomes the canary, named in the LIVE pointer, and every replica answers
  `gate.canary_share` of its requests with it (`evo.weights_promoted`, stage canary; share 0 promotes straight
  to live). Fail: rejected (`evo.weights_rejected`). With no gate to run, the next gate's comparator is scored
  meanwhile, so a gate waits for its candidate's scores only.
- while a canary runs, its newest staged successor is evaluated against the canary meanwhile. Once one passed
  (status passed), the canary goes live after `gate.canary_min_s` unless its feedback so far is worse than
  live's, and the successor becomes the canary at once: the gate is off the path from a published version to
  users. A passed version whose baseline did not go live is superseded.
- users' feedback on canary answers against live answers of the same period decides: live
  (`evo.weights_promoted`, stage live; the previous version retires, kept for rollback) or rolled back
  (`evo.weights_rolled_back`).
- the live version's recent feedback is compared with its predecessor's; a significant drop rolls it back to
  the predecessor, whatever brought it live (the gate or an operator).
- the guard (policies/guard.py) scores the newest served version against the base in the background
  (`evo.heldout_scored`); one significantly below it is rolled back, with what descends from it.
Replicas report what they serve (`evo.weights_swapped`); the broadcaster keeps that map. Weights files beyond
`gate.keep_versions` are pruned, never the live, canary, staged or recent live ones. Its state is a
`PromotionBook` (policies/promotion.py), written atomically; evaluations are cached per version.
"""
from __future__ import annotations

import asyncio
import time

from actors.actor import EventActor
from actors.bus import Poison
from actors.events import (Feedback, WeightsPromoted, WeightsPublished, WeightsRef, WeightsRejected,
                           WeightsRolledBack, WeightsSwapped)
from envs.registry import make_envs
from policies.gate import (GateScores, canary_verdict, clearly_worse, decide, gate_heldout, gate_metrics,
                           handoff_verdict, reference_pairs, watch_verdict)
from actors.lifecycles import IllegalTransition, WeightsState as S
from policies.guard import Guard, rollback_plan
from policies.live_policy import LivePolicy
from policies.model_store import BASE_VERSION, version_number
from policies.promotion import PromotionBook, event_time


class Broadcaster(EventActor):
    name = "broadcaster"
    kinds = ("weights_published", "feedback", "weights_swapped")
    batch = 8
    guard: Guard | None = None  # the background check against the base (guard.enabled)

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.policy = await asyncio.to_thread(LivePolicy, s, "gate")  # its engine scores candidates
        self.store, self.base_path, self.engine = self.policy.store, self.policy.base, self.policy.engine
        self.envs = make_envs(s.env)
        # a fixed held-out suite: the first entries of each environment's held-out split (first and second look)
        self.heldout = gate_heldout(self.envs, s.gate)
        self.pairs = await asyncio.to_thread(reference_pairs, self.envs, s.gate.nll_entries)
        (d := s.state / "broadcaster").mkdir(parents=True, exist_ok=True)
        self.scores = GateScores(d / "evals.json", self.envs, self.heldout, self.pairs, first=s.gate.heldout_tasks,
                                 max_new_tokens=s.rollout.max_new_tokens, call_prefix=s.rollout.call_prefix)
        self.book = PromotionBook.load(d / "state.json", self.policy.live_version)
        self.weights_version, self._dirty = self.policy.live_version, False
        self.guard = Guard(s, self.base_path, self.store, self.envs) if s.guard.enabled else None
        self._repair_pointer()
        await self._resume_gates()

    async def _resume_gates(self) -> None:
        for v in [v for v, st in self.book.status.items() if st == S.EVALUATING]:  # a gate a crash cut short
            await self._set(v, S.STAGED, "the broadcaster restarted during its gate: evaluated again")

    def _repair_pointer(self) -> None:
        """LIVE is the projection of the lifecycle on the stream: a pointer written just before a crash that kept
        its status event off the stream names a version that is not live (or a canary that is not one) in the
        lifecycle; it is rewritten from the lifecycle."""
        ptr = self.policy.pointer()
        want, canary = self.book.lifecycle_pointer(ptr.version)
        if (want, canary) != (ptr.version, ptr.canary.version if ptr.canary else None):
            self.log.warning("live.pointer_repaired", pointer=ptr.version, pointer_canary=ptr.canary and ptr.canary.version,
                             live=want, canary=canary)
            self.policy.publish_live(self._ref(want), canary=self._ref(canary) if canary else None,
                                     share=self.settings.gate.canary_share)

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        self.book.save()
        self._dirty = False

    def _ref(self, version: str) -> WeightsRef:
        return self.book.ref(version, self.store, self.base_path)

    async def _set(self, version: str, new: S, reason: str, metrics: dict | None = None) -> None:
        try:
            ev = self.book.move(version, new, reason, metrics)
        except IllegalTransition as exc:  # a bug, not a reason to stop serving: log it and keep going
            self.log.error("lifecycle.illegal", version=version, error=str(exc))
            return
        await self.bus.publish(ev, weights_version=version)
        self._save()
        self.log.info("weights.status", version=version, status=str(new), previous=ev.previous_status, reason=reason[:200])

    def live_version(self) -> str:
        return self.policy.live_version

    # ------------------------------------------------------------------ inputs
    async def handle_weights_published(self, ev: WeightsPublished, msg):
        w = ev.weights
        if not await asyncio.to_thread(self.store.verify, w.path, w.sha256):
            raise Poison(f"{w.version}: file {w.path} is missing or its sha256 does not match")
        self.book.refs[w.version] = w.model_dump()
        if ev.force:
            if w.version != self.live_version():
                await self._go_live(w.version, f"forced by an operator{': ' + ev.reason if ev.reason else ''}", {})
            return
        if self.book.status.get(w.version) is not None:
            return  # known already (a redelivery)
        if version_number(w.version) <= version_number(self.live_version()):
            self.log.info("candidate.stale", version=w.version, live=self.live_version())
            return
        await self._set(w.version, S.STAGED, f"published by the learner (step {w.step}, parent {w.parent})")

    async def handle_feedback(self, ev: Feedback, msg):
        self.book.rate(ev.interaction.weights_version if ev.interaction else ev.weights_version, event_time(ev.occurred_at),
                       float(ev.score))
        self._dirty = True

    async def handle_weights_swapped(self, ev: WeightsSwapped, msg):
        self.book.replicas[ev.replica] = {"version": ev.version, "canary": ev.canary, "swap_ms": round(ev.swap_ms, 1),
                                          "reason": ev.reason, "at": event_time(ev.occurred_at)}
        self._dirty = True

    # ------------------------------------------------------------------ the lifecycle
    async def tick(self) -> None:
        if self.book.canary:
            await self._check_canary()
        if self.book.canary:
            await self._pipeline()
        elif not await self._watch_live():
            if self.book.passed:
                await self._start_canary()
            elif staged := self._staged():
                await self._evaluate(staged)
        if self._dirty:
            self._save()
        await self._prepare()
        await self._guard_tick()

    async def _guard_tick(self) -> None:
        """Hand the guard the newest served version it has not checked; act on its verdicts."""
        if self.guard is None:
            return
        b = self.book
        for c in self.guard.results():
            b.checks[c.version] = c.verdict
            await self.bus.publish(c.event(), weights_version=c.version)
            self.log.info("guard.checked", version=c.version, verdict=c.verdict, result=c.summary())
            if c.verdict == "below" and self.settings.guard.rollback:
                for act, v, to, why in rollback_plan(c.version, f"below the base on held-out {c.summary()}",
                                                     self.live_version(), (b.canary or {}).get("version"),
                                                     (b.passed or {}).get("version"), b.history, b.checks, b.descends):
                    if act == "supersede":
                        b.passed = None
                        await self._set(v, S.SUPERSEDED, why)
                    else:
                        await self._rollback(v, to, why)
            self._save()
        served = (b.canary or {}).get("version") or self.live_version()
        if self.guard.idle and served != BASE_VERSION and served not in b.checks:
            b.checks[served] = ""  # offered: a check that fails is not offered again
            self.guard.offer(served)

    async def _prepare(self) -> None:
        """No gate to run now: the next gate's comparator is scored on the first look meanwhile, one environment a
        tick, so that gate waits for its candidate only."""
        nxt = self.book.next_comparator(self.live_version())
        if (not self._staged() or self.book.passed) and (todo := list(self.scores.unscored(nxt).items())[:1]):
            await asyncio.to_thread(self._score, nxt, True, dict(todo))

    def _staged(self, after: str | None = None) -> list[str]:
        return self.book.staged(keep=lambda v: after is None or self.policy.descends_from(v, after))

    async def _pipeline(self) -> None:
        """A running canary: its successor is gated against it meanwhile, then takes over (see the docstring)."""
        b, g, c = self.book, self.settings.gate, self.book.canary
        if b.passed is None and (staged := self._staged(after=c["version"])):
            await self._evaluate(staged, against=c["version"])
        if b.passed is None:
            return
        ok, why = handoff_verdict(b.scores(c["version"], c["started"]), b.scores(c["baseline"], c["started"]),
                                  elapsed_s=time.time() - c["started"], min_s=g.canary_min_s, margin=g.rollback_margin)
        if ok:
            await self._go_live(c["version"], f"{b.passed['version']} passed its gate against it; {why}", {})
            await self._start_canary()

    def _score(self, version: str, success: bool = True, counts: dict | None = None) -> dict:
        return self.scores.score(self.engine, version, lambda: self._ref(version).path, success, counts)

    async def _evaluate(self, staged: list[str], against: str | None = None) -> None:
        newest, live, g = staged[-1], self.live_version(), self.settings.gate
        against = against or live
        for v in staged[:-1]:
            await self._set(v, S.SUPERSEDED, f"{newest} was staged before it was evaluated")
        await self._set(newest, S.EVALUATING, f"held-out gate against {'live' if against == live else 'canary'} {against}")
        live_s = await asyncio.to_thread(self._score, against)
        base_s = await asyncio.to_thread(self._score, BASE_VERSION, False)  # its NLL, cached
        cand_s = await asyncio.to_thread(self._score, newest, False)  # the likelihood first: seconds
        early = clearly_worse(cand_s, live_s, g.nll_tolerance, base_s, g.base_nll_tolerance)
        if early is None:  # a second look on more entries decides when the first falls short
            ok, why, cand_s, live_s = await asyncio.to_thread(decide, self._score, newest, against, g, base_s,
                                                              *self.scores.looks)
        else:
            ok, why = False, early
        metrics = gate_metrics(cand_s, live_s)
        ref = self._ref(newest)
        if not ok:
            await self._set(newest, S.REJECTED, why, metrics)
            await self.bus.publish(WeightsRejected(weights=ref, candidate_score=cand_s.get("success", -1.0),
                                                   live_score=live_s["success"], reason=why,
                                                   candidate_nll=cand_s.get("nll"), live_nll=live_s.get("nll")),
                                   weights_version=live)
            self.book.counts["rejected"] += 1
            self._prune()
            return
        if g.canary_share <= 0:
            await self._go_live(newest, why, metrics, cand_s, live_s)
            return
        self.book.passed = {"version": newest, "against": against, "why": why, "cand": cand_s, "live": live_s}
        if against != live:  # the running canary's successor
            await self._set(newest, S.PASSED, f"{why}; the canary after {against}", metrics)
            return
        await self._start_canary()

    async def _start_canary(self) -> None:
        """The passed version becomes the canary, if what it was gated against is live; else it is superseded."""
        p, g, live = self.book.passed, self.settings.gate, self.live_version()
        self.book.passed = None
        if p["against"] != live:
            await self._set(p["version"], S.SUPERSEDED, f"gated against {p['against']}, but {live} is live")
            return
        ref = self._ref(p["version"])
        self.policy.publish_live(self._ref(live), canary=ref, share=g.canary_share)  # the pointer first: whoever
        self.book.canary = {"version": p["version"], "baseline": live, "started": time.time()}  # reacts reads it
        await self._set(p["version"], S.CANARY, p["why"], gate_metrics(p["cand"], p["live"]))
        await self.bus.publish(WeightsPromoted(weights=ref, candidate_score=p["cand"]["success"],
                                               live_score=p["live"]["success"], previous=live, stage="canary",
                                               canary_share=g.canary_share, candidate_nll=p["cand"].get("nll"),
                                               live_nll=p["live"].get("nll"), reason=p["why"]),
                               weights_version=live)
        self._save()

    async def _go_live(self, version: str, reason: str, metrics: dict, cand_s: dict | None = None,
                       live_s: dict | None = None) -> None:
        old = self.live_version()
        ref = self._ref(version)
        self.policy.publish_live(ref)  # the pointer first (see _evaluate)
        if self.book.canary and self.book.canary["version"] != version:
            await self._set(self.book.canary["version"], S.RETIRED, f"{version} went live during its canary")
        self.book.canary = None
        if self.book.passed and self.book.passed["version"] == version:  # forced live by an operator
            self.book.passed = None
        if old != version and self.book.status.get(old) == S.LIVE:
            await self._set(old, S.RETIRED, f"replaced by {version}")
        if self.book.status.get(version) != S.LIVE:
            await self._set(version, S.LIVE, reason, metrics)
        self.book.history.append(version)
        self.weights_version = version
        self.book.counts["promoted"] += 1
        await self.bus.publish(WeightsPromoted(weights=ref, candidate_score=(cand_s or {}).get("success", -1.0),
                                               live_score=(live_s or {}).get("success", -1.0), previous=old,
                                               stage="live", candidate_nll=(cand_s or {}).get("nll"),
                                               live_nll=(live_s or {}).get("nll"), reason=reason),
                               weights_version=version)
        self._prune()
        self._save()
        self.log.info("weights.live", version=version, previous=old, reason=reason[:200])

    async def _check_canary(self) -> None:
        c, g = self.book.canary, self.settings.gate
        verdict, why = canary_verdict(self.book.scores(c["version"], c["started"]),
                                      self.book.scores(c["baseline"], c["started"]),
                                      min_feedback=g.canary_min_feedback, margin=g.rollback_margin,
                                      elapsed_s=time.time() - c["started"], max_s=g.canary_max_s)
        if verdict == "live":
            await self._go_live(c["version"], why, {})
        elif verdict == "rollback":
            await self._rollback(c["version"], c["baseline"], why)

    async def _watch_live(self) -> bool:
        if len(self.book.history) < 2:
            return False
        live, prev = self.book.history[-1], self.book.history[-2]
        if live != self.live_version():
            return False
        g = self.settings.gate
        roll, why = watch_verdict(self.book.scores(live), self.book.scores(prev), window=g.watch_feedback,
                                  margin=g.rollback_margin)
        if roll:
            await self._rollback(live, prev, why)
        return roll

    async def _rollback(self, version: str, to: str, reason: str) -> None:
        was_canary = bool(self.book.canary and self.book.canary["version"] == version)
        ref = self._ref(to)
        self.policy.publish_live(ref)  # the pointer first (see _evaluate)
        await self._set(version, S.ROLLED_BACK, reason)
        self.book.canary = None
        if not was_canary:
            self.book.history = [v for v in self.book.history if v != version]
            if self.book.status.get(to) != S.LIVE:
                await self._set(to, S.LIVE, f"rollback from {version}")
            if not self.book.history or self.book.history[-1] != to:
                self.book.history.append(to)
        self.weights_version = to
        self.book.counts["rolled_back"] += 1
        for v, st in list(self.book.status.items()):  # candidates trained from the bad version are not evaluated
            if st == S.STAGED and self.policy.descends_from(v, version):
                await self._set(v, S.SUPERSEDED, f"descends from {version}, which was rolled back")
        await self.bus.publish(WeightsRolledBack(from_version=version, to=ref, reason=reason), weights_version=to)
        self._save()
        self.log.warning("weights.rolled_back", version=version, to=to, reason=reason[:200])

    def _prune(self) -> None:
        protect = {BASE_VERSION, self.live_version(), *self.book.protected()}
        self.store.prune(self.settings.gate.keep_versions, protect=protect)

    def health(self) -> dict:
        b = getattr(self, "book", None)
        g = getattr(self, "guard", None)
        return {**super().health(), **(b.summary() if b else {}), "scores": self.scores.recent() if b else {},
                "guard": g.health() if g else None}
