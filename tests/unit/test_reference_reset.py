"""`learner.ref_reset_after`: after n steps in a row at the floor step size the weights being trained become the KL
and drift reference (ProRL's reference reset). Hand-computed step sizes; a real trainer and learner on a tiny model.
tests/ is on sys.path (its conftest.py)."""

import asyncio

import pytest
import torch
from learner_harness import Msg
from learner_harness import make_learner as _learner
from sample_groups import two_sample_group
from test_trainer import _group, _perturb, _settings

from actors.events import LearnerStep
from policies.learning.step_size import StepSize
from policies.weights.model_store import BASE_VERSION, WeightsStore


def test_steps_at_the_floor_are_counted_and_a_reset_restarts_the_drift():
    s = StepSize(kl_target=0.1, lr_min=2e-6, lr_max=2e-5)  # kl_ema 0.3, up 1.25, down 1.5
    assert s.after_step(3e-6, 1.0) == pytest.approx(2e-6) and s.at_floor == 1  # ema 1.0 > 0.2: 3e-6 / 1.5
    assert s.after_step(2e-6, 1.0) == 2e-6 and s.at_floor == 2  # bounded below
    assert not s.reference_due(3) and s.ema == pytest.approx(1.0)
    assert s.after_step(2e-6, 0.2) == 2e-6 and s.ema == pytest.approx(0.76)  # 0.7 * 1.0 + 0.3 * 0.2: still over 0.2
    assert s.reference_due(3) and (s.ema, s.at_floor) == (None, 0)  # three in a row: the drift starts again
    assert s.after_step(2e-6, 0.01) == pytest.approx(2.5e-6) and s.at_floor == 0  # ema 0.01 < 0.05: grows again
    assert not s.reference_due(0)  # 0 = never


def test_a_step_off_the_floor_breaks_the_count():
    s = StepSize(kl_target=0.1, lr_min=2e-6, lr_max=2e-5)
    s.after_step(2e-6, 1.0)
    s.after_step(2e-6, 1.0)
    assert s.at_floor == 2
    assert s.after_step(2e-6, 0.0) == pytest.approx(2e-6) and s.at_floor == 3  # ema 0.7: still shrinking, at the floor
    s.ema = 0.0
    assert s.after_step(2e-6, 0.0) == pytest.approx(2.5e-6) and s.at_floor == 0
    fixed, no_floor = StepSize(lr_min=2e-6), StepSize(kl_target=0.1)  # no drift target; no floor: nothing counted
    assert fixed.after_step(2e-6, 1.0) == 2e-6 and no_floor.after_step(1e-5, 1.0) == pytest.approx(1e-5 / 1.5)
    assert fixed.at_floor == no_floor.at_floor == 0


def test_settings_refuse_a_reset_without_a_floor_to_sit_at():
    from pydantic import ValidationError

    from config.settings import load_settings

    with pytest.raises(ValidationError, match="ref_reset_after"):
        load_settings(None, **{"learner.ref_reset_after": 5, "learner.kl_target": 0.1, "learner.lr_min": 0.0})
    with pytest.raises(ValidationError, match="ref_reset_after"):
        load_settings(None, **{"learner.ref_reset_after": 5, "learner.kl_target": 0.0})
    assert load_settings(None, **{"learner.ref_reset_after": 5, "learner.kl_target": 0.1}).learner.ref_reset_after == 5


def test_the_rebased_reference_measures_no_drift_and_survives_a_resume(tmp_path, tiny_dir):
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lr=0.0, kl_coef=0.1)  # lr 0: the steps measure, the weights stay
    store = WeightsStore(s.state)
    t = Trainer(s, tiny_dir, store)
    _perturb(t)
    t.named("w-000001")
    store.save(t.export("float32"), "w-000001", {"parent": BASE_VERSION})
    assert t.reference_version == BASE_VERSION and t.train_step([_group()])["kl"] > 1e-4  # drift from the base
    t.rebase_reference()
    assert t.reference_version == "w-000001" and t.train_step([_group()])["kl"] == pytest.approx(0.0, abs=1e-6)
    state = t.state()
    assert state["reference"] == "w-000001"
    t2 = Trainer(s, tiny_dir, store)
    t2.load_state(state)  # the reference from the stored file, loaded on first use
    assert t2.reference_version == "w-000001" and t2.train_step([_group()])["kl"] == pytest.approx(0.0, abs=1e-6)
    t2.reference.restore(BASE_VERSION)  # an older checkpoint's: the base again
    assert t2.train_step([_group()])["kl"] > 1e-4
    store.remove("w-000001")  # its file gone all the same: the base, with a warning, rather than a learner that fails
    t3 = Trainer(s, tiny_dir, store)
    t3.load_state(state)
    assert t3.train_step([_group()])["kl"] > 1e-4 and t3.reference_version == BASE_VERSION


