"""Weight broadcaster: the promotion gate, the canary, live monitoring, the guard against the base, rollback.

Each version moves through the lifecycle in `actors/lifecycles.py`, every change an `evo.weights_status` event (README, "How
one improvement cycle flows", items 3 and 5). Inputs: `evo.weights_published` (sha256 verified, else poison; staged, or live
at once when forced by an operator), users' feedback, replicas' reports. A tick: the canary's feedback verdict, or its
newest staged successor gated against it (`policies/gate.py`) and handed over after `gate.canary_min_s`; with no canary, the
live watch and the next gate, the next comparator scored meanwhile; then the guard's verdicts (`policies/guard.py`) and the
next version it checks. It alone moves the LIVE pointer (`LivePolicy.announce`: the bus's key-value bucket, then its copy).
Files beyond `gate.keep_versions` are pruned (and their objects on the bus), never live, canary, staged, recent live ones or
the guard's anchor. State: a `PromotionBook` (`policies/promotion.py`), written atomically; evaluations cached per version.
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
from policies.guard import Guard
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
        await self.policy.attach(self.bus.js, writer=True)  # the pointer's bucket: its copy put there if it differs
        await self._resume_gates()

    async def _resume_gates(self) -> None:
        for v in [v for v, st in self.book.status.items() if st == S.EVALUATING]:  # a gate a crash cut short
            await self._set(v, S.STAGED, "the broadcaster restarted during its gate: evaluated again")

    def _repair_pointer(self) -> None:
        if fixed := self.book.repair_pointer(self.policy, self._ref, self.settings.gate.canary_share):
            self.log.warning("live.pointer_repaired", **dict(zip(("pointer", "pointer_canary", "live", "canary"), fixed)))

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
        if (here := await asyncio.to_thread(self.policy.obtain, w)) is None:  # fetched where this node lacks it
            raise Poison(f"{w.version}: file {w.path} is missing or its sha256 does not match")
        self.book.refs[w.version] = here.model_dump()  # this node's path: the gate and the pointer use it
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
        self.book.swapped(ev)
        self._dirty = True

    # ------------------------------------------------------------------ the lifecycle
    async def tick(self) -> None:
        if self.book.canary:
            await self._check_canary()
        if self.book.hold:  # the guard found the served lineage below the base: nothing new until it clears one
            pass
        elif self.book.canary:
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
        """The guard's verdicts (a version below the base rolls back), then the next served version it checks."""
        if self.guard is None:
            return
        for c in self.guard.results():  # a check whose actions fail stays pending and is carried out next tick
            for act, v, to, why in self.guard.undo(c, self.book, self.live_version(), self.settings.guard.rollback):
                await (self._set(v, S.SUPERSEDED, why) if act == "supersede" else self._rollback(v, to, why))
            await self.bus.publish(c.event(), weights_version=c.version)  # the event id derives from the check
            self.guard.done(c, self.book, self.settings.guard.rollback)
            self._save()
        if self.book.hold:  # the guard checks the newest candidate; older ones will not be served
            for v in self._staged()[:-1]:
                await self._set(v, S.SUPERSEDED, f"a newer candidate came while serving was held ({self.book.hold})")
        self.guard.offer_newest(self.book, self.live_version(), self._staged())

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
                                                              *self.scores.looks, self.scores.drop_p)
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
        await self.policy.announce(self._ref(live), canary=ref, share=g.canary_share)  # the pointer first: whoever
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
        await self.policy.announce(ref)  # the pointer first (see _evaluate)
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
        h = self.book.history
        if len(h) < 2 or h[-1] != self.live_version():
            return False
        live, prev = h[-1], h[-2]
        g = self.settings.gate
        roll, why = watch_verdict(self.book.scores(live), self.book.scores(prev), window=g.watch_feedback,
                                  margin=g.rollback_margin)
        if roll:
            await self._rollback(live, prev, why)
        return roll

    async def _rollback(self, version: str, to: str, reason: str) -> None:
        was_canary = bool(self.book.canary and self.book.canary["version"] == version)
        await self.policy.announce(ref := self._ref(to))  # the pointer first (see _evaluate)
        await self._set(version, S.ROLLED_BACK, reason)
        self.book.canary = None
        if not was_canary:  # what went live after `to` leaves the history with the version rolled back
            h = self.book.history
            self.book.history = h[:len(h) - h[::-1].index(to)] if to in h else [v for v in h if v != version] + [to]
            if self.book.status.get(to) != S.LIVE:
                await self._set(to, S.LIVE, f"rollback from {version}")
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
        b, g = getattr(self, "book", None), getattr(self, "guard", None)
        return {**super().health(), **(b.summary() if b else {}), "scores": self.scores.recent() if b else {},
                "guard": g and g.health()}
