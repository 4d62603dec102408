"""The `models` step of tests/benchmarks/gpu_up_check.py: the base model converted once into the state dir (the
checkout's `.kaizen/model`, where tests/gpu looks for it), and a config folder of the Qwen2-7B shape for
bench_vllm_swap's dummy weights: 7B's layers with the base model's tokenizer (see gpu_up_check's docstring)."""

import json
import shutil
import time
from pathlib import Path

QWEN2_7B_LAYERS = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "torch_dtype": "bfloat16",
    "use_sliding_window": False,
    "sliding_window": None,
    "max_window_layers": 28,
    "attention_dropout": 0.0,
    "initializer_range": 0.02,
    "use_cache": True,
}


def models(a) -> int:
    from deploy.planner import Shape
    from policies.weights.model_store import ensure_base_model

    t0, out = time.monotonic(), Path(a.config_7b)
    figures = {}
    if not a.dry_run:
        base = ensure_base_model(Path(a.state), progress=False)
        figures["base_ready_s"] = round(time.monotonic() - t0, 1)
    else:
        base = Path(a.state) / "model" / "smollm2-135m-instruct"
    out.mkdir(parents=True, exist_ok=True)
    have = json.loads((base / "config.json").read_text()) if (base / "config.json").exists() else {}
    cfg = {
        **QWEN2_7B_LAYERS,
        **{k: have.get(k, d) for k, d in (("vocab_size", 49152), ("bos_token_id", 1), ("eos_token_id", 2))},
    }  # the tokenizer's
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    copied = []
    for f in sorted(base.glob("*")) if base.is_dir() else []:
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)
            copied.append(f.name)
    if not a.dry_run and "tokenizer.json" not in copied:
        print(f"no tokenizer in {base}")
        return 1
    figures["shape_7b_params_b"] = round(Shape.from_config(cfg).params / 1e9, 2)
    print(
        f"base model {base} ({'converted' if not a.dry_run else 'not converted: dry run'}); 7B-shaped config "
        f"{out}: {figures['shape_7b_params_b']}B parameters; tokenizer files {copied or 'none'}"
    )
    Path(a.json).write_text(json.dumps(figures))
    return 0