def test_under_lora_the_rebase_moves_the_frozen_base_to_the_trained_weights(tmp_path, tiny_dir):
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lora_rank=4, lora_alpha=8.0, base_dtype="float32", lr=1e-2, kl_coef=0.01)
    store = WeightsStore(s.state)
    t = Trainer(s, tiny_dir, store)
    t.train_step([_group()])
    t.named("w-000001")
    store.save(t.export("float32"), "w-000001", {"parent": BASE_VERSION})
    lr = t.lr
    assert t.train_step([_group()])["kl"] > 1e-6  # the adapters moved it from the base
    t.named("w-000002")
    store.save(t.export("float32"), "w-000002", {"parent": "w-000001"})
    merged = t.export("float32")
    t.rebase_reference()
    assert t.reference_version == "w-000002" and t.lr == lr
    after = t.export("float32")
    assert all(torch.allclose(after[k], merged[k], atol=1e-6) for k in merged)  # the same weights, adapters at zero
    assert t.train_step([_group()])["kl"] == pytest.approx(0.0, abs=1e-6)


def test_the_store_keeps_the_reference_a_kept_version_names(tmp_path):
    store = WeightsStore(tmp_path)
    for n in range(1, 6):
        meta = {"parent": f"w-{n - 1:06d}", "reference": "w-000002" if n == 5 else BASE_VERSION}
        store.save({"x": torch.zeros(1)}, f"w-{n:06d}", meta)
    assert store.prune(2, protect={BASE_VERSION}) == ["w-000001", "w-000003"]
    assert store.manifest("w-000002") is not None
    store.save({"x": torch.zeros(1)}, "w-000006", {"parent": "w-000005", "reference": "w-000005"})
    store.save({"x": torch.zeros(1)}, "w-000007", {"parent": "w-000006", "reference": "w-000005"})
    assert store.prune(2, protect={BASE_VERSION}) == ["w-000002", "w-000004"]  # no kept version names it now


def _step(ln, i: int) -> LearnerStep:
    asyncio.run(ln.handle_judgement(two_sample_group(i, ln.trainer.version), Msg()))
    asyncio.run(ln.tick())
    return [e for e in ln.bus.events if isinstance(e, LearnerStep)][-1]


def test_the_learner_rebases_after_n_steps_at_the_floor_and_off_a_branch_left(tmp_path, tiny_dir):
    # lr_min = lr_max = lr: every step ends at the floor
    ln = _learner(tmp_path, tiny_dir, kl_target=0.1, lr_min=1e-3, lr_max=1e-3, ref_reset_after=2, kl_coef=0.1)
    one, two = _step(ln, 1), _step(ln, 2)
    assert ln.trainer.reference_version == "w-000002" and ln.step_size.ema is None  # after the second step's export
    assert one.metrics["kl"] == pytest.approx(0.0, abs=1e-6) and two.metrics["kl"] > 0  # the second drifted from the base
    assert ln.store.manifest("w-000002")["reference"] == BASE_VERSION
    three = _step(ln, 3)
    assert three.metrics["kl"] == pytest.approx(0.0, abs=1e-6)  # measured from w-000002, the weights it started from
    assert ln.store.manifest("w-000003")["reference"] == "w-000002"  # the store keeps it while w-000003 is kept
    assert ln.trainer.reference_version == "w-000002" and ln.step_size.at_floor == 1
    asyncio.run(ln._reset(None, "w-000001", "w-000002 was rejected"))  # the reference is on the branch left
    assert ln.trainer.reference_version == "w-000001" and ln.step_size.ema is None
    asyncio.run(ln._reset(None, "w-000001", "a rollback to it"))
    assert ln.trainer.reference_version == "w-000001"


def test_without_the_setting_the_base_stays_the_reference(tmp_path, tiny_dir):
    ln = _learner(tmp_path, tiny_dir, kl_target=0.1, lr_min=1e-3, lr_max=1e-3, kl_coef=0.1)
    for i in range(1, 4):
        _step(ln, i)
    assert ln.trainer.reference_version == BASE_VERSION and ln.store.manifest("w-000003")["reference"] == BASE_VERSION
    asyncio.run(ln._reset(None, "w-000001", "w-000003 was rejected"))
    assert ln.trainer.reference_version == BASE_VERSION
