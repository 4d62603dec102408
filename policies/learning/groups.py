"""Which judged groups a learner step can use, with which behaviour policy per sample and what weight.

- `informative`: does the group give any sample a non-zero advantage?
- `pooled`, `step_credit`, `baseline`: with `learner.pooled_advantage: outcome`, a pooled live group's steps keep
  their own outcomes (no shared baseline);
- `at_floor`: a reference (off-policy) sample stays only where the policy's own samples teach nothing;
- `fresh_part`: a group without its samples too stale to train, where the rest still teaches;
- `behaviour_of`: the version that generated each sample (`REFERENCE` for a reference);
- `live_kind`: which pool of rated live steps a judgement joins (tool calls and text answers apart);
- `live_group`: a full pool, made one group;
- `floor_scales`: how much a failure's negative advantage counts in a group only a reference solved;
- `fair_step`: the groups of one step, where one user's burst of live traffic cannot crowd out other users';
- `step_choice`: the same, with live groups at their last chance first.
"""

from __future__ import annotations

from collections import Counter

from actors.events import Judgement
from policies.learning import adca
from policies.learning.staleness import REFERENCE

POOLED = "live-own"  # the task id of a pooled live group whose steps keep their own outcomes (`live_group(own=True)`)


def pooled(j: Judgement) -> bool:
    """Is the group live steps of unrelated prompts, each trained by its own outcome (`learner.pooled_advantage`)?"""
    return j.source == "live" and j.task_id == POOLED


def informative(j: Judgement, alpha: float, hints: bool = False) -> bool:
    """Does the group give any sample a non-zero advantage? (outcome spread, step credit under ADCA, a non-zero
    outcome in a `pooled` group, or with `hints` a live step that hindsight teaches)"""
    if hints and any(s.hint for s in j.samples):
        return True
    if pooled(j):
        return any(abs(o) > 1e-9 for o in j.outcomes)
    if len(set(j.outcomes)) > 1:
        return True
    return alpha > 0 and any(abs(a) > 1e-9 for adv in step_credit(j, alpha) for a in adv)


def step_credit(j: Judgement, alpha: float) -> list[list[float]]:
    """Each sample's step advantages: ADCA over the group (`adca.step_advantages`). In a `pooled` group the samples
    answer unrelated prompts and share no baseline (z-normed together, a step rated -0.5 beside one rated -1.0 gets +1,
    `tool_ok` +0.08 beside `moved_on` +0.09 gets -1): every step of sample i gets its own outcome, A_ik = o_i, no mean
    removed, no std division, no step-label z-score."""
    if pooled(j):
        return [[o] * len(labels) for labels, o in zip(j.step_labels, j.outcomes)]
    return adca.step_advantages(j.step_labels, j.outcomes, alpha)


def baseline(j: Judgement, i: int) -> str:
    """The group sample i is normalised in by outcome-only GRPO (`learner.adca_alpha` 0): its group's, or in a
    `pooled` group its own (verl's estimator leaves a group of one its score: mean 0, std 1)."""
    return f"{j.group_id}/{j.samples[i].sample_id}" if pooled(j) else j.group_id


def live_kind(j: Judgement) -> str:
    """What a rated live step is: a tool call ("call") or a text answer ("text"). Rated interactions are pooled
    into groups of one kind: the z-score of a group is a baseline, and answers that users mostly rate down (a
    small model's final answers) measured against calls they rate up would teach "answer less" instead of
    "answer right"; within a kind, a group teaches only where a right and a wrong step of that kind differ."""
    s = j.samples[0]
    steps = [s.messages[i] for i in s.step_indices if i < len(s.messages)] or s.messages[-1:]
    return "call" if steps and steps[-1].tool_calls else "text"


def live_group(pooled: list[Judgement], group_id: str, own: bool = False) -> Judgement:
    """Rated live interactions of one kind (`live_kind`), pooled into one group the learner trains."""
    return Judgement(
        group_id=group_id,
        source="live",
        task_id=POOLED if own else "live",  # own: each step trained by its own outcome (`pooled`)
        samples=[s for x in pooled for s in x.samples],
        outcomes=[o for x in pooled for o in x.outcomes],
        step_labels=[lab for x in pooled for lab in x.step_labels],
        behaviour_versions=[v for x in pooled for v in behaviour_of(x)],
        user_hashes=[u for x in pooled for u in (x.user_hashes or [""] * len(x.samples))],
        source_event_ids=[x.event_id for x in pooled],
        origin="live",
    )


def _part(j: Judgement, keep: list[int]) -> Judgement:
    """The group with only the samples at `keep` (and what goes with each of them)."""
    pick = lambda xs: [xs[i] for i in keep] if xs else xs  # noqa: E731
    fields = ("samples", "outcomes", "step_labels", "behaviour_versions", "user_hashes", "signals", "comments")
    return j.model_copy(update={f: pick(getattr(j, f)) for f in fields})


