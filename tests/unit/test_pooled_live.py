"""Pooled live groups (`policies/learning/groups.live_group`): their steps answer unrelated prompts. Z-normed together
(the default, `learner.pooled_advantage: zscore`, as the rated hours were measured) a milder failure is taught as a
success; with `outcome` every step keeps its own outcome. Hand-computed values for both."""

from types import SimpleNamespace

import torch

from actors.events import ChatMessage, Judgement, Sample
from policies.learning import grpo, step_rows
from policies.learning.groups import fresh_part, informative, live_group, step_credit


def _step(i: int, outcome: float) -> Judgement:
    """One rated live step of its own prompt."""
    msgs = [ChatMessage(role="user", content=f"q{i}"), ChatMessage(role="assistant", content=f"a{i}")]
    return Judgement(
        event_id=f"j{i}",
        group_id=f"live:{i}",
        source="live",
        task_id=f"live:{i}",
        samples=[Sample(sample_id=f"s{i}", messages=msgs, step_indices=[1], outcome=outcome)],
        outcomes=[outcome],
        step_labels=[["BAD" if outcome < 0 else "GOOD"]],
        behaviour_versions=["w-000001"],
        user_hashes=[f"u{i}"],
        origin="live",
    )


def test_z_normed_a_pool_teaches_its_milder_failure_as_a_success_its_own_outcomes_do_not():
    steps = [_step(1, -0.5), _step(2, -1.0)]
    z, own = live_group(steps, "live-a"), live_group(steps, "live-a", own=True)
    assert step_credit(z, 0.1) == [[1.0], [-1.0]]  # the mean (-0.75) is the baseline, the std (0.25) the scale
    assert step_credit(own, 0.1) == [[-0.5], [-1.0]]
    small = [_step(3, 0.08), _step(4, 0.09)]
    assert step_credit(live_group(small, "b", own=True), 0.1) == [[0.08], [0.09]]  # z-normed: -1, +1
    wrong = [_step(5, -1.0), _step(6, -1.0)]
    assert not informative(live_group(wrong, "c"), 0.1) and informative(live_group(wrong, "c", own=True), 0.1)


def test_one_fresh_step_of_an_own_outcome_pool_still_trains():
    group = live_group([_step(1, -1.0), _step(2, -1.0)], "live-a", own=True)
    group = group.model_copy(update={"behaviour_versions": ["w-000001", "w-000000"]})
    part = fresh_part(group, lambda v: v == "w-000001", 0.1)
    assert part is not None and [s.sample_id for s in part.samples] == ["s1"] and step_credit(part, 0.1) == [[-1.0]]
    z = group.model_copy(update={"task_id": "live"})  # z-normed, one step alone has no baseline
    assert fresh_part(z, lambda v: v == "w-000001", 0.1) is None


def test_the_step_trains_each_own_outcome_step_by_its_outcome(monkeypatch):
    """The trainer's token advantages (`step_rows`), under ADCA and outcome-only GRPO."""
    tokens = SimpleNamespace(input_ids=[1, 2, 3], response_mask=[0, 1, 1], step_ids=[-1, 0, 0])
    monkeypatch.setattr(grpo, "tokenize_sample", lambda *a: tokens)
    worse = live_group([_step(1, -0.5), _step(2, -1.0)], "live-a", own=True)
    small = live_group([_step(3, 0.08), _step(4, 0.09)], "live-b", own=True)
    for alpha in (0.1, 0.0):
        fields = {"adpo": True, "clip_ratio_high": 0.28, "hindsight_clip": 0.0, "floor_negative_scale": 0.5}
        L = SimpleNamespace(adca_alpha=alpha, max_seq_tokens=64, experience_mode="drop", **fields)
        rows = step_rows.rows_of([worse, small], None, "w-000001", None, L)
        _, adv = step_rows.advantages(rows, [worse, small], L)
        want = torch.tensor([[0.0, o, o] for o in (-0.5, -1.0, 0.08, 0.09)])
        assert torch.allclose(adv, want, atol=1e-5), adv  # z-normed per group: +1, -1, -1, +1
