"""Attributor: step-level credit for rollout groups and rated live interactions.

Each rollout group goes to the judge (`policies/judge/judge.py`: the served policy by default, an OpenAI-compatible
endpoint when configured) in one batched call, off the event loop, within a per-minute prompt budget. The judge labels
every step GOOD/BAD and scores the trajectory against the task's reference (synthetic tasks) on AgentEvolver's 60-100 /
0-40 bands; steps made only of master-key text are BAD whatever the judge says.

Where the environment can verify a step (BFCL state progress, code execution) its signal is both a training signal
and ground truth for the judge: agreement is accumulated per step and reported in each judgement and in `health()`.
`judge.step_labels` picks what the learner sees: `verified` (default) uses the environment's labels where they exist
and the judge's elsewhere; `judge` uses the judge's wherever it answered. With `verified`, the judge's verdict on a
group whose every step the environment labels trains nothing, so only `judge.audit_share` of those (by group id) are
judged, for the agreement. A rollout's outcome is `policies.judge.stats.score_rollout`'s (the environment's, shaped);
a live interaction's is its user feedback (the feedback names the interaction, which is read from the stream by id:
`Bus.interaction`). A judge over budget, failing or malformed: the environment's (or the feedback's) labels, said so.

Unrated live traffic (`conversations.enabled`): every `evo.interaction` joins the conversation it extends
(`policies/judge/conversations.py`: requests stitched by content, per user), and its interaction message is held,
unacked, until that conversation closes (idle for `conversations.idle_s`, or past its bounds): after a restart the
stream hands the open conversations back. On close, each step that no user rated and that got a signal (a call that does
not fit the declared tools, a correction, a re-ask, a tool error, thanks, ...) has value x confidence as outcome, and,
where the signal says what was wrong, the next turn as its hindsight hint (`policies/learning/hindsight.py`). With
`conversations.alternatives` and declared tools it goes to the explorer to be re-sampled (an `evo.live_step`, while
fewer than `conversations.max_in_flight` wait there); the group comes back as a rollout and becomes one live judgement.
Otherwise it is a one-step live judgement (`policies/judge/live_steps.py`). `conversations.teach: confirmed`: only steps
the next turn took well go on; `consensus`: also the others the explorer re-samples (their answers vote, `envs/live.py`).
Ids derive from the step's interaction, so a redelivery publishes nothing twice. Rated steps keep their rating; one
that comes after its step's signal was sent on, or after another rating of it, is recorded, not trained (the step would
train twice).
"""

from __future__ import annotations

import asyncio
import time

from actors.actor import HOLD, EventActor, first_consumer
from actors.bus import Poison
from actors.events import (
    Feedback,
    Interaction,
    Judgement,
    Sample,
    WeightsPromoted,
    WeightsRolledBack,
    derived_id,
)
from actors.messages import event_time
from actors.task_events import LiveStep, Rollout
from envs.live import trajectory
from envs.registry import ONE_CALL
from policies.hygiene import scrub, scrub_arguments
from policies.judge.conversations import ConversationBook
from policies.judge.judge import Agreement, Budget, Verdict, audited, choose_labels, make_judge
from policies.judge.live_steps import live_judgement, live_task, rated_judgement, resamplable, step_judgement, step_sample
from policies.judge.stats import score_rollout


def judgement_id(source_event_id: str) -> str:
    return derived_id("judgement", source_event_id)


def live_sample(it: Interaction, fb: Feedback) -> Sample:
    return trajectory(it, fb.score, scrub, scrub_arguments)


