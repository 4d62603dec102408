"""GPU memory and disk planner: what every role of `up` needs, from the model's config.json and the settings.

Ray's fractional `num_gpus` is bookkeeping, not a memory cap, and vLLM checks free memory only when an
engine starts, so without a plan the last process to start fails (or a learner step runs out of memory an
hour in). `up` calls `plan()` for any preset that puts work on a GPU and refuses to start when the sum does
not fit, naming the knob to change. Figures are estimates with stated formulas (GiB):
- a vLLM engine reserves `model.gpu_memory_utilization` of the GPU; inside it, the weights, the KV cache
  of one `max_model_len` sequence and ~1.5 GiB of activations and CUDA graphs must fit;
- a transformers engine on the GPU holds bf16 weights (a serving one two copies: the standby copy a swap
  writes into);
- the learner: full fine-tuning 16 bytes a parameter (fp32 weights, gradients, two AdamW moments) plus an
  fp32 reference copy (kl_coef > 0) and an fp32 behaviour copy (max_staleness > 0); LoRA keeps the frozen
  base in `base_dtype` and trains adapters (~0.5% of the parameters at rank 16); activations are one
  micro-batch of `max_seq_tokens` (hidden states of every layer, or one per layer with gradient
  checkpointing) plus three float32 [tokens, vocab] tensors (logits, log-softmax, their gradient);
- every GPU process pays ~0.5 GiB of CUDA context;
- swaps from memory (`serve.weights_transport: shared`) copy the gate engine's bf16 weights over CUDA IPC:
  no extra copy, but the gate must be on the GPU;
- disk: the base model, `gate.keep_versions` served versions in bf16, `learner.checkpoints_kept`
  checkpoints (full: fp32 weights + AdamW = 12 bytes a parameter; LoRA: adapters only) and the stream's
  `nats.max_bytes`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

GiB = 1024**3
CUDA_CONTEXT = 0.5
VLLM_OVERHEAD = 1.5


@dataclass
class Shape:
    params: float
    vocab: int
    hidden: int
    layers: int
    kv_heads: int
    head_dim: int
    tied: bool

    @classmethod
    def from_config(cls, c: dict) -> "Shape":
        h, layers, vocab = c["hidden_size"], c["num_hidden_layers"], c["vocab_size"]
        heads = c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or heads
        hd = c.get("head_dim") or h // heads
        inter = c["intermediate_size"]
        tied = bool(c.get("tie_word_embeddings", False))
        attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
        per_layer = attn + 3 * h * inter + 2 * h
        params = vocab * h * (1 if tied else 2) + layers * per_layer + h
        return cls(params, vocab, h, layers, kv, hd, tied)

    def kv_gib(self, tokens: int) -> float:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2 * tokens / GiB

    def gib(self, bytes_per_param: float) -> float:
        return self.params * bytes_per_param / GiB


def shape_of(model_dir: str | Path) -> Shape:
    return Shape.from_config(json.loads((Path(model_dir) / "config.json").read_text()))


@dataclass
class Plan:
    gpu: list[tuple[str, float, str]] = field(default_factory=list)  # (role, GiB, how)
    disk: list[tuple[str, float, str]] = field(default_factory=list)
    gpu_gib: float = 0.0
    disk_gib: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def gpu_total(self) -> float:
        return sum(x[1] for x in self.gpu)

    @property
    def disk_total(self) -> float:
        return sum(x[1] for x in self.disk)

    @property
    def fits(self) -> bool:
        return not self.problems

    def table(self) -> str:
        lines = [f"GPU ({self.gpu_gib:.0f} GiB)"] + [f"  {r:<24} {g:7.1f} GiB  {w}" for r, g, w in self.gpu]
        lines += [f"  {'total':<24} {self.gpu_total:7.1f} GiB", f"disk ({self.disk_gib:.0f} GiB free)"]
        lines += [f"  {r:<24} {g:7.1f} GiB  {w}" for r, g, w in self.disk] + [f"  {'total':<24} {self.disk_total:7.1f} GiB"]
        return "\n".join(lines + [f"does not fit: {p}" for p in self.problems])


def _roles(s) -> dict[str, int]:
    """Engine roles `up` runs, and how many instances of each."""
    roles = {"serve": s.serve.replicas, "explorer": 1, "gate": 1}
    if not s.judge.base_url:
        roles["judge"] = 1
    if s.questioner.synthetic_share > 0 and not s.questioner.generator_base_url:
        roles["questioner"] = 1
    if s.gate.canary_share > 0:
        roles["canary"] = s.serve.replicas
    return roles


def plan(s, shape: Shape, gpu_gib: float, disk_gib: float) -> Plan:
    p = Plan(gpu_gib=gpu_gib, disk_gib=disk_gib)
    m, L = s.model, s.learner
    weights = shape.gib(2)  # bf16
    on_gpu = m.device.startswith("cuda")
    for role, n in _roles(s).items():
        if m.engine == "vllm" and role in m.vllm_roles:
            share = m.gpu_memory_utilization * gpu_gib
            need = weights + shape.kv_gib(m.max_model_len) + VLLM_OVERHEAD
            p.gpu.append(
                (
                    f"{role} (vLLM) x{n}",
                    n * (share + CUDA_CONTEXT),
                    f"{m.gpu_memory_utilization:.2f} of the GPU each; inside: weights {weights:.1f} + KV of "
                    f"{m.max_model_len} tokens {shape.kv_gib(m.max_model_len):.1f} + {VLLM_OVERHEAD}",
                )
            )
            if need > share:
                p.problems.append(
                    f"a vLLM engine needs {need:.1f} GiB but model.gpu_memory_utilization="
                    f"{m.gpu_memory_utilization} gives {share:.1f}: raise it, or lower model.max_model_len"
                )
        elif on_gpu:
            copies = 2 if role in ("serve", "canary") else 1  # serving engines keep a standby copy for swaps
            p.gpu.append(
                (
                    f"{role} (transformers) x{n}",
                    n * (copies * weights + 0.5 + CUDA_CONTEXT),
                    f"{copies} bf16 cop{'ies' if copies > 1 else 'y'} of the weights",
                )
            )
    if L.device.startswith("cuda"):
        tokens = L.micro_batch_size * L.max_seq_tokens
        act = (
            shape.layers if not L.gradient_checkpointing else 2
        ) * tokens * shape.hidden * 2 * 17 / GiB + 3 * tokens * shape.vocab * 4 / GiB
        if L.lora_rank > 0:
            base = shape.gib(2 if L.base_dtype == "bfloat16" else 4)
            adapters = shape.gib(16) * 0.005 * L.lora_rank / 16
            p.gpu.append(
                (
                    "learner (LoRA)",
                    base + adapters + act + CUDA_CONTEXT,
                    f"frozen {L.base_dtype} base {base:.1f} + adapters with AdamW {adapters:.1f} + activations "
                    f"{act:.1f} (reference = adapters off; stale behaviour = older adapters)",
                )
            )
        else:
            core = shape.gib(16)
            ref = shape.gib(4) if L.kl_coef > 0 else 0.0
            beh = shape.gib(4) if L.max_staleness > 0 else 0.0
            p.gpu.append(
                (
                    "learner (full)",
                    core + ref + beh + act + CUDA_CONTEXT,
                    f"fp32 weights+grads+AdamW {core:.1f} + reference {ref:.1f} + behaviour {beh:.1f} + activations {act:.1f}",
                )
            )
            if core + ref + beh > 0.5 * gpu_gib:
                p.problems.append(
                    f"full fine-tuning needs {core + ref + beh:.0f} GiB before activations: set "
                    "learner.lora_rank (e.g. 16) to train adapters over a frozen bf16 base"
                )
        if act > 0.25 * gpu_gib:
            p.problems.append(
                f"learner activations {act:.0f} GiB: lower learner.max_seq_tokens or "
                "learner.micro_batch_size, or set learner.gradient_checkpointing"
            )
    if s.serve.weights_transport == "shared" and m.engine == "vllm" and not on_gpu:
        p.problems.append(
            "serve.weights_transport shared copies the gate engine's weights over CUDA IPC, but the "
            "gate runs on the CPU: set model.device cuda, or serve.weights_transport file"
        )
    if p.gpu_total > gpu_gib:
        biggest = max(p.gpu, key=lambda x: x[1])[0]
        p.problems.append(
            f"GPU needs {p.gpu_total:.1f} GiB of {gpu_gib:.1f} (largest: {biggest}); set "
            "gate.canary_share 0, judge.base_url / questioner.generator_base_url to 'self', "
            "or lower model.gpu_memory_utilization"
        )
    p.disk.append(("base model", weights, "bf16 folder"))
    p.disk.append((f"versions x{s.gate.keep_versions}", s.gate.keep_versions * weights, "bf16 safetensors each"))
    ck = shape.gib(16) * 0.005 * max(1, L.lora_rank) / 16 if L.lora_rank > 0 else shape.gib(12)
    p.disk.append(
        (
            f"checkpoints x{L.checkpoints_kept}",
            L.checkpoints_kept * ck,
            "adapters + AdamW" if L.lora_rank > 0 else "fp32 weights + AdamW",
        )
    )
    if s.nats.max_bytes > 0:
        p.disk.append(("event stream", s.nats.max_bytes / GiB, "nats.max_bytes"))
    if p.disk_total > disk_gib:
        p.problems.append(
            f"disk needs {p.disk_total:.1f} GiB of {disk_gib:.1f} free: lower gate.keep_versions or "
            "learner.checkpoints_kept, or set learner.lora_rank (small checkpoints)"
        )
    return p


def refuse_quantized(s, config: dict) -> str | None:
    """Weights are copied into vLLM's parameters in place (policies/engines/vllm_worker.py), which bypasses vLLM's own
    layerwise reload: right for bf16/fp16 weights, wrong for FP8 or other quantized ones (their scales and packed
    layouts are rebuilt by that reload). Such a checkpoint is refused with the reason, never served wrong."""
    q = config.get("quantization_config")
    if q and s.model.engine == "vllm":
        return (
            f"the model is quantized ({q.get('quant_method', q.get('quant_type', 'unknown method'))}): in-place "
            "weight updates would load its tensors without vLLM's quantized reload; use a bf16 or fp16 checkpoint"
        )
    return None


def check(s, model_dir: str | Path) -> Plan | None:
    """The plan for a preset that uses a GPU (None otherwise); raises SystemExit when it does not fit."""
    import shutil

    uses_gpu = s.model.engine == "vllm" or s.model.device.startswith("cuda") or s.learner.device.startswith("cuda")
    if not uses_gpu:
        return None
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("this preset puts work on a GPU, and torch sees none (CUDA not available)")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GiB
    Path(s.state).mkdir(parents=True, exist_ok=True)
    p = plan(s, shape_of(model_dir), gpu_gib, shutil.disk_usage(s.state).free / GiB)
    if why := refuse_quantized(s, json.loads((Path(model_dir) / "config.json").read_text())):
        p.problems.append(why)
    if not p.fits:
        raise SystemExit("the preset does not fit this machine:\n" + p.table())
    return p
