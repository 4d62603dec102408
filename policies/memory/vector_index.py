"""Exact in-process cosine index that mirrors the Milvus Lite experience pool for reads.

Milvus Lite stays the durable store (and is rebuilt from the stream); this index answers the
hot path. Rows are unit vectors kept as float16 in one contiguous matrix, so a top-k query at
100k experiences is one 100k x 384 half-precision mat-vec (about 77 MB read) plus a top-k: a
few milliseconds on one core, exact (no approximation, so no recall to trade). Memory is
N x dim x 2 bytes; past a few hundred thousand rows a partitioned index or a Milvus server is
the better tool. Upserts by id overwrite in place; the state (active / quarantined) is a mask.
"""

from __future__ import annotations

import threading


class VectorIndex:
    def __init__(self, dim: int, capacity: int = 1024):
        import torch

        self.torch, self.dim = torch, dim
        self.mat = torch.zeros(capacity, dim, dtype=torch.float16)
        self.active = torch.zeros(capacity, dtype=torch.bool)
        self.ids: list[str] = []
        self.texts: list[str] = []
        self.row: dict[str, int] = {}
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.ids)

    def _grow(self, need: int) -> None:
        cap = self.mat.shape[0]
        if need <= cap:
            return
        new = max(need, cap * 2)
        mat = self.torch.zeros(new, self.dim, dtype=self.torch.float16)
        mat[:cap] = self.mat
        act = self.torch.zeros(new, dtype=self.torch.bool)
        act[:cap] = self.active
        self.mat, self.active = mat, act

    def upsert(self, rows: list[dict]) -> None:
        """rows: {"id", "vector" (unit length), "text", "state"}; an existing id is overwritten."""
        if not rows:
            return
        vecs = self.torch.tensor([r["vector"] for r in rows], dtype=self.torch.float32)
        with self.lock:
            self._grow(len(self.ids) + len(rows))
            for r, v in zip(rows, vecs):
                i = self.row.get(r["id"])
                if i is None:
                    i = len(self.ids)
                    self.row[r["id"]] = i
                    self.ids.append(r["id"])
                    self.texts.append(r.get("text", ""))
                else:
                    self.texts[i] = r.get("text", "")
                self.mat[i] = v.to(self.torch.float16)
                self.active[i] = r.get("state", "active") == "active"

    def set_state(self, exp_id: str, state: str) -> bool:
        with self.lock:
            i = self.row.get(exp_id)
            if i is None:
                return False
            self.active[i] = state == "active"
            return True

    def search(self, vector: list[float], k: int, min_score: float = -1.0) -> list[tuple[str, str, float]]:
        """(id, text, cosine) of the top-k active rows scoring at least `min_score`, best first."""
        torch = self.torch
        q = torch.tensor(vector, dtype=torch.float16)
        with self.lock:
            n = len(self.ids)
            if n == 0 or k <= 0:
                return []
            scores = (self.mat[:n] @ q).float()
            scores.masked_fill_(~self.active[:n], float("-inf"))
            top = torch.topk(scores, min(k, n))
            out = [(self.ids[i], self.texts[i], float(s)) for s, i in zip(top.values.tolist(), top.indices.tolist())]
        return [o for o in out if o[2] >= min_score]
