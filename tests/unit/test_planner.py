"""The GPU memory and disk planner on real model configs (no GPU needed)."""

import pytest

from config.settings import load_settings
from deploy.planner import Shape, plan

QWEN2_7B = {
    "hidden_size": 3584,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "intermediate_size": 18944,
    "vocab_size": 152064,
    "tie_word_embeddings": False,
}
SMOLLM2_135M = {
    "hidden_size": 576,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "intermediate_size": 1536,
    "vocab_size": 49152,
    "tie_word_embeddings": True,
}


def test_parameter_count_from_config():
    assert Shape.from_config(QWEN2_7B).params == pytest.approx(7.62e9, rel=0.01)
    assert Shape.from_config(SMOLLM2_135M).params == pytest.approx(134.5e6, rel=0.01)


def test_the_7b_preset_fits_one_h100_and_its_disk():
    s = load_settings("config/gpu-7b.yaml")
    p = plan(s, Shape.from_config(QWEN2_7B), gpu_gib=78, disk_gib=64)
    assert p.fits, p.table()
    assert 60 < p.gpu_total <= 78 and p.disk_total <= 64
    roles = " ".join(r for r, _, _ in p.gpu)
    assert "learner (LoRA)" in roles and "judge" not in roles and "canary" not in roles


def test_7b_on_the_default_gpu_preset_is_refused_with_the_knobs_to_change():
    s = load_settings("config/gpu.yaml")
    p = plan(s, Shape.from_config(QWEN2_7B), gpu_gib=78, disk_gib=64)
    text = " ".join(p.problems)
    assert not p.fits and "learner.lora_rank" in text and "gpu_memory_utilization" in text
    assert "keep_versions" in text  # 5 kept versions x 14 GiB + fp32 checkpoints exceed 64 GiB
    small = plan(s, Shape.from_config(SMOLLM2_135M), gpu_gib=78, disk_gib=64)
    assert small.fits, small.table()  # the default GPU preset is sized for small models


def test_a_vllm_share_too_small_for_the_weights_is_named():
    s = load_settings("config/gpu-7b.yaml", **{"model.gpu_memory_utilization": 0.15})
    p = plan(s, Shape.from_config(QWEN2_7B), gpu_gib=78, disk_gib=64)
    assert any("model.gpu_memory_utilization=0.15" in x for x in p.problems)


def test_shared_swaps_need_the_gate_on_the_gpu_and_cost_no_memory():
    s = load_settings("config/gpu-7b.yaml")
    assert s.serve.weights_transport == "shared"
    shared = plan(s, Shape.from_config(QWEN2_7B), gpu_gib=78, disk_gib=64)
    by_file = plan(
        load_settings("config/gpu-7b.yaml", **{"serve.weights_transport": "file"}),
        Shape.from_config(QWEN2_7B),
        gpu_gib=78,
        disk_gib=64,
    )
    assert shared.fits and shared.gpu_total == by_file.gpu_total  # the gate's copy is the shared one
    cpu_gate = load_settings("config/gpu-7b.yaml", **{"model.device": "cpu"})
    p = plan(cpu_gate, Shape.from_config(QWEN2_7B), gpu_gib=78, disk_gib=64)
    assert any("serve.weights_transport" in x and "model.device cuda" in x for x in p.problems)


def test_a_quantized_checkpoint_is_refused_with_the_reason_on_vllm():
    from deploy.planner import refuse_quantized

    s = load_settings("config/gpu-7b.yaml")
    fp8 = {**QWEN2_7B, "quantization_config": {"quant_method": "fp8", "activation_scheme": "dynamic"}}
    why = refuse_quantized(s, fp8)
    assert why and "fp8" in why and "bf16" in why
    assert refuse_quantized(s, QWEN2_7B) is None
    assert refuse_quantized(load_settings(None), fp8) is None  # transformers on the CPU loads it as it is
