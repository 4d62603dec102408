"""Learner: GRPO steps on judged groups -> a new weights version, asynchronous to the rollouts.

The explorer keeps generating with the weights it has while the learner trains; each sample carries the version that
generated it. Before a step, samples more than `learner.max_staleness` learner steps behind the weights being trained
(along the lineage in the weights manifests; a version outside it, e.g. one rolled back, counts as too stale) are
dropped with their group; the rest are corrected by truncated importance weights (`policies/learning/trainer.py`).
While live samples are held, it steps no further than max(1, that bound) past what users are answered with (live or
canary) and waits for the broadcaster's decision, at most `learner.max_wait_s`, rather than make it too stale to learn.

Judgement messages are held (not acked) until the step that uses them is committed. The commit point is the checkpoint
(`policies/learning/checkpoint.py`): the model, the optimizer, the new version's name and the ids of every judgement
applied. Exporting the weights file, publishing `evo.learner_step` / `evo.weights_published` (event ids derived from
the step) and acking follow it and are idempotent, so after a crash at any point the learner resumes from the last
verified checkpoint, redoes what follows it, acks redelivered judgements it already applied and trains on the others:
no batch is lost or applied twice. With `learner.replay_groups`, the newest groups earlier steps trained go into the
next step again (importance-corrected against the version that sampled them; in memory only, dropped when stale or
when the learner resets). Groups without any advantage are acked untrained; one-step live judgements are pooled into
groups of `learner.min_live_group`, tool calls and text answers apart (a held one gone too stale is acked when the
next arrives); a live step re-sampled into a group trains as one. It always trains from a version users get or will
get: after a rejection of a version it descends from, from that version's nearest ancestor that is the canary or live;
after a rollback, from the version rolled back to; when a version it does not descend from goes live, from that one.
With `learner.kl_target` its step size follows the measured drift from the reference (the base; with
`learner.ref_reset_after` the weights trained once the step size sat at its floor: `policies/learning/reference.py`)
and halves when a version it trained is rejected (`step_size.py`).
"""

from __future__ import annotations

import asyncio
import time

from opentelemetry import trace

from actors.actor import HOLD, EventActor, heartbeat
from actors.events import MIXED_WEIGHTS, Judgement, WeightsPromoted, WeightsRejected, WeightsRolledBack
from config import telemetry
from policies.engines.live_policy import LivePolicy
from policies.learning.checkpoint import CheckpointStore, applied_ids
from policies.learning.groups import at_floor, behaviour_of, fresh_part, informative, live_group, live_kind, step_choice
from policies.learning.staleness import WaitForUsers, staleness
from policies.learning.step_events import learner_step, signal_shares, weights_published
from policies.learning.step_size import StepSize
from policies.weights.model_store import BASE_VERSION, version_name


