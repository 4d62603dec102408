"""Retrieval latency of the experience pool (Milvus Lite, FLAT / COSINE, 384-d) at N experiences.

The pool is filled with random unit vectors (embedding 100k real texts would take ~8 minutes on
2 cores); queries are real all-MiniLM-L6-v2 embeddings, and the embedding time is reported
separately. Prints insert throughput and search p50 / p95 (search only, and embed + search).

    .venv/bin/python tests/benchmarks/bench_retrieval.py [--n 100000] [--queries 200]
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import pct  # noqa: E402  (also puts the repository on sys.path)

from actors.navigator import MemoryPool  # noqa: E402
from policies.embedder import Embedder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    a = ap.parse_args()
    pool = MemoryPool(str(Path(tempfile.mkdtemp()) / "bench.db"), 384)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    for start in range(0, a.n, 5000):
        v = rng.standard_normal((min(5000, a.n - start), 384)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        rows = [{"id": f"x{start + i}", "vector": v[i].tolist(), "text": f"experience {start + i}", "success": True,
                 "state": "active", "meta": "{}"} for i in range(len(v))]
        with pool.lock:
            pool.client.insert("experiences", rows)
    with pool.lock:
        pool.client.flush("experiences")
    fill = time.perf_counter() - t0
    emb = Embedder()
    texts = [f"How do I move file number {i} into the temp folder?" for i in range(a.queries)]
    vecs, embed_ms = [], []
    for t in texts:
        s = time.perf_counter()
        vecs.append(emb.embed([t])[0])
        embed_ms.append((time.perf_counter() - s) * 1000)
    pool.search(vecs[0], 3, min_score=-1)  # warm: loads segments
    search_ms = []
    for v in vecs:
        s = time.perf_counter()
        pool.search(v, 3, min_score=-1)
        search_ms.append((time.perf_counter() - s) * 1000)
    total = [e + s for e, s in zip(embed_ms, search_ms)]
    print(f"experiences={a.n} fill={fill:.1f}s ({a.n / fill:.0f} rows/s) count={pool.count()}")
    print(f"search top-3       p50={statistics.median(search_ms):7.1f} ms  p95={pct(search_ms, .95):7.1f} ms")
    print(f"embed query        p50={statistics.median(embed_ms):7.1f} ms  p95={pct(embed_ms, .95):7.1f} ms")
    print(f"embed + search     p50={statistics.median(total):7.1f} ms  p95={pct(total, .95):7.1f} ms")


if __name__ == "__main__":
    main()
