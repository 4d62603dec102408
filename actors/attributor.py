"""Attributor: scores rollouts and rated live interactions, step by step.

First form (the judge model comes with the self-attributing work): rollouts are scored by the
environment-verified outcome, shaped by the mean per-step environment signal so that groups of
a weak policy still carry information; each step is labelled GOOD when its environment signal
is positive. A live interaction with user feedback becomes a one-sample judgement whose outcome
is the feedback score. Emits `evo.judgement` with the group kept intact.
"""
from __future__ import annotations

import uuid

from actors.bus import EventActor, Poison
from actors.events import Feedback, Judgement, Rollout, Sample
from envs.live import trajectory

STEP_SHAPING = 0.1  # weight of the mean step signal added to the environment outcome


def judgement_id(source_event_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:judgement:{source_event_id}"))


def score_rollout(sample: Sample) -> tuple[float, list[str]]:
    """(outcome, step labels) for one rollout from its environment signals."""
    sig = sample.step_signals
    shaped = sample.outcome + STEP_SHAPING * (sum(sig) / len(sig) if sig else 0.0)
    labels = ["GOOD" if s > 0 else "BAD" for s in sig]
    return round(shaped, 6), labels


def live_sample(fb: Feedback) -> Sample:
    return trajectory(fb.interaction, fb.score)


class Attributor(EventActor):
    name = "attributor"
    kinds = ("rollout", "feedback")

    async def handle_rollout(self, ev: Rollout, msg):
        if not ev.samples:
            raise Poison("rollout group has no samples")
        scored = [score_rollout(s) for s in ev.samples]
        out = Judgement(event_id=judgement_id(ev.event_id), group_id=ev.group_id, source="rollout",
                        task_id=ev.task.task_id, samples=ev.samples, outcomes=[o for o, _ in scored],
                        step_labels=[lab for _, lab in scored], judge="env", source_event_ids=[ev.event_id],
                        trace_id=ev.trace_id)
        await self.bus.publish(out, weights_version=ev.weights_version)
        self.log.info("judged.rollout", group_id=ev.group_id, outcomes=out.outcomes)

    async def handle_feedback(self, ev: Feedback, msg):
        if ev.interaction is None:
            raise Poison(f"feedback {ev.event_id} carries no interaction snapshot")
        sample = live_sample(ev)
        out = Judgement(event_id=judgement_id(ev.event_id), group_id=f"live:{ev.interaction_id}", source="live",
                        task_id=f"live:{ev.interaction_id}", samples=[sample], outcomes=[ev.score],
                        step_labels=[["GOOD" if ev.score > 0 else "BAD"]], judge="user-feedback",
                        source_event_ids=[ev.event_id, ev.interaction.event_id], trace_id=ev.trace_id)
        await self.bus.publish(out, weights_version=ev.interaction.weights_version)
        self.log.info("judged.live", interaction_id=ev.interaction_id, score=ev.score)