class Learner(EventActor):
    name = "learner"
    kinds = ("judgement", "weights_promoted", "weights_rejected", "weights_rolled_back")
    batch = 16

    async def start(self) -> None:
        await super().start()
        from policies.learning.trainer import Trainer

        s = self.settings
        self.policy = LivePolicy(s)  # the store, the base model and the lineage; the trainer is the learner's engine
        await self.policy.attach(self.bus.js)  # the pointer's copy kept; saved versions to the object store (nats)
        self.base, self.store = self.policy.base, self.policy.store
        self.ckpts = CheckpointStore(s.state / "learner")
        self.trainer = await asyncio.to_thread(Trainer, s, self.base, self.store)
        self.parent = BASE_VERSION  # the version the newest step was trained from
        loaded = await asyncio.to_thread(self.ckpts.load, s.learner.device)
        if loaded:
            state, man, skipped = loaded
            await asyncio.to_thread(self.trainer.load_state, state)
            self.parent = state.get("parent", BASE_VERSION)
            self.log.info("learner.resumed", step=man["step"], version=man["version"], skipped=skipped)
        else:
            live = self.policy.pointer()
            if live.path:
                await asyncio.to_thread(self.trainer.reset_to, live.path, live.version)
        self.weights_version = self.policy.live_version
        self.wait = WaitForUsers.from_settings(s.learner)
        self.step_size = StepSize.from_settings(s.learner)  # moves the trainer's lr (a resumed optimizer's)
        self.ready: list[Judgement] = []  # informative groups waiting for a step
        self.live: dict[str, list[Judgement]] = {}  # rated interactions by kind of step, pooled until a group forms
        self.replay: list[Judgement] = []  # groups recent steps trained, trained again beside new ones (in memory)
        self.held: dict[str, object] = {}  # event_id -> unacked message
        self._last_beat = time.monotonic()
        self.steps_done = self.dropped_stale = self.dropped_stale_live = 0
        # rollout groups seen; with outcome variance among the policy's own samples; with no signal at all
        self.groups_seen = self.groups_own_signal = self.groups_no_signal = 0
        await self._finish_commit()

    def _restore_committed(self) -> None:
        """Put the trainer back to the last committed checkpoint (or the live version when there is none)."""
        loaded = self.ckpts.load(self.settings.learner.device)
        if loaded:
            self.trainer.load_state(loaded[0])
            self.parent = loaded[0].get("parent", BASE_VERSION)
        else:
            self.trainer.reset_to((live := self.policy.pointer()).path, live.version)
            self.trainer.step, self.trainer.applied = 0, {}

    async def _finish_commit(self) -> None:
        """After a crash between the checkpoint and the publish: export and publish the checkpointed version."""
        t = self.trainer
        if not t.step:
            return
        if self.store.manifest(t.version) is None:
            await asyncio.to_thread(self._export, t.version)
        await self._publish_weights(t.version, t.step)

    def _export(self, version: str) -> None:
        """The weights just trained as the stored `version`; its manifest names the parent and the KL reference."""
        t, meta = self.trainer, {"parent": self.parent, "step": self.trainer.step, "reference": self.trainer.reference_version}
        self.store.save(t.export(self.settings.model.serve_dtype), version, meta)

    # ------------------------------------------------------------------ inputs
    async def handle_judgement(self, j: Judgement, msg):
        if j.event_id in self.trainer.applied:
            return None  # already in a checkpointed step: ack
        if j.event_id in self.held:  # redelivered while held: keep the newest delivery
            self.held[j.event_id] = msg
            return HOLD
        alpha, hints = self.settings.learner.adca_alpha, self.settings.learner.hindsight_clip > 0
        if j.source == "live" and MIXED_WEIGHTS in (j.behaviour_versions or []):  # two policies made it: no ratio is right
            self.log.info("live.skipped_mixed_weights", group_id=j.group_id)
            return None
        if j.source == "live" and len(j.samples) == 1:  # one live step alone: pooled with others of its kind
            self.held[j.event_id] = msg
            waiting = self.live.get(live_kind(j), [])  # one gone too stale to train leaves: j waits for a fresh partner
            if stale := [x for x in waiting if not all(map(self._fresh, behaviour_of(x)))]:
                self.log.info("live.pool_stale", dropped=[x.group_id for x in stale], training=self.trainer.version)
                await self._ack([x.event_id for x in stale])
            pool = self.live[live_kind(j)] = [x for x in waiting if x not in stale] + [j]
            if len(pool) >= self.settings.learner.min_live_group:
                pooled, self.live[live_kind(j)] = pool, []
                group = live_group(pooled, f"live-{j.event_id[:8]}", self.settings.learner.pooled_advantage == "outcome")
                if informative(group, alpha, hints=hints):
                    self.ready.append(group)
                else:  # e.g. two -1 ratings z-normed together: acked untrained
                    self.log.info("live.pool_no_signal", group_id=group.group_id, outcomes=[x.outcomes[0] for x in pooled])
                    await self._ack([x.event_id for x in pooled])
            return HOLD
        j = at_floor(j, alpha)  # a rollout group, or a live step re-sampled into one (policies/judge/live_steps.py)
        teaches = informative(j, alpha, hints and j.source == "live")
        if j.source == "rollout":  # the shares of rollout groups that teach (status)
            self.groups_seen, self.groups_no_signal = self.groups_seen + 1, self.groups_no_signal + (not teaches)
            self.groups_own_signal += not any(s.off_policy for s in j.samples) and teaches
        if not teaches:
            self.log.info("group.skipped_no_signal", group_id=j.group_id, outcome=j.outcomes[:1])
            return None
        self.held[j.event_id] = msg
        self.ready.append(j.model_copy(update={"source_event_ids": [j.event_id], "behaviour_versions": behaviour_of(j)}))
        return HOLD

    async def _ack(self, event_ids) -> None:
        for i in event_ids:
            self.applied.add(i)  # first: an ack that fails leaves a redelivery that is acked, not trained again
            if (m := self.held.pop(i, None)) is not None:
                await m.ack_sync()

    # ------------------------------------------------------------------ staleness
    def staleness(self, version: str) -> int | None:
        return staleness(self.store, self.trainer.version, version, self.settings.learner.max_staleness)

    def _fresh(self, version: str) -> bool:
        return self.staleness(version) is not None and self.trainer.reproducible(version)

    async def _waits_for_users(self) -> bool:
        """Users active and the trainer `max_staleness` steps past what they are answered with (the GPU learner steps
        in seconds, the gate takes minutes): no step until the broadcaster decides, or `learner.max_wait_s`."""
        active, t = any(g.source == "live" for g in self.ready) or any(self.live.values()), self.trainer.version
        state = self.wait(self.store, t, self.policy.pointer(), self.settings.learner.max_staleness, active, time.monotonic())
        if state in ("waiting", "expired"):
            self.log.info(f"learner.{state}_for_serving", training=t, served=self.wait.key[1:], max_wait_s=self.wait.max_wait_s)
        return state in ("waiting", "still")

    async def _drop_stale(self) -> None:
        fresh, alpha, hints = [], self.settings.learner.adca_alpha, self.settings.learner.hindsight_clip > 0
        self.replay = [x for g in self.replay if (x := fresh_part(g, self._fresh, alpha, hints))]  # acked: stale ones leave
        for g in self.ready:
            if (part := fresh_part(g, self._fresh, alpha, hints and g.source == "live")) is not None:
                fresh.append(part)
                continue
            self.dropped_stale, self.dropped_stale_live = self.dropped_stale + 1, self.dropped_stale_live + (g.source == "live")
            b = sorted(set(g.behaviour_versions))
            self.log.info("group.dropped_stale", group_id=g.group_id, source=g.source, behaviour=b, training=self.trainer.version)
            await self._ack(g.source_event_ids)
        self.ready = fresh

    # ------------------------------------------------------------------ one step
    async def tick(self) -> None:
        await self.beat_held()
        n = self.settings.learner.groups_per_step
        if len(self.ready) < n:
            return
        await self._drop_stale()
        if len(self.ready) < n or await self._waits_for_users():
            return
        # live groups about to go stale, then the newest: what the served version does now, and the cycle from an
        # interaction to served weights does not wait behind a backlog (older ones go stale and are dropped)
        ln = self.settings.learner
        groups = step_choice(self.ready, n, ln.live_groups_per_user, self.staleness, ln.max_staleness)  # popped once committed
        again = list(self.replay)  # trained before: a second pass, importance-corrected like any older sample
        step_groups = groups + again
        ids = sorted({i for g in groups for i in g.source_event_ids})
        async with heartbeat([self.held[i] for i in ids if i in self.held]):
            # the step links to the trace of every event it learned from: HTTP request -> weights version
            links = [
                trace.Link(trace.get_current_span(telemetry.context_from_headers(self.held[i].headers)).get_span_context())
                for i in ids
                if i in self.held and self.held[i].headers
            ]
            with self.tracer.start_as_current_span("learner.step", links=links):
                self.log.info("learner.step_started", step=self.trainer.step + 1, groups=len(groups), again=len(again))
                ages = [self.staleness(v) or 0 for g in step_groups for v in g.behaviour_versions]
                try:
                    stats = await asyncio.to_thread(
                        self.trainer.train_step, step_groups, [g.behaviour_versions for g in step_groups]
                    )
                    stats["staleness_max"] = float(max(ages, default=0))  # stats["lr"]: the update's (a ramp's share)
                    self.trainer.set_lr(self.step_size.after_step(self.trainer.lr, stats["kl"]))  # the next step's, checkpointed
                    stats["kl_drift"] = self.step_size.ema or 0.0
                    version = version_name(max(self.store.latest_number() + 1, self.trainer.step))
                    self.parent = self.trainer.version
                    self.trainer.named(version)
                    self.trainer.applied = applied_ids(self.trainer.applied, self.trainer.step, ids)
                    await asyncio.to_thread(
                        self.ckpts.save, {**self.trainer.state(), "parent": self.parent}, self.trainer.step, version
                    )  # the commit point
                except BaseException:
                    await asyncio.to_thread(self._restore_committed)  # the retry must not apply the batch twice
                    raise
                await asyncio.to_thread(self._export, version)
                extra = {"dropped_stale_groups": float(self.dropped_stale), "dropped_stale_live": float(self.dropped_stale_live)}
                extra.update(self._signal_shares())
                event = learner_step(self.trainer.step, stats, groups, again, ids, extra)
                await self.bus.publish(event, weights_version=version)
                await self._publish_weights(version, self.trainer.step)
        self.ready = [g for g in self.ready if all(g is not x for x in groups)]  # others may have arrived meanwhile
        self.replay = (self.replay + groups)[-ln.replay_groups :] if ln.replay_groups else []
        await self._ack(ids)
        self.steps_done += 1
        self.log.info(
            "learner.step", version=version, **{k: v if isinstance(v, int) else float(f"{v:.4g}") for k, v in stats.items()}
        )
        if self.step_size.reference_due(ln.ref_reset_after):  # after the export: under LoRA the rebase reads its file
            await self._rebase(f"{ln.ref_reset_after} steps in a row at lr_min")

    async def _publish_weights(self, version: str, step: int) -> None:
        await self.bus.publish(weights_published(self.store.manifest(version), version, step), weights_version=version)

    # ------------------------------------------------------------------ the broadcaster's decisions
    async def handle_weights_promoted(self, ev: WeightsPromoted, msg):
        if ev.stage == "live":
            self.weights_version = ev.weights.version
            if not self.policy.descends_from(self.trainer.version, ev.weights.version):  # users got what we are not
                await self._reset(ev.weights.path or None, ev.weights.version, "a live version it does not descend from")

    async def handle_weights_rolled_back(self, ev: WeightsRolledBack, msg):
        self.weights_version = ev.to.version
        if self.policy.descends_from(self.trainer.version, ev.from_version):
            await self._reset(ev.to.path or None, ev.to.version, f"{ev.from_version} was rolled back")

    async def handle_weights_rejected(self, ev: WeightsRejected, msg):
        """Continue from the rejected version's nearest ancestor that users get: the canary or live."""
        if not self.policy.descends_from(self.trainer.version, ev.weights.version):
            return
        if self.step_size.adaptive:
            self.trainer.set_lr(self.step_size.after_rejection(self.trainer.lr))  # the fresh optimizer of the reset takes it
            self.log.info("learner.lr_lowered", lr=self.trainer.lr, rejected=ev.weights.version)
        ptr = await self.policy.current()  # as the bus has it: the pointer is put before the event
        served = {ptr.version: ptr.path, **({ptr.canary.version: ptr.canary.path} if ptr.canary else {})}
        to = next((v for v in self.store.ancestors(ev.weights.version, 1000)[1:] if v in served), ptr.version)
        await self._reset(served.get(to), to, f"{ev.weights.version} was rejected")

    async def _reset(self, path: str | None, version: str, why: str) -> None:
        """Train on from `version`: groups sampled with it (or its descendants) are fresh again; staying on a
        version nobody samples with would drop every group as stale."""
        old = self.trainer.version
        await asyncio.to_thread(self.trainer.reset_to, path, version)
        self.replay = []  # what the left branch learned from is not learned again on this one
        self.log.info("learner.reset", training=version, previous=old, why=why)
        if (ref := self.trainer.reference_version) != BASE_VERSION and not self.policy.descends_from(version, ref):
            await self._rebase(f"the reference {ref} is on the branch left")  # full fine-tuning: LoRA's moved with it

    async def _rebase(self, why: str) -> None:
        """The weights being trained become the KL and drift reference (`learner.ref_reset_after`)."""
        await asyncio.to_thread(self.trainer.rebase_reference)
        self.step_size.restart()
        self.log.info("learner.reference_reset", reference=self.trainer.version, lr=self.trainer.lr, why=why)

    def _signal_shares(self) -> dict[str, float]:
        return signal_shares(*(getattr(self, k, 0) for k in ("groups_seen", "groups_own_signal", "groups_no_signal")))

    def health(self) -> dict:
        t = getattr(self, "trainer", None)
        return {
            **super().health(),
            "step": t.step if t else 0,
            "training": t.version if t else None,
            "reference": t.reference_version if t else None,
            "held_groups": len(getattr(self, "ready", [])),
            "held_live": sum(map(len, getattr(self, "live", {}).values())),
            "held_messages": len(getattr(self, "held", {})),
            "dropped_stale": getattr(self, "dropped_stale", 0),
            **self._signal_shares(),
        }
