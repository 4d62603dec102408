"""Low-rank adapters for the learner (`learner.lora_rank` > 0): what lets a 7B learner fit one GPU.

Full fine-tuning keeps fp32 weights, gradients and two AdamW moments: 16 bytes a parameter (122 GB
at 7.6B) before the reference and behaviour copies. With LoRA (peft) the base weights stay frozen in
`learner.base_dtype` (bf16: 2 bytes a parameter) and only adapters on every linear layer train, so
gradients and optimizer states are megabytes. The rest of the loop is unchanged:
- the reference policy of the KL term is the same model with its adapters disabled (no second copy);
- a served version is the merged weights (W + B·A·scale, every base name, the same file format);
- a checkpoint holds the adapters, the optimizer and the version the base was last reset to, not
  the base itself (it is a stored version's file), so checkpoints are small;
- after a rejection or rollback the learner continues from the live version: its weights become
  the new base and the adapters start again from zero (B = 0: the model is exactly that version).
"""

from __future__ import annotations

from contextlib import contextmanager


def wrap(model, rank: int, alpha: float, targets: str | list[str]):
    from peft import LoraConfig, get_peft_model

    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none")
    return get_peft_model(model, cfg)


def _layers(model):
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


def base_name(peft_name: str) -> str:
    """`base_model.model.model.layers.0.q_proj.base_layer.weight` -> `model.layers.0.q_proj.weight`."""
    name = peft_name.removeprefix("base_model.model.")
    return name.replace(".base_layer.", ".")


def merged_state_dict(model, dtype) -> dict:
    """The served weights: every base tensor under its original name, adapters merged in; the model is not
    changed (no merge_and_unload: the adapters keep training). One layer's delta exists at a time (peft keeps
    adapters in float32: all of a 7B's deltas at once were ~24 GiB), merged in float32 and stored in `dtype`."""
    import torch

    from policies.weights.model_store import aliases

    layers = {base_name(name) + ".weight": layer for name, layer in _layers(model)}
    with torch.no_grad():
        sd = {}
        raw = model.state_dict()
        skip = aliases(raw)
        for k, v in raw.items():
            if "lora_" in k or k in skip:
                continue
            name = base_name(k)
            w = v.detach()
            if name in layers:
                w = w.float() + layers[name].get_delta_weight("default").float()  # freed before the next layer
            sd[name] = w.to("cpu", dtype)
            del w
    return sd


def adapter_state(model) -> dict:
    """The trainable tensors (adapters), on CPU: what a checkpoint and the behaviour history keep."""
    return {k: v.detach().to("cpu").clone() for k, v in model.named_parameters() if v.requires_grad}


def load_adapter_state(model, state: dict) -> None:
    import torch

    params = dict(model.named_parameters())
    missing = [k for k, p in params.items() if p.requires_grad and k not in state]
    if missing:
        raise ValueError(f"adapter state lacks {len(missing)} tensors, e.g. {missing[:2]}")
    with torch.no_grad():
        for k, v in state.items():
            params[k].copy_(v.to(params[k].device, params[k].dtype))


def reset_base(model, sd: dict) -> None:
    """Make `sd` (a full served version, base names) the frozen base and zero the adapters: the model then
    computes exactly that version."""
    import torch

    params = {base_name(k): p for k, p in model.state_dict().items() if "lora_" not in k}
    with torch.no_grad():
        for k, v in sd.items():
            if k in params:
                params[k].copy_(v.to(params[k].device, params[k].dtype))
        for _, layer in _layers(model):
            for b in layer.lora_B.values():
                b.weight.zero_()


@contextmanager
def adapters_off(model):
    """The base policy (the KL reference)."""
    with model.disable_adapter():
        yield model


@contextmanager
def adapter_of(model, state: dict):
    """The model with another version's adapters for a moment (behaviour log-probs of a stale sample)."""
    now = adapter_state(model)
    load_adapter_state(model, state)
    try:
        yield model
    finally:
        load_adapter_state(model, now)
