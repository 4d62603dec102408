"""Weight broadcaster: the promotion gate, the canary, live monitoring and rollback.

Each version moves through the lifecycle in `actors/lifecycles.py`; every change is an
`evo.weights_status` event, and the decisions use `policies/gate.py`.
- `evo.weights_published`: the file's sha256 is verified (poison otherwise) and the version is
  staged. An operator's forced publish (`main.py promote V --force`) goes live at once.
- tick, with no canary running: the newest staged version is evaluated (older staged ones are
  superseded) against the live one on the fixed held-out suite. Pass: it becomes the canary, named
  in the LIVE pointer, and every replica answers `gate.canary_share` of its requests with it
  (`evo.weights_promoted`, stage canary; share 0 promotes straight to live). Fail: rejected
  (`evo.weights_rejected`).
- users' feedback on canary answers against live answers of the same period decides: live
  (`evo.weights_promoted`, stage live; the previous version retires, kept for rollback) or rolled
  back (`evo.weights_rolled_back`).
- the live version's recent feedback is compared with its predecessor's; a significant drop rolls
  it back to the predecessor, whatever brought it live (the gate or an operator).
Replicas report what they serve (`evo.weights_swapped`); the broadcaster keeps that map. Weights
files beyond `gate.keep_versions` are pruned, never the live, canary, staged or recent live ones.
Its state (statuses, history of live versions, feedback per version) is a JSON file written
atomically; evaluations are cached per version.
"""
from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime

from actors.actor import EventActor
from actors.bus import Poison
from actors.events import (Feedback, WeightsPromoted, WeightsPublished, WeightsRef, WeightsRejected,
                           WeightsRolledBack, WeightsStatus, WeightsSwapped)
from envs.registry import make_envs
from policies.gate import GateScores, canary_verdict, clearly_worse, gate, reference_pairs, watch_verdict
from actors.lifecycles import IllegalTransition, WeightsState as S, transition
from policies.live_policy import LivePolicy
from policies.model_store import BASE_VERSION, atomic_write_bytes, sha256_file, version_number

FEEDBACK_KEPT = 500  # ratings kept per version


def _ts(iso: str) -> float:
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return time.time()


