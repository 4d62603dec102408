"""Code that runs inside vLLM's GPU worker processes (`worker_extension_cls`), so a weight update
is one RPC carrying a file path: each worker reads the safetensors file straight to its own GPU
and loads it in place with the model's `load_weights` (Hugging Face names; vLLM fuses qkv and
gate/up itself, and copies into the existing parameters, so CUDA-graph addresses stay valid).
No tensors cross processes and no insecure serialization is needed. Importing this module never
imports vllm, so it is testable on CPU with a stand-in worker.
"""
from __future__ import annotations


class WeightLoader:
    """Mixed into vLLM's worker class by `AsyncEngineArgs(worker_extension_cls=...)`."""

    def kaizen_load_weights(self, path: str) -> int:
        """Load every tensor of a safetensors file into the served model; returns the tensor count."""
        from safetensors import safe_open

        runner = self.model_runner
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model
        device = str(getattr(self, "device", "cpu"))
        with safe_open(path, framework="pt", device=device) as f:
            names = list(f.keys())
            loaded = model.load_weights(weights=((name, f.get_tensor(name)) for name in names))
        if isinstance(loaded, (set, frozenset, list)):  # vLLM reports the (fused) parameters it wrote
            missed = sorted({n for n, _ in model.named_parameters()} - set(loaded))
            if missed:
                raise RuntimeError(f"{path} left {len(missed)} served parameters unchanged, e.g. {missed[:3]}: "
                                   "the file lacks trained tensors (an untied lm_head?)")
        return len(names)
