"""The LoRA learner at 7B scale, on a tiny model: export memory bounded to one layer's delta, and no full copy of
the model for a behaviour policy it cannot recompute."""

import pytest
from test_trainer import _group, _settings

from policies.weights.model_store import WeightsStore


def test_lora_export_holds_one_layers_delta_at_a_time(tmp_path, tiny_dir, monkeypatch):
    """peft keeps adapters in float32: computing every layer's delta before merging held all of a 7B's deltas at
    once (~24 GiB). The export computes one, merges it and lets it go before the next."""
    import weakref

    from policies.learning import lora
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lora_rank=4, lora_alpha=8.0, base_dtype="float32", lr=1e-2, kl_coef=0.0)
    t = Trainer(s, tiny_dir)
    t.train_step([_group()])
    alive, most = weakref.WeakSet(), [0]

    def tracked(orig, adapter):
        d = orig(adapter)
        alive.add(d)
        most[0] = max(most[0], len(alive))
        return d

    for _, layer in lora._layers(t.model):
        monkeypatch.setattr(layer, "get_delta_weight", lambda adapter, orig=layer.get_delta_weight: tracked(orig, adapter))
    sd = t.export("float32")
    assert len(lora._layers(t.model)) > 4 and most[0] == 1 and sd


def test_a_lora_learner_never_loads_a_full_copy_for_a_behaviour_it_cannot_recompute(tmp_path, tiny_dir):
    """Under LoRA a stale sample's behaviour is the model with that version's adapters; when they are gone (after a
    restart or a reset) a full copy would be +14 GiB at 7B that no plan counts: the sample is stale instead."""
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lora_rank=4, lora_alpha=8.0, base_dtype="float32", lr=1e-2, kl_coef=0.0)
    t = Trainer(s, tiny_dir, WeightsStore(s.state))
    t.train_step([_group()])
    t.named("w-000001")
    assert t.reproducible("w-000001") and t.reproducible("w-000000") and t.reproducible("reference")
    assert not t.reproducible("w-000077")
    with pytest.raises(ValueError, match="cannot be recomputed"):
        t.train_step([_group()], [["w-000077"] * 4])
    assert t._behaviour is None  # no scratch copy was made
    full = Trainer(_settings(tmp_path / "f", lr=0.0), tiny_dir, WeightsStore(tmp_path / "f" / "state"))
    assert full.reproducible("w-000077")
