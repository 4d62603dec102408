"""What the attributor sends on for an unrated live step with a signal, and how a re-sampled step comes back.

A closed conversation's step that no user rated, and whose signal gave it an outcome, becomes either
- a `LiveStep` for the explorer (`live_task`): re-sample the step from the same context, when the request declared
  tools to check the alternatives against (`envs/tool_fit.py`) and the explorer has room for it. The
  group (the served step and its alternatives, scored by `envs/live.py` with no user and no judge) comes back as a
  rollout, and `live_judgement` makes it a live judgement the learner trains as one group; or
- a one-step judgement (`step_judgement`): its outcome, and with a hint hindsight, teach the step alone.
Both carry what was served scrubbed of personal data (`policies.hygiene.scrub`), the user's hash (a user's burst
cannot fill a step: `learner.live_groups_per_user`) and, as provenance, the interaction's event id.
"""

from __future__ import annotations

from actors.events import MIXED_WEIGHTS, Feedback, Interaction, Judgement, Sample, derived_id
from actors.task_events import LiveStep, Rollout
from envs.live import trajectory
from policies.hygiene import scrub, scrub_arguments
from policies.judge.judge import Verdict

LIVE_ENV = "live"  # the explorer's name for re-sampling a live step (not an environment of env.names)
ALTERNATIVE = "alternative"  # the signal of a re-sampled answer: scored by envs/live.py, not by a next turn


def step_sample(it: Interaction, outcome: float, hint: str) -> Sample:
    return trajectory(it, outcome, scrub, scrub_arguments).model_copy(update={"hint": scrub(hint)})


MAX_CONTEXT_CHARS = 100_000  # a group carries its context once per sample: 4 of these stay well under NATS's 1 MB


def resamplable(it: Interaction, sample: Sample, alternatives: int) -> bool:
    """Can this step become a group? Only a call of a declared function (its alternatives call it too, and its
    schema scores them: a text answer has nothing to be checked against), by one policy, in a context small enough
    to travel several times in one event."""
    declared = {t.function.name for t in it.tools}
    return (
        alternatives > 0
        and any(c.name in declared for c in it.response.tool_calls)
        and not it.mixed_weights
        and len(sample.model_dump_json()) <= MAX_CONTEXT_CHARS
    )


def _labels(outcomes: list[float]) -> list[list[str]]:
    return [["GOOD" if o > 0 else "BAD"] for o in outcomes]


def step_judgement(it: Interaction, signal: str, sample: Sample) -> Judgement:
    return Judgement(
        event_id=derived_id("judgement", f"signal:{it.event_id}"),
        group_id=f"live:{it.interaction_id}",
        source="live",
        task_id=f"live:{it.interaction_id}",
        samples=[sample],
        outcomes=[sample.outcome],
        step_labels=_labels([sample.outcome]),
        judge=f"next-turn:{signal}",
        source_event_ids=[it.event_id],
        trace_id=it.trace_id,
        origin="live",
        user_hashes=[it.user_hash],
        signals=[signal],
    )


def rated_judgement(ev: Feedback, it: Interaction, sample: Sample, v: Verdict | None, judge: str) -> Judgement:
    """A rated step's judgement: the user's score is its outcome; its labels the judge's (`v`, screened) where it
    answered, else the score's sign (live traffic has no environment to verify steps); `judge` names who labelled it.
    The comment is scrubbed as the sample is: it is the user's own text."""
    return Judgement(
        event_id=derived_id("judgement", ev.event_id),
        group_id=f"live:{ev.interaction_id}",
        source="live",
        task_id=f"live:{ev.interaction_id}",
        samples=[sample],
        outcomes=[ev.score],
        step_labels=[v.labels if v is not None else ["GOOD" if ev.score > 0 else "BAD"]],
        judge=judge,
        source_event_ids=[ev.event_id, it.event_id],
        trace_id=ev.trace_id,
        judge_labels=[v.labels] if v else None,
        judge_scores=[v.score] if v else [],
        screened_steps=len(v.screened) if v else 0,
        origin="live",
        user_hashes=[it.user_hash],
        comments=[scrub(ev.comment or "")],
        behaviour_versions=[MIXED_WEIGHTS] if it.mixed_weights else [],
    )


def live_task(it: Interaction, signal: str, sample: Sample) -> LiveStep:
    """The explorer's task of re-sampling this step; published with the served version as its weights_version."""
    return LiveStep(
        event_id=derived_id("live_step", f"signal:{it.event_id}"),
        task_id=f"live:{it.interaction_id}",
        env=LIVE_ENV,
        entry_id=it.interaction_id,
        query=next((m.content for m in reversed(sample.messages) if m.role == "user"), "")[:500],
        step=sample,
        tool_choice=it.tool_choice,
        response_format=it.response_format,
        user_hash=it.user_hash,
        signal=signal,
        source_event_ids=[it.event_id],
        trace_id=it.trace_id,
    )


def live_judgement(ev: Rollout) -> Judgement:
    """A re-sampled live step's group as a live judgement: outcomes as `envs/live.py` scored them, the served step
    first (with its signal), then its alternatives."""
    t = ev.task
    outcomes = [s.outcome for s in ev.samples]
    return Judgement(
        event_id=derived_id("judgement", ev.event_id),
        group_id=ev.group_id,
        source="live",
        task_id=t.task_id,
        env=LIVE_ENV,
        entry_id=t.entry_id,
        samples=ev.samples,
        outcomes=outcomes,
        step_labels=_labels(outcomes),
        judge=f"next-turn:{t.signal}+{ev.scored_by}",
        source_event_ids=[*t.source_event_ids, ev.event_id],
        trace_id=ev.trace_id,
        origin="live",
        behaviour_versions=list(ev.behaviour_versions),
        user_hashes=[t.user_hash] * len(ev.samples),
        signals=[t.signal] + [ALTERNATIVE] * (len(ev.samples) - 1),
    )
