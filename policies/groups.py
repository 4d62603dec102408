"""Which judged groups a learner step can use, and with which behaviour policy per sample.

- `informative`: does the group give any sample a non-zero advantage?
- `at_floor`: a reference (off-policy) sample stays only where the policy's own samples teach nothing;
- `behaviour_of`: the version that generated each sample (`REFERENCE` for a reference);
- `Replay`: the groups of the last steps, trained again beside new ones (`learner.replay_groups`).
"""
from __future__ import annotations

from actors.events import Judgement
from policies import adca
from policies.model_store import REFERENCE


def informative(j: Judgement, alpha: float) -> bool:
    """Does the group give any sample a non-zero advantage? (outcome spread, or step credit under ADCA)"""
    if len(set(j.outcomes)) > 1:
        return True
    return alpha > 0 and any(abs(a) > 1e-9 for adv in adca.step_advantages(j.step_labels, j.outcomes, alpha)
                             for a in adv)


def at_floor(j: Judgement, alpha: float) -> Judgement:
    """A reference sample stays in a group only where the policy's own samples teach nothing (no spread in
    their scores, no step credit): mixed into a group that has its own signal, the reference's outlier score
    would squash the differences between the policy's samples into one shared negative advantage."""
    own = [i for i, s in enumerate(j.samples) if not s.off_policy]
    if len(own) == len(j.samples):
        return j
    pick = lambda xs: [xs[i] for i in own] if xs else xs  # noqa: E731
    mine = j.model_copy(update={"samples": pick(j.samples), "outcomes": pick(j.outcomes),
                                "step_labels": pick(j.step_labels), "behaviour_versions": pick(j.behaviour_versions)})
    return mine if informative(mine, alpha) else j


def behaviour_of(j: Judgement) -> list[str]:
    versions = list(j.behaviour_versions) if j.behaviour_versions else [j.weights_version] * len(j.samples)
    return [REFERENCE if s.off_policy else v for s, v in zip(j.samples, versions)]