class Attributor(EventActor):
    name = "attributor"
    kinds = ("rollout", "feedback", "interaction", "weights_promoted", "weights_rolled_back")
    batch = 1
    book: ConversationBook | None = None

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.engine = None
        if not s.judge.base_url:  # the served policy judges: follow the live version like a replica does
            from policies.engines.live_policy import LivePolicy

            self.policy = await asyncio.to_thread(LivePolicy, s, "judge")
            self.engine = self.policy.engine
            await self._sync_live()
        self.judge = make_judge(s, self.engine)
        self.budget = Budget(s.judge.calls_per_minute)
        self.agreement = Agreement()
        self.stats = dict.fromkeys(("judged", "fallback_budget", "fallback_error", "fallback_malformed", "screened"), 0)
        self.stats["unaudited"] = 0  # samples of groups the environment labels alone (judge.audit_share)
        c = s.conversations
        if c.enabled:
            self.book = ConversationBook(c.idle_s, c.max_open, c.max_steps)
        self.held: dict[str, object] = {}  # interaction event id -> its unacked message, until its conversation closes
        self.signalled: dict[str, int] = {}  # signal rule -> steps judged by it
        self._last_beat = time.monotonic()

    async def _sync_live(self) -> None:
        self.weights_version = await asyncio.to_thread(self.policy.sync)

    async def handle_weights_promoted(self, ev: WeightsPromoted, msg):
        if self.engine is not None:
            await self._sync_live()

    async def handle_weights_rolled_back(self, ev: WeightsRolledBack, msg):
        if self.engine is not None:
            await self._sync_live()

    async def run_judge(self, samples: list[Sample], references: list[list[str] | None]) -> list[Verdict | None]:
        """Verdicts, or None per sample where the judge could not answer (budget, error, malformed)."""
        samples_ = [s for s in samples if s.step_indices]
        if not samples_:
            return [None] * len(samples)
        if not self.budget.take(self.judge.cost(samples_)):
            self.stats["fallback_budget"] += len(samples)
            return [None] * len(samples)
        try:
            verdicts = await asyncio.to_thread(self.judge.judge, samples, references)
        except Exception as exc:  # an unreachable or broken judge never stops attribution
            self.stats["fallback_error"] += len(samples)
            self.log.warning("judge.failed", error=repr(exc)[:300])
            return [None] * len(samples)
        self.stats["judged"] += sum(v is not None for v in verdicts)
        self.stats["fallback_malformed"] += sum(v is None for v in verdicts)
        self.stats["screened"] += sum(len(v.screened) for v in verdicts if v)
        return verdicts

    async def handle_rollout(self, ev: Rollout, msg):
        if not ev.samples:
            raise Poison("rollout group has no samples")
        if isinstance(ev.task, LiveStep):  # a live step and its alternatives, scored without a user (envs/live.py)
            if f"rated:{ev.task.entry_id}" in self.applied:  # a user rated it while it was re-sampled: that trained it
                self.signalled["rated_while_resampled"] = self.signalled.get("rated_while_resampled", 0) + 1
                return self.log.info("live_group.rated", group_id=ev.group_id, interaction_id=ev.task.entry_id)
            for e in ev.task.source_event_ids:  # from now on a rating is refused: this group trains the step
                self.applied.add(f"signalled:{e}")
            out = live_judgement(ev)
            await self.bus.publish(out, weights_version=ev.weights_version)
            self.log.info("judged.live_group", group_id=ev.group_id, outcomes=out.outcomes, signal=ev.task.signal)
            return
        refs = [ev.task.reference or None] * len(ev.samples)
        j = self.settings.judge
        if j.step_labels == "verified" and all(s.step_signals for s in ev.samples) and not audited(ev.group_id, j.audit_share):
            verdicts = [None] * len(ev.samples)  # the environment labels every step: the judge would only be audited
            self.stats["unaudited"] += len(ev.samples)
        else:
            verdicts = await self.run_judge(ev.samples, refs)
        credit = self.settings.rollout.fit_credit if ev.task.env in ONE_CALL else 0.0
        scored = [score_rollout(s, credit) for s in ev.samples]
        group_agree = Agreement()
        labels = []
        for s, v, (_, verified) in zip(ev.samples, verdicts, scored):
            if v is not None and s.step_signals:
                group_agree.add(v.labels, verified)
            labels.append(choose_labels(self.settings.judge.step_labels, verified, v.labels if v else None) or [])
        self.agreement.gg += group_agree.gg
        self.agreement.gb += group_agree.gb
        self.agreement.bg += group_agree.bg
        self.agreement.bb += group_agree.bb
        judged = all(v is not None for v in verdicts)
        out = Judgement(
            event_id=judgement_id(ev.event_id),
            group_id=ev.group_id,
            source="rollout",
            task_id=ev.task.task_id,
            env=ev.task.env,
            entry_id=ev.task.entry_id,
            samples=ev.samples,
            outcomes=[o for o, _ in scored],
            step_labels=labels,
            judge=self.judge.name if judged else "env",
            source_event_ids=[ev.event_id],
            trace_id=ev.trace_id,
            judge_labels=[v.labels for v in verdicts] if judged else None,
            judge_scores=[v.score for v in verdicts] if judged else [],
            agreement=group_agree.accuracy(),
            origin=ev.task.origin,
            screened_steps=sum(len(v.screened) for v in verdicts if v),
        )
        await self.bus.publish(out, weights_version=ev.weights_version)
        self.log.info(
            "judged.rollout",
            group_id=ev.group_id,
            outcomes=out.outcomes,
            judge=out.judge,
            agreement=out.agreement,
            judge_scores=out.judge_scores,
        )

    async def handle_feedback(self, ev: Feedback, msg):
        # serve's outbox publishes an interaction before any feedback on it: missing, it is older than the stream keeps
        it = ev.interaction or await self.bus.interaction(ev.interaction_id)
        if it is None:
            raise Poison(f"feedback {ev.event_id}: interaction {ev.interaction_id!r} is not on the stream")
        if f"rated:{ev.interaction_id}" in self.applied and f"rating:{ev.event_id}" not in self.applied:
            # another rating of a rated step (its id hashes the score and comment): recorded, not trained twice
            self.signalled["feedback_again"] = self.signalled.get("feedback_again", 0) + 1
            return self.log.info("feedback.again", interaction_id=ev.interaction_id, score=ev.score)
        if self.book is not None:
            decided = f"alone:{it.event_id}" in self.applied or f"resample:{it.event_id}" in self.applied
            decided = decided and f"consensus:{it.event_id}" not in self.applied  # trains only if its group comes back
            # sent on (a close that failed after it still holds it), or decided before steps were marked, and closed
            if f"signalled:{it.event_id}" in self.applied or (decided and not self.book.holds(ev.interaction_id)):
                self.signalled["feedback_after_signal"] = self.signalled.get("feedback_after_signal", 0) + 1
                return self.log.info("feedback.after_signal", interaction_id=ev.interaction_id, score=ev.score)
            self.book.rate(ev.interaction_id)
        self.applied.add(f"rating:{ev.event_id}")  # first: this rating's redelivery still publishes (idempotent by id)
        self.applied.add(f"rated:{ev.interaction_id}")  # durable: a restart must not judge the step by a signal
        sample = live_sample(it, ev)
        (v,) = await self.run_judge([sample], [None])
        out = rated_judgement(ev, it, sample, v, self.judge.name if v else "user-feedback")
        await self.bus.publish(out, weights_version=it.weights_version)
        self.log.info("judged.live", interaction_id=ev.interaction_id, score=ev.score, labels=out.step_labels[0])

    # ------------------------------------------------------------------ unrated conversations
    async def handle_interaction(self, ev: Interaction, msg):
        if self.book is None:
            return None
        if ev.event_id in self.held:  # redelivered while held: keep the newest delivery
            self.held[ev.event_id] = msg
            return HOLD
        now = time.time()  # idle counts from when it was served; handed back after a restart, it waits one ack wait
        at = max(event_time(ev.occurred_at), now - self.book.idle_s + self.settings.nats.ack_wait_s)
        _, over = self.book.add(ev, min(now, at))  # (the rest of what was held comes back within that wait)
        self.held[ev.event_id] = msg  # only once the book has it: after a failed `add`, the redelivery must reach it
        for cid in over:
            await self._close(cid, idle=False)
        return HOLD

    async def tick(self) -> None:
        if self.book is None:
            return
        for cid in self.book.idle(time.time()):
            await self._close(cid)
        await self.beat_held(min(15.0, self.settings.nats.ack_wait_s / 3))

    async def _close(self, cid: str, idle: bool = True) -> None:
        """Close one conversation; if that cannot be carried out, it goes back to the book (tried again later)."""
        conv = self.book.close(cid, idle)
        try:
            await self._closed(conv)
        except BaseException:
            self.book.reopen(conv)
            raise

    async def _closed(self, conv) -> None:
        """Send on a closed conversation's unrated steps that have a signal, then ack its interactions."""
        c = self.settings.conversations
        for st in conv.steps:
            it = st.interaction
            rated = st.rated or f"rated:{it.interaction_id}" in self.applied  # also rated before a restart
            if rated or not st.signal or not st.outcome or it.mixed_weights:
                continue
            sample, drop = step_sample(it, st.outcome, st.hint), c.teach != "all" and st.outcome < 0
            # `confirmed`/`consensus` (above); a step that trains nothing is not marked sent: a later rating trains it
            if drop and (c.teach == "confirmed" or not await self._resampled(it, sample, c, alone_trains=False)):
                self.signalled[st.signal] = self.signalled.get(st.signal, 0) + 1
                continue
            go = await self._resampled(it, sample, c)  # re-sampled by the explorer, judged in handle_rollout
            out = live_task(it, st.signal, sample) if go else step_judgement(it, st.signal, sample)
            # before: a rating from now on is recorded, not trained too; a turned-down step under `consensus` trains
            # only if a majority of its re-samples agree, so until its group comes back (handle_rollout) a rating trains
            self.applied.add(f"consensus:{it.event_id}" if drop else f"signalled:{it.event_id}")
            await self.bus.publish(out, weights_version=it.weights_version)
            self.signalled[st.signal] = self.signalled.get(st.signal, 0) + 1
            self.log.info(
                "judged.signal",
                interaction_id=it.interaction_id,
                signal=st.signal,
                outcome=st.outcome,
                conversation=conv.conversation_id,
                resample=out.kind == "live_step",
            )
        for st in conv.steps:
            m = self.held.pop(st.interaction.event_id, None)
            if m is not None:
                await m.ack_sync()
            self.applied.add(st.interaction.event_id)

    async def _resampled(self, it: Interaction, sample: Sample, c, alone_trains: bool = True) -> bool:
        """Does this step go to the explorer? Decided once and kept (a close tried again, or redone after a restart,
        sends it the same way, so it never trains both in a group and alone); a no is kept only if it trains alone."""
        go, alone = f"resample:{it.event_id}", f"alone:{it.event_id}"
        if go in self.applied or alone in self.applied:
            return go in self.applied
        yes = resamplable(it, sample, c.alternatives) and await self.bus.backlog(first_consumer("explorer")) < c.max_in_flight
        if yes or alone_trains:
            self.applied.add(go if yes else alone)
        return yes

    def health(self) -> dict:
        h = super().health()
        if hasattr(self, "agreement"):
            h.update(judge=self.judge.name, judge_stats=dict(self.stats), judge_agreement=self.agreement.as_dict())
        if self.book is not None:
            h.update(open_conversations=len(self.book.open), next_turn_signals=dict(self.signalled))
        return h
