"""Weight broadcaster: carries out the promotion lifecycle that `policies/promotion/plan.py` decides.

Each version moves through the lifecycle in `actors/lifecycles.py`, every change an
`evo.weights_status` event (README, "How one improvement cycle flows", items 3 and 5). Inputs:
`evo.weights_published` (sha256 verified, else poison; staged, or live at once when forced by an
operator), users' feedback, replicas' reports. A tick asks the plan what to do (a canary's verdict,
a gate, a handoff, the live watch, a rollback) and does it here: the held-out gate's scoring
(`policies/promotion/gate.py`), the LIVE pointer (`LivePolicy.announce`: the bus's key-value bucket, then its
copy; this actor alone moves it, always before the event that announces it), the events, pruning.
Then the next gate's comparator is scored meanwhile, and the guard's verdicts (`policies/promotion/guard.py`)
are carried out. Files beyond `gate.keep_versions` are pruned (and their objects on the bus), never
live, canary, staged, recent live ones or the guard's anchor. State: a `PromotionBook`
(`policies/promotion/book.py`), written atomically; evaluations cached per version.
"""

from __future__ import annotations

import asyncio
import time

from actors.actor import EventActor
from actors.bus import Poison
from actors.events import (
    Feedback,
    WeightsPromoted,
    WeightsPublished,
    WeightsRef,
    WeightsRejected,
    WeightsRolledBack,
    WeightsSwapped,
)
from actors.lifecycles import IllegalTransition
from actors.messages import event_time
from envs.registry import make_envs
from policies.engines.live_policy import LivePolicy
from policies.promotion.book import PromotionBook
from policies.promotion.gate import GateScores, clearly_worse, decide, gate_heldout, reference_pairs
from policies.promotion.guard import Guard
from policies.promotion.models import (
    Action,
    GateOutcome,
    GateScore,
    GoLive,
    Ignore,
    Prune,
    Reject,
    RollBack,
    StartCanary,
    StartGate,
)
from policies.promotion.plan import comparator_todo, gated, held, plan, published, resumed, undone
from policies.weights.model_store import BASE_VERSION


