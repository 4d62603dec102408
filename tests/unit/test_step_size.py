"""The learner's step size tied to measured drift (policies/learning/step_size.py), on hand-computed values."""

import pytest

from policies.learning.step_size import StepSize


def test_off_by_default_the_step_size_never_moves():
    s = StepSize()
    assert [s.after_step(1e-5, kl) for kl in (0.0, 5.0)] + [s.after_rejection(1e-5)] == [1e-5, 1e-5, 1e-5]
    assert s.ema is None


def test_smoothed_drift_under_half_the_target_grows_it_and_over_twice_shrinks_it():
    s = StepSize(kl_target=0.1)  # kl_ema 0.3, up 1.25, down 1.5
    assert s.after_step(1e-5, 0.0) == pytest.approx(1.25e-5)  # ema 0.0 < 0.05
    assert s.after_step(1.25e-5, 0.5) == pytest.approx(1.25e-5)  # ema 0.7 * 0 + 0.3 * 0.5 = 0.15: in the band
    assert s.ema == pytest.approx(0.15)
    assert s.after_step(1.25e-5, 0.5) == pytest.approx(1.25e-5 / 1.5)  # ema 0.105 + 0.15 = 0.255 > 0.2
    assert s.ema == pytest.approx(0.255)


def test_the_bounds_hold_both_ways():
    s, lr, lrs = StepSize(kl_target=0.1, lr_min=2e-6, lr_max=2e-5), 1e-5, []
    for _ in range(4):
        lr = s.after_step(lr, 0.0)
        lrs.append(round(lr, 12))
    assert lrs == [1.25e-5, 1.5625e-5, 1.953125e-5, 2e-5]
    assert _rejections(s, lr, 4) == [1e-5, 5e-6, 2.5e-6, 2e-6]


def _rejections(s: StepSize, lr: float, n: int) -> list[float]:
    out = []
    for _ in range(n):
        lr = s.after_rejection(lr)
        out.append(lr)
    return out


def test_a_harmful_step_size_comes_down_in_a_few_rejections():
    """The forced regression (lr 2e-4, 20x the preset): the gate rejected 8 candidates in 12 minutes while the
    learner went on at the same step size. Halved on each rejection it is at the preset's 1e-5 after 4 or 5."""
    lrs = _rejections(StepSize(kl_target=0.1), 2e-4, 5)
    assert lrs[3] == pytest.approx(1.25e-5) and lrs[4] == pytest.approx(6.25e-6)


def test_settings_refuse_a_drift_target_without_the_kl_term():
    from pydantic import ValidationError

    from config.settings import load_settings

    with pytest.raises(ValidationError, match="kl_coef"):
        load_settings(None, **{"learner.kl_target": 0.1, "learner.kl_coef": 0.0})
    s = StepSize.from_settings(
        load_settings(None, **{"learner.kl_target": 0.2, "learner.lr_min": 3e-6, "learner.lr_max": 4e-5}).learner
    )
    assert (s.kl_target, s.lr_min, s.lr_max) == (0.2, 3e-6, 4e-5)


def test_the_trainer_steps_at_the_set_size_and_keeps_it_across_a_reset_and_a_resume(tmp_path, tiny_dir):
    from config.settings import load_settings
    from policies.learning.trainer import Trainer
    from policies.weights.model_store import WeightsStore

    s = load_settings(None, state_dir=str(tmp_path / "state"))
    t = Trainer(s, tiny_dir, WeightsStore(s.state))
    t.set_lr(3e-6)
    assert [g["lr"] for g in t.opt.param_groups] == [3e-6]
    t.reset_to(None, "w-000000")  # a fresh optimizer after a rejection or rollback
    assert t.opt.param_groups[0]["lr"] == 3e-6
    state = t.state()
    t2 = Trainer(s, tiny_dir, WeightsStore(s.state))
    assert t2.lr == s.learner.lr
    t2.load_state(state)
    assert t2.lr == 3e-6 and t2.opt.param_groups[0]["lr"] == 3e-6


def test_a_fresh_optimizer_ramps_up_over_its_first_updates():
    from policies.learning.step_size import warmed

    assert [warmed(2e-5, n, 4) for n in (1, 2, 3, 4, 5)] == pytest.approx([5e-6, 1e-5, 1.5e-5, 2e-5, 2e-5])
    assert [warmed(2e-5, n, 0) for n in (1, 2)] == [2e-5, 2e-5]


def test_the_trainers_first_updates_take_the_ramps_share_and_a_reset_ramps_again(tmp_path, tiny_dir):
    """AdamW's first update moves each weight by lr * g / (|g| + eps): the whole step size wherever |g| >> eps.
    With lr 1e-3 over a ramp of 4 the first update moves the weights by at most 2.5e-4 (a quarter of lr), and the
    second takes half of lr."""
    from actors.events import ChatMessage, Judgement, Sample
    from config.settings import load_settings
    from policies.learning.step_size import updates_made
    from policies.learning.trainer import Trainer
    from policies.weights.model_store import WeightsStore

    def _group() -> Judgement:
        samples = [
            Sample(
                sample_id=f"s{i}",
                messages=[
                    ChatMessage(role="user", content=f"Add {i} and 2"),
                    ChatMessage(role="assistant", content=str(i + 2 * (i % 2))),
                ],
                step_indices=[1],
            )
            for i in range(4)
        ]
        return Judgement(
            group_id="g",
            source="rollout",
            task_id="t",
            samples=samples,
            outcomes=[1.0, 0.0, 1.0, 0.0],
            step_labels=[["GOOD"], ["BAD"], ["GOOD"], ["BAD"]],
        )

    s = load_settings(None, state_dir=str(tmp_path / "state"), **{"learner.kl_target": 0.0, "learner.lr": 1e-3})
    s.learner.lr_warmup = 4
    t = Trainer(s, tiny_dir, WeightsStore(s.state))

    def moved() -> tuple[float, dict]:
        before = [p.detach().clone() for p in t.model.parameters()]
        stats = t.train_step([_group()])
        return max(float((p.detach() - b).abs().max()) for p, b in zip(t.model.parameters(), before)), stats

    first, stats = moved()
    assert stats["lr"] == pytest.approx(2.5e-4) and updates_made(t.opt) == 1
    assert 2.4e-4 < first <= 2.5e-4 + 1e-9  # the sign-like first update, at a quarter of lr
    assert t.lr == 1e-3 and t.opt.param_groups[0]["lr"] == 1e-3  # the optimizer keeps the step size itself
    second, stats = moved()
    assert stats["lr"] == pytest.approx(5e-4) and second < 1e-3
    t.reset_to(None, "w-000000")  # a fresh optimizer after a rejection or rollback: the ramp starts again
    assert updates_made(t.opt) == 0
    again, stats = moved()
    assert stats["lr"] == pytest.approx(2.5e-4) and 2.4e-4 < again <= 2.5e-4 + 1e-9
