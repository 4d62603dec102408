"""Which engine each role gets: `make_engine(settings, model_dir, version, role)`.

vLLM for the roles in `model.vllm_roles` when `model.engine` is vllm (each vLLM engine reserves GPU memory, so only
the high-throughput roles get one; imported only here, so the CPU path never imports vllm), else transformers
(`policies/engines/engine.py`): serving roles batch concurrent requests, the held-out scorers' `eval` engine and the
explorer's share prefills (`policies/engines/shared_decode.py`). Every engine starts under the device's start-up lock
(`policies/device_lock.py`).
"""

from __future__ import annotations

from pathlib import Path

from policies.device_lock import device_startup
from policies.engines.engine import TransformersEngine
from policies.engines.generation import Engine

ROLES = ("serve", "canary", "explorer", "gate", "judge", "questioner", "eval")
# The held-out scorers decode one token a step for a batch of left-padded rows. On CPU, torch's sdpa kernel took 47% of
# such a check's time (16.6 ms a call, against 1.6 ms for a matrix product); the eager attention's two small products
# make the whole check faster (tests/benchmarks/bench_guard_check.py, LOG.md). Other roles keep transformers' default.
EVAL_ATTENTION_CPU = "eager"
# Roles whose batches repeat one context: the held-out scorers' k samples of an entry, and the explorer's group of a
# task (its samples differ only in the forced call's name and, for half of them, the experiences). Their prompts are
# prefilled once each, after the prefix all of them share (`policies/engines/shared_decode.py`).
SHARED_PREFILL = ("eval", "explorer")


def make_engine(settings, model_dir: str | Path, version: str = "w-000000", role: str = "serve") -> Engine:
    """The engine for one role: vLLM when `model.engine` is vllm and the role is in `model.vllm_roles`
    (vLLM engines reserve GPU memory each, so only the high-throughput roles get one), else transformers."""
    if role not in ROLES:
        raise ValueError(f"unknown engine role {role!r}; known: {ROLES}")
    m = settings.model
    if m.engine == "vllm" and role in m.vllm_roles:
        from policies.engines.vllm_engine import VllmEngine

        with device_startup(settings.state, "cuda"):  # vLLM profiles free GPU memory while it starts
            return VllmEngine(
                model_dir,
                dtype=m.serve_dtype,
                gpu_memory_utilization=m.gpu_memory_utilization,
                max_model_len=m.max_model_len,
                enforce_eager=m.enforce_eager,
                version=version,
            )
    serving = role in ("serve", "canary")
    with device_startup(settings.state, m.device):
        return TransformersEngine(
            model_dir,
            dtype=m.serve_dtype,
            device=m.device,
            threads=m.torch_threads,
            version=version,
            standby=serving,
            max_batch=settings.serve.max_batch if serving else 1,
            batch_window_ms=settings.serve.batch_window_ms,
            share_prefill=role in SHARED_PREFILL,
            attention=EVAL_ATTENTION_CPU if role == "eval" and m.device == "cpu" else None,
        )