class Broadcaster(EventActor):
    name = "broadcaster"
    kinds = ("weights_published", "feedback", "weights_swapped")
    batch = 8

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.policy = await asyncio.to_thread(LivePolicy, s, "gate")  # its engine scores candidates
        self.store, self.base_path, self.engine = self.policy.store, self.policy.base, self.policy.engine
        self.envs = make_envs(s.env)
        # a fixed held-out suite: the first gate.heldout_tasks entries of each environment's held-out split
        self.heldout = {name: env.entries("heldout")[: s.gate.heldout_tasks] for name, env in self.envs.items()}
        self.pairs = await asyncio.to_thread(reference_pairs, self.envs, s.gate.nll_entries)
        d = s.state / "broadcaster"
        d.mkdir(parents=True, exist_ok=True)
        self.state_file = d / "state.json"
        self.scores = GateScores(d / "evals.json", self.envs, self.heldout, self.pairs,
                                 max_new_tokens=s.rollout.max_new_tokens, call_prefix=s.rollout.call_prefix)
        st = json.loads(self.state_file.read_text()) if self.state_file.exists() else {}
        live = self.policy.live_version
        self.status: dict[str, str] = st.get("status", {live: S.LIVE})
        self.refs: dict[str, dict] = st.get("refs", {})
        self.history: list[str] = st.get("history", [live])  # versions that went live, oldest first
        self.canary: dict | None = st.get("canary")
        self.feedback: dict[str, list[list[float]]] = st.get("feedback", {})  # version -> [[time, score]]
        self.replicas: dict[str, dict] = st.get("replicas", {})
        self.counts: dict[str, int] = st.get("counts", {"promoted": 0, "rejected": 0, "rolled_back": 0})
        self.weights_version = live
        self._dirty = False
        self._repair_pointer()

    def _repair_pointer(self) -> None:
        """LIVE is the projection of the lifecycle on the stream: a pointer written just before a crash that kept
        its status event off the stream names a version that is not live (or a canary that is not one) in the
        lifecycle; it is rewritten from the lifecycle."""
        ptr = self.policy.pointer()
        live = sorted((v for v, st in self.status.items() if st == S.LIVE), key=version_number)
        want = ptr.version if ptr.version in live or not live else live[-1]
        canary = self.canary["version"] if self.canary and self.status.get(self.canary["version"]) == S.CANARY else None
        if (want, canary) != (ptr.version, ptr.canary.version if ptr.canary else None):
            self.log.warning("live.pointer_repaired", pointer=ptr.version, pointer_canary=ptr.canary and ptr.canary.version,
                             live=want, canary=canary)
            self.policy.publish_live(self._ref(want), canary=self._ref(canary) if canary else None,
                                     share=self.settings.gate.canary_share)
        self.canary = self.canary if canary else None

    # ------------------------------------------------------------------ state
    def _save(self) -> None:
        atomic_write_bytes(self.state_file, json.dumps({
            "status": self.status, "refs": self.refs, "history": self.history[-50:], "canary": self.canary,
            "feedback": self.feedback, "replicas": self.replicas, "counts": self.counts}).encode())
        self._dirty = False

    def _ref(self, version: str) -> WeightsRef:
        if version in self.refs:
            return WeightsRef(**self.refs[version])
        if version == BASE_VERSION:
            path = self.store.file(version, self.base_path)
            ref = WeightsRef(version=version, path=str(path), sha256=sha256_file(path), parent="", step=0)
        else:
            man = self.store.manifest(version) or {}
            ref = WeightsRef(version=version, path=man.get("path", ""), sha256=man.get("sha256", ""),
                             parent=man.get("parent", ""), step=int(man.get("step", 0)))
        self.refs[version] = ref.model_dump()
        return ref

    async def _set(self, version: str, new: S, reason: str, metrics: dict | None = None) -> None:
        old = self.status.get(version)
        try:
            transition(old, new)
        except IllegalTransition as exc:  # a bug, not a reason to stop serving: log it and keep going
            self.log.error("lifecycle.illegal", version=version, error=str(exc))
            return
        self.status[version] = new
        n = len(self.history)  # distinguishes a version going live a second time
        ev = WeightsStatus(event_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:weights_status:{version}:{new}:{old}:{n}")),
                           version=version, status=new, previous_status=old, reason=reason[:1000],
                           metrics={k: float(v) for k, v in (metrics or {}).items()})
        await self.bus.publish(ev, weights_version=version)
        self._save()
        self.log.info("weights.status", version=version, status=str(new), previous=old, reason=reason[:200])

    def live_version(self) -> str:
        return self.policy.live_version

    # ------------------------------------------------------------------ inputs
    async def handle_weights_published(self, ev: WeightsPublished, msg):
        w = ev.weights
        if not await asyncio.to_thread(self.store.verify, w.path, w.sha256):
            raise Poison(f"{w.version}: file {w.path} is missing or its sha256 does not match")
        self.refs[w.version] = w.model_dump()
        if ev.force:
            if w.version != self.live_version():
                await self._go_live(w.version, f"forced by an operator{': ' + ev.reason if ev.reason else ''}", {})
            return
        if self.status.get(w.version) is not None:
            return  # known already (a redelivery)
        if version_number(w.version) <= version_number(self.live_version()):
            self.log.info("candidate.stale", version=w.version, live=self.live_version())
            return
        await self._set(w.version, S.STAGED, f"published by the learner (step {w.step}, parent {w.parent})")

    async def handle_feedback(self, ev: Feedback, msg):
        version = ev.interaction.weights_version if ev.interaction else ev.weights_version
        rows = self.feedback.setdefault(version, [])
        rows.append([_ts(ev.occurred_at), float(ev.score)])
        del rows[:-FEEDBACK_KEPT]
        self._dirty = True

    async def handle_weights_swapped(self, ev: WeightsSwapped, msg):
        self.replicas[ev.replica] = {"version": ev.version, "canary": ev.canary, "swap_ms": round(ev.swap_ms, 1),
                                     "reason": ev.reason, "at": _ts(ev.occurred_at)}
        self._dirty = True

    def _scores(self, version: str, since: float = 0.0) -> list[float]:
        return [s for t, s in self.feedback.get(version, []) if t >= since]

    # ------------------------------------------------------------------ the lifecycle
    async def tick(self) -> None:
        if self.canary:
            await self._check_canary()
        elif not await self._watch_live():
            staged = sorted((v for v, st in self.status.items() if st == S.STAGED), key=version_number)
            if staged:
                await self._evaluate(staged)
        if self._dirty:
            self._save()

    def _score(self, version: str, success: bool = True) -> dict:
        return self.scores.score(self.engine, version, lambda: self._ref(version).path, success)

    async def _evaluate(self, staged: list[str]) -> None:
        newest = staged[-1]
        for v in staged[:-1]:
            await self._set(v, S.SUPERSEDED, f"{newest} was staged before it was evaluated")
        await self._set(newest, S.EVALUATING, f"held-out gate against live {self.live_version()}")
        live = self.live_version()
        live_s = await asyncio.to_thread(self._score, live)
        g = self.settings.gate
        base_s = await asyncio.to_thread(self._score, BASE_VERSION, False)  # its NLL, cached
        cand_s = await asyncio.to_thread(self._score, newest, False)  # the likelihood first: seconds
        early = clearly_worse(cand_s, live_s, g.nll_tolerance, base_s, g.base_nll_tolerance)
        if early is None:
            cand_s = await asyncio.to_thread(self._score, newest)
            ok, why = gate(cand_s, live_s, g.tolerance, g.nll_tolerance, base_s, g.base_nll_tolerance)
        else:
            ok, why = False, early
        metrics = {**{f"candidate_{k}": v for k, v in cand_s.items()}, **{f"live_{k}": v for k, v in live_s.items()}}
        ref = self._ref(newest)
        if not ok:
            await self._set(newest, S.REJECTED, why, metrics)
            await self.bus.publish(WeightsRejected(weights=ref, candidate_score=cand_s.get("success", -1.0),
                                                   live_score=live_s["success"], reason=why,
                                                   candidate_nll=cand_s.get("nll"), live_nll=live_s.get("nll")),
                                   weights_version=live)
            self.counts["rejected"] += 1
            self._prune()
            return
        if g.canary_share <= 0:
            await self._go_live(newest, why, metrics, cand_s, live_s)
            return
        live_ref = self._ref(live)  # the pointer first: whoever reacts to the events below reads the new one
        self.policy.publish_live(live_ref, canary=ref, share=g.canary_share)
        self.canary = {"version": newest, "baseline": live, "started": time.time()}
        await self._set(newest, S.CANARY, why, metrics)
        await self.bus.publish(WeightsPromoted(weights=ref, candidate_score=cand_s["success"], live_score=live_s["success"],
                                               previous=live, stage="canary", canary_share=g.canary_share,
                                               candidate_nll=cand_s.get("nll"), live_nll=live_s.get("nll"), reason=why),
                               weights_version=live)
        self._save()

    async def _go_live(self, version: str, reason: str, metrics: dict, cand_s: dict | None = None,
                       live_s: dict | None = None) -> None:
        old = self.live_version()
        ref = self._ref(version)
        self.policy.publish_live(ref)  # the pointer first (see _evaluate)
        if self.canary and self.canary["version"] != version:
            await self._set(self.canary["version"], S.RETIRED, f"{version} went live during its canary")
        self.canary = None
        if old != version and self.status.get(old) == S.LIVE:
            await self._set(old, S.RETIRED, f"replaced by {version}")
        if self.status.get(version) != S.LIVE:
            await self._set(version, S.LIVE, reason, metrics)
        self.history.append(version)
        self.weights_version = version
        self.counts["promoted"] += 1
        await self.bus.publish(WeightsPromoted(weights=ref, candidate_score=(cand_s or {}).get("success", -1.0),
                                               live_score=(live_s or {}).get("success", -1.0), previous=old,
                                               stage="live", candidate_nll=(cand_s or {}).get("nll"),
                                               live_nll=(live_s or {}).get("nll"), reason=reason),
                               weights_version=version)
        self._prune()
        self._save()
        self.log.info("weights.live", version=version, previous=old, reason=reason[:200])

    async def _check_canary(self) -> None:
        c, g = self.canary, self.settings.gate
        verdict, why = canary_verdict(self._scores(c["version"], c["started"]), self._scores(c["baseline"], c["started"]),
                                      min_feedback=g.canary_min_feedback, margin=g.rollback_margin,
                                      elapsed_s=time.time() - c["started"], max_s=g.canary_max_s)
        if verdict == "live":
            await self._go_live(c["version"], why, {})
        elif verdict == "rollback":
            await self._rollback(c["version"], c["baseline"], why)

    async def _watch_live(self) -> bool:
        if len(self.history) < 2:
            return False
        live, prev = self.history[-1], self.history[-2]
        if live != self.live_version():
            return False
        g = self.settings.gate
        roll, why = watch_verdict(self._scores(live), self._scores(prev), window=g.watch_feedback,
                                  margin=g.rollback_margin)
        if roll:
            await self._rollback(live, prev, why)
        return roll

    async def _rollback(self, version: str, to: str, reason: str) -> None:
        was_canary = bool(self.canary and self.canary["version"] == version)
        ref = self._ref(to)
        self.policy.publish_live(ref)  # the pointer first (see _evaluate)
        await self._set(version, S.ROLLED_BACK, reason)
        self.canary = None
        if not was_canary:
            self.history = [v for v in self.history if v != version]
            if self.status.get(to) != S.LIVE:
                await self._set(to, S.LIVE, f"rollback from {version}")
            if not self.history or self.history[-1] != to:
                self.history.append(to)
        self.weights_version = to
        self.counts["rolled_back"] += 1
        for v, st in list(self.status.items()):  # candidates trained from the bad version are not evaluated
            if st == S.STAGED and self.policy.descends_from(v, version):
                await self._set(v, S.SUPERSEDED, f"descends from {version}, which was rolled back")
        await self.bus.publish(WeightsRolledBack(from_version=version, to=ref, reason=reason), weights_version=to)
        self._save()
        self.log.warning("weights.rolled_back", version=version, to=to, reason=reason[:200])

    def _prune(self) -> None:
        protect = {BASE_VERSION, self.live_version(), *self.history[-3:],
                   *(v for v, st in self.status.items() if st in (S.STAGED, S.EVALUATING, S.CANARY))}
        self.store.prune(self.settings.gate.keep_versions, protect=protect)

    def health(self) -> dict:
        return {**super().health(), **getattr(self, "counts", {}), "canary": getattr(self, "canary", None),
                "history": getattr(self, "history", [])[-5:], "replicas": getattr(self, "replicas", {}),
                "scores": self.scores.recent() if hasattr(self, "scores") else {}}
