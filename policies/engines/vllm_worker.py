"""Code that runs inside vLLM's GPU worker processes (`worker_extension_cls`), so a weight update is one RPC:
- `kaizen_load_shared(ref)`: the gate engine's weights, already on this GPU, mapped over CUDA IPC from the
  plain-data `SharedRef` (`policies/weights/shared.py`) and copied in; nothing is read from disk;
- `kaizen_load_weights(path)`: the fallback and durable record: each worker reads the safetensors file
  straight to its own GPU.
Either way the model's `load_weights` copies Hugging Face names into the existing parameters in place (vLLM
fuses qkv and gate/up itself), so CUDA-graph addresses stay valid. No pickled callables or tensors cross the
RPC (its arguments are strings and numbers). Importing this module never imports vllm, so it is testable on
CPU with a stand-in worker.
"""

from __future__ import annotations


class WeightLoader:
    """Mixed into vLLM's worker class by `AsyncEngineArgs(worker_extension_cls=...)`."""

    def _model(self):
        runner = self.model_runner
        return runner.get_model() if hasattr(runner, "get_model") else runner.model

    def _load(self, pairs, what: str) -> int:
        """Feed (name, tensor) pairs to the model's `load_weights`; refuses an update that leaves served
        parameters unchanged. Returns the tensor count."""
        model, names = self._model(), []

        def counted():
            for name, t in pairs:
                names.append(name)
                yield name, t

        loaded = model.load_weights(weights=counted())
        if isinstance(loaded, (set, frozenset, list)):  # vLLM reports the (fused) parameters it wrote
            missed = sorted({n for n, _ in model.named_parameters()} - set(loaded))
            if missed:
                raise RuntimeError(
                    f"{what} left {len(missed)} served parameters unchanged, e.g. {missed[:3]}: "
                    "the file lacks trained tensors (an untied lm_head?)"
                )
        return len(names)

    def kaizen_load_weights(self, path: str) -> int:
        """Load every tensor of a safetensors file (or of the shards a shard index names) into the served model;
        returns the tensor count."""
        from policies.weights.model_store import iter_weights

        return self._load(iter_weights(path, str(getattr(self, "device", "cpu"))), path)

    def kaizen_load_shared(self, ref: dict) -> dict:
        """Copy a `SharedRef`'s tensors into the served model. Never raises: {"ok": False, "error": ...} tells
        the engine to load the file instead (the weights changed during the copy, or their owner is gone)."""
        from policies.weights.shared import read_shared

        try:
            n = read_shared(ref, lambda views: self._load(views, f"shared weights of {ref.get('version')}"))
        except Exception as exc:
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:300]}
        return {"ok": True, "tensors": n}