def at_floor(j: Judgement, alpha: float) -> Judgement:
    """A reference sample stays in a group only where the policy's own samples teach nothing (no spread in
    their scores, no step credit): mixed into a group that has its own signal, the reference's outlier score
    would squash the differences between the policy's samples into one shared negative advantage."""
    own = [i for i, s in enumerate(j.samples) if not s.off_policy]
    if len(own) == len(j.samples):
        return j
    mine = _part(j, own)
    return mine if informative(mine, alpha) else j


def fresh_part(g: Judgement, fresh, alpha: float, hints: bool = False) -> Judgement | None:
    """The group if every sample's behaviour version is `fresh` enough to train; else the samples that are, if at
    least two of them still teach (a live step's alternatives, sampled with newer weights than the answer users were
    served, outlive it; in a `pooled` group one is enough: it needs no other for a baseline); else None."""
    keep = [i for i, v in enumerate(g.behaviour_versions) if fresh(v)]
    if len(keep) == len(g.samples):
        return g
    part = _part(g, keep) if len(keep) >= (1 if pooled(g) else 2) else None
    return part if part is not None and informative(part, alpha, hints) else None


def behaviour_of(j: Judgement) -> list[str]:
    versions = list(j.behaviour_versions) if j.behaviour_versions else [j.weights_version] * len(j.samples)
    return [REFERENCE if s.off_policy else v for s, v in zip(j.samples, versions)]


def floor_scales(groups: list[Judgement], adv, negative_scale: float) -> list[float]:
    """Per sample: `negative_scale` for the policy's own samples with a negative advantage in a group that none
    of them solved but a reference joined (learning from the floor), else 1. There the failures share the
    task's format tokens with the reference: their summed negative advantage (equal to the reference's
    positive one) at full weight, against the reference's shaped (<= 0.25x) weight, would push down the very
    tokens the reference shows, and the policy drifts away from the solution instead of towards it."""
    out, row = [], 0
    for g in groups:
        floor = any(s.off_policy for s in g.samples) and all(s.outcome < 1.0 for s in g.samples if not s.off_policy)
        for s in g.samples:
            negative = float(adv[row].sum()) < 0
            out.append(negative_scale if floor and not s.off_policy and negative else 1.0)
            row += 1
    return out


def _user(g: Judgement) -> str | None:
    """The user most of a live group's samples came from (None for rollouts)."""
    return Counter(g.user_hashes).most_common(1)[0][0] if g.source == "live" and g.user_hashes else None


def fair_step(ready: list[Judgement], n: int, per_user: int, first: list[Judgement] = ()) -> list[Judgement]:
    """The `n` groups of a step: `first` (of `ready`), then the newest, with at most `per_user` live groups of one user
    while live groups of other users wait in `ready`: one user's burst of conversations cannot fill a step while others
    wait, and a user alone (or rollouts alone) trains as before. One count per user over `first` and the rest: a burst
    that reaches `first` together gets no more room than one that does not. Only when too few groups fit under the
    cap, the passed-over ones fill the step, `first` first (what would otherwise be lost). Returned in arrival order."""
    users = {_user(g) for g in ready} - {None}
    head = [g for g in reversed(ready) if any(g is f for f in first)]
    order = head + [g for g in reversed(ready) if all(g is not h for h in head)]
    chosen, count = [], Counter()
    for g in order:
        u = _user(g)
        if u is not None and len(users - {u}) > 0 and count[u] >= per_user:
            continue
        chosen.append(g)
        count[u] += 1
        if len(chosen) == n:
            break
    for g in order:  # not enough under the cap: what was passed over, at its last chance first, then the newest
        if len(chosen) == n:
            break
        if all(g is not c for c in chosen):
            chosen.append(g)
    return [g for g in ready if any(g is c for c in chosen)]


def step_choice(ready: list[Judgement], n: int, per_user: int, staleness, max_staleness: int) -> list[Judgement]:
    """The `n` groups of a step by `fair_step`, live groups at their last chance first (`staleness` of a behaviour
    version at `max_staleness`: fresh for this step, too stale after it; what users wrote, which the learner would
    otherwise drop, e.g. after it waited for the served version to move). A user's groups there count towards the
    same cap as the rest: past it, at their last chance, they yield to other users' groups and go stale (one user's
    burst is not trained at the others' expense, even when it is about to be lost)."""

    def last_chance(g: Judgement) -> bool:
        return max((staleness(v) or 0 for v in g.behaviour_versions), default=0) >= max_staleness

    return fair_step(ready, n, per_user, [g for g in ready if g.source == "live" and last_chance(g)])