class Broadcaster(EventActor):
    name = "broadcaster"
    kinds = ("weights_published", "feedback", "weights_swapped")
    batch = 8
    guard: Guard | None = None  # the background check against the base (guard.enabled)

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.policy = await asyncio.to_thread(LivePolicy, s, "gate")  # its engine scores candidates
        self.store, self.base_path = self.policy.store, self.policy.base
        self.engine = self.policy.engine
        self.envs = make_envs(s.env)
        # a fixed held-out suite: the first entries of each environment's held-out split (first
        # and second look)
        self.heldout = gate_heldout(self.envs, s.gate)
        self.pairs = await asyncio.to_thread(reference_pairs, self.envs, s.gate.nll_entries)
        (d := s.state / "broadcaster").mkdir(parents=True, exist_ok=True)
        self.scores = GateScores(
            d / "evals.json",
            self.envs,
            self.heldout,
            self.pairs,
            first=s.gate.heldout_tasks,
            max_new_tokens=s.rollout.max_new_tokens,
            call_prefix=s.rollout.call_prefix,
        )
        self.book = PromotionBook.load(d / "state.json", self.policy.live_version)
        self.weights_version, self._dirty = self.policy.live_version, False
        self.guard = Guard(s, self.base_path, self.store, self.envs) if s.guard.enabled else None
        self._repair_pointer()
        # the pointer's bucket: its copy put there if it differs
        await self.policy.attach(self.bus.js, writer=True)
        await self._resume_gates()

    async def _resume_gates(self) -> None:
        await self._carry_out(resumed(self.book))

    def _repair_pointer(self) -> None:
        fixed = self.book.repair_pointer(self.policy, self._ref, self.settings.gate.canary_share)
        if fixed:
            names = ("pointer", "pointer_canary", "live", "canary")
            self.log.warning("live.pointer_repaired", **dict(zip(names, fixed)))

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        self.book.save()
        self._dirty = False

    def _ref(self, version: str) -> WeightsRef:
        return self.book.ref(version, self.store, self.base_path)

    def live_version(self) -> str:
        return self.policy.live_version

    # ------------------------------------------------------------------ inputs
    async def handle_weights_published(self, ev: WeightsPublished, msg):
        w = ev.weights
        here = await asyncio.to_thread(self.policy.obtain, w)  # fetched where this node lacks it
        if here is None:
            raise Poison(f"{w.version}: file {w.path} is missing or its sha256 does not match")
        self.book.refs[w.version] = here  # this node's path: the gate and the pointer use it
        await self._carry_out(published(self.book, ev, self.live_version()))

    async def handle_feedback(self, ev: Feedback, msg):
        version = ev.interaction.weights_version if ev.interaction else ev.weights_version
        self.book.rate(version, event_time(ev.occurred_at), float(ev.score))
        self._dirty = True

    async def handle_weights_swapped(self, ev: WeightsSwapped, msg):
        self.book.swapped(ev)
        self._dirty = True

    # ------------------------------------------------------------------ the lifecycle
    async def tick(self) -> None:
        await self._carry_out(plan(self.book, time.time(), self.settings.gate, self.live_version(), self.policy.descends_from))
        if self._dirty:
            self._save()
        await self._prepare()
        await self._guard_tick()

    async def _guard_tick(self) -> None:
        """The guard's verdicts (a version below the base rolls back), then the next served version
        it checks."""
        if self.guard is None:
            return
        rollback = self.settings.guard.rollback
        # a check whose actions fail stays pending and is carried out next tick
        for c in self.guard.results():
            await self._carry_out(undone(self.guard.undo(c, self.book, self.live_version(), rollback)))
            # the event id derives from the check
            await self.bus.publish(c.event(), weights_version=c.version)
            self.guard.done(c, self.book, rollback)
            self._save()
        await self._carry_out(held(self.book, self.book.staged()))
        self.guard.offer_newest(self.book, self.live_version(), self.book.staged())

    async def _prepare(self) -> None:
        """No gate to run now: the next gate's comparator is scored on the first look meanwhile,
        one environment a tick, so that gate waits for its candidate only."""
        todo = comparator_todo(self.book, self.live_version(), self.book.staged(), self.scores.unscored)
        if todo:
            await asyncio.to_thread(self._score, todo[0], True, todo[1])

    def _score(self, version: str, success: bool = True, counts: dict | None = None) -> GateScore:
        def path() -> str:
            return self._ref(version).path

        return self.scores.score(self.engine, version, path, success, counts)

    # ------------------------------------------------------------------ carrying actions out
    async def _carry_out(self, actions: list[Action]) -> None:
        for a in actions:
            do = {
                StartGate: self._gate,
                StartCanary: self._start_canary,
                GoLive: self._go_live,
                RollBack: self._rollback,
                Reject: self._reject,
                Prune: self._prune,
                Ignore: self._stale,
            }.get(type(a), self._record)
            await do(a)

    async def _record(self, a: Action, live: str | None = None) -> None:
        """`a` in the book (`live`: the version served before it), and each status change it made
        as an event."""
        for ch in self.book.apply(a, live or self.live_version(), self.policy.descends_from):
            if isinstance(ch, IllegalTransition):  # a bug, not a reason to stop serving: log it
                self.log.error("lifecycle.illegal", error=str(ch))
                continue
            await self.bus.publish(ch, weights_version=ch.version)
            self._save()
            self.log.info(
                "weights.status", version=ch.version, status=str(ch.status), previous=ch.previous_status, reason=ch.reason[:200]
            )

    async def _gate(self, a: StartGate) -> None:
        """The held-out gate of `a.version` against `a.against`, then what its outcome leads to."""
        await self._record(a)
        g, newest, against = self.settings.gate, a.version, a.against
        live_s = await asyncio.to_thread(self._score, against)
        base_s = await asyncio.to_thread(self._score, BASE_VERSION, False)  # its NLL, cached
        cand_s = await asyncio.to_thread(self._score, newest, False)  # the likelihood first: seconds
        early = clearly_worse(cand_s, live_s, g.nll_tolerance, base_s, g.base_nll_tolerance)
        if early is None:  # a second look on more entries decides when the first falls short
            ok, why, cand_s, live_s = await asyncio.to_thread(
                decide, self._score, newest, against, g, base_s, *self.scores.looks, self.scores.drop_p
            )
        else:
            ok, why = False, early
        outcome = GateOutcome(newest, against, ok, why, cand_s, live_s)
        await self._carry_out(gated(self.book, outcome, time.time(), g, self.live_version(), self.policy.descends_from))

    async def _reject(self, a: Reject) -> None:
        live = self.live_version()
        await self._record(a, live)
        ev = WeightsRejected(
            weights=self._ref(a.version),
            candidate_score=a.cand.success_or(),
            live_score=a.live.success_or(),
            reason=a.reason,
            candidate_nll=a.cand.nll,
            live_nll=a.live.nll,
        )
        await self.bus.publish(ev, weights_version=live)

    async def _start_canary(self, a: StartCanary) -> None:
        g, live, ref = self.settings.gate, self.live_version(), self._ref(a.version)
        # the pointer first: whoever reacts to the event reads it
        await self.policy.announce(self._ref(live), canary=ref, share=g.canary_share)
        await self._record(a, live)
        ev = WeightsPromoted(
            weights=ref,
            candidate_score=a.cand.success_or(),
            live_score=a.live.success_or(),
            previous=live,
            stage="canary",
            canary_share=g.canary_share,
            candidate_nll=a.cand.nll,
            live_nll=a.live.nll,
            reason=a.reason,
        )
        await self.bus.publish(ev, weights_version=live)
        self._save()

    async def _go_live(self, a: GoLive) -> None:
        old, ref = self.live_version(), self._ref(a.version)
        cand, live_s = a.cand or GateScore(), a.live or GateScore()
        await self.policy.announce(ref)  # the pointer first (see _start_canary)
        await self._record(a, old)
        self.weights_version = a.version
        ev = WeightsPromoted(
            weights=ref,
            candidate_score=cand.success_or(),
            live_score=live_s.success_or(),
            previous=old,
            stage="live",
            candidate_nll=cand.nll,
            live_nll=live_s.nll,
            reason=a.reason,
        )
        await self.bus.publish(ev, weights_version=a.version)
        self._save()
        self.log.info("weights.live", version=a.version, previous=old, reason=a.reason[:200])

    async def _rollback(self, a: RollBack) -> None:
        await self.policy.announce(ref := self._ref(a.to))  # the pointer first (see _start_canary)
        await self._record(a)
        self.weights_version = a.to
        ev = WeightsRolledBack(from_version=a.version, to=ref, reason=a.reason)
        await self.bus.publish(ev, weights_version=a.to)
        self._save()
        self.log.warning("weights.rolled_back", version=a.version, to=a.to, reason=a.reason[:200])

    async def _prune(self, a: Prune) -> None:
        protect = {BASE_VERSION, self.live_version(), *self.book.protected()}
        self.store.prune(self.settings.gate.keep_versions, protect=protect)

    async def _stale(self, a: Ignore) -> None:
        self.log.info("candidate.stale", version=a.version, live=a.live)

    def health(self) -> dict:
        b, g = getattr(self, "book", None), getattr(self, "guard", None)
        return {
            **super().health(),
            **(b.summary() if b else {}),
            "scores": self.scores.recent() if b else {},
            "guard": g and g.health(),
        }
