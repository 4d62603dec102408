"""The LoRA learner on a tiny model: adapters trained over a frozen base, the merged model served, a stale sample's
behaviour from its version's adapters; and at 7B scale, export memory bounded to one layer's delta, and no full copy
of the model for a behaviour policy it cannot recompute."""

import pytest
import torch
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


def test_lora_learner_trains_adapters_only_and_serves_merged_weights(tmp_path, tiny_dir):
    """LoRA over a frozen base: only adapters get gradients; the exported version is the merged model
    (its logits match the adapted model's); the KL reference is the model with adapters off; a
    checkpoint holds the adapters, not the base; reset_to makes a version the base again."""
    from transformers import AutoModelForCausalLM

    from policies.learning import grpo
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lora_rank=4, lora_alpha=8.0, base_dtype="float32", lr=1e-2, kl_coef=0.01)
    t = Trainer(s, tiny_dir)
    trainable = {k for k, p in t.model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in k for k in trainable)
    frozen = {k: v.clone() for k, v in t.model.state_dict().items() if "lora_" not in k}
    stats = t.train_step([_group()])
    assert stats["grad_norm"] > 0 and stats["kl"] == pytest.approx(0.0, abs=1e-6)  # adapters start at B = 0
    assert all(torch.equal(v, t.model.state_dict()[k]) for k, v in frozen.items())  # the base never moves
    t.train_step([_group()])
    sd = t.export("float32")
    assert not any("lora" in k or "base_layer" in k for k in sd)
    served = AutoModelForCausalLM.from_pretrained(str(tiny_dir), dtype=torch.float32)
    served.load_state_dict(sd, strict=False)
    ids = torch.tensor([[1, 5, 9, 30, 2]])
    attn = torch.ones_like(ids)
    with torch.no_grad():
        mine = grpo.token_logprobs(t.model, ids, attn)
        theirs = grpo.token_logprobs(served, ids, attn)
        with t._reference() as ref:
            base = grpo.token_logprobs(ref, ids, attn)
    assert torch.allclose(mine, theirs, atol=1e-4) and not torch.allclose(mine, base, atol=1e-4)
    state = t.state()
    assert "model" not in state and state["adapter"] and state["base_from"][0] == "w-000000"
    t2 = Trainer(s, tiny_dir)
    t2.load_state(state)
    with torch.no_grad():
        assert torch.allclose(grpo.token_logprobs(t2.model, ids, attn), mine, atol=1e-5)  # resumed exactly
    store = WeightsStore(s.state)
    path, _ = store.save(sd, "w-000001", {"parent": "w-000000", "step": 2})
    t2.reset_to(str(path), "w-000001")
    with torch.no_grad():
        assert torch.allclose(grpo.token_logprobs(t2.model, ids, attn), mine, atol=1e-4)  # the version, as base
        with t2._reference() as ref:
            assert torch.allclose(grpo.token_logprobs(ref, ids, attn), mine, atol=1e-4)


def test_lora_behaviour_of_a_stale_sample_uses_that_versions_adapters(tmp_path, tiny_dir):
    from policies.learning import grpo
    from policies.learning.trainer import Trainer

    s = _settings(tmp_path, lora_rank=4, lora_alpha=8.0, base_dtype="float32", lr=1e-2)
    t = Trainer(s, tiny_dir)
    t.train_step([_group()])
    t.named("w-000001")
    ids, attn = torch.tensor([[1, 5, 9, 30, 2]]), torch.ones(1, 5, dtype=torch.long)
    with torch.no_grad():
        v1 = grpo.token_logprobs(t.model, ids, attn)
    t.train_step([_group()])
    t.named("w-000002")
    with torch.no_grad(), t._behaviour_model("w-000001") as m:
        assert torch.allclose(grpo.token_logprobs(m, ids, attn), v1, atol=1e-6)
    with torch.no_grad():  # and the current adapters are back
        assert not torch.allclose(grpo.token_logprobs(t.model, ids, attn), v1, atol=1e-4)
    assert t._behaviour is None  # no scratch copy was made
