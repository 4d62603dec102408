"""The events a committed learner step publishes: `evo.learner_step` with the step's figures, and
`evo.weights_published` with the new version. Their ids derive from the step, so a learner that redoes the
publish after a crash publishes the same events again and the bus drops the copies."""

from __future__ import annotations

from datetime import datetime

from actors.events import Judgement, LearnerStep, WeightsPublished, WeightsRef, derived_id


def step_event_id(kind: str, step: int) -> str:
    return derived_id(kind, str(step))


def signal_shares(seen: int, own_signal: int, no_signal: int) -> dict[str, float]:
    """Share of rollout groups the policy's own samples made informative (reward variance > 0), and share
    that taught anything once references joined unsolved groups."""
    n = max(1, seen)
    return {
        "rollout_groups": float(seen),
        "informative_own_share": own_signal / n,
        "informative_share": 1.0 - no_signal / n,
    }


def learner_step(
    step: int, stats: dict, groups: list[Judgement], again: list[Judgement], ids: list[str], extra: dict[str, float]
) -> LearnerStep:
    """`groups` are the new groups of the step, `again` the ones it trained a second time, `ids` the judgements
    it learned from; `extra` are the learner's own figures (stale groups dropped, signal shares)."""
    return LearnerStep(
        event_id=step_event_id("learner_step", step),
        step=step,
        groups=len(groups) + len(again),
        samples=stats["samples"],
        loss=stats["loss"],
        mean_reward=stats["mean_reward"],
        grad_norm=stats["grad_norm"],
        duration_s=stats["seconds"],
        source_event_ids=ids,
        reused_event_ids=sorted({i for g in again for i in g.source_event_ids}),
        metrics={
            **{k: float(v) for k, v in stats.items() if isinstance(v, (int, float))},
            **extra,
            "groups_again": float(len(again)),
            "learned_from_ts": min(
                (datetime.fromisoformat(g.occurred_at).timestamp() for g in groups), default=0.0
            ),  # the oldest new group's judgement
            **{f"groups_{o}": float(sum(g.origin == o for g in groups)) for o in ("env", "synthetic", "live")},
        },
    )


def weights_published(manifest: dict, version: str, step: int) -> WeightsPublished:
    ref = WeightsRef(
        version=version, path=manifest["path"], sha256=manifest["sha256"], parent=manifest.get("parent", ""), step=step
    )
    return WeightsPublished(event_id=step_event_id("weights_published", step), weights=ref)
