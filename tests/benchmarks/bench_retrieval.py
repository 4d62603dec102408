"""Retrieval latency of the experience pool at N experiences, side by side in one run: the
in-process exact index the navigator answers from, and Milvus Lite (FLAT / COSINE, 384-d) itself.

The pool is filled with random unit vectors (embedding 100k real texts would take ~8 minutes on
2 cores); queries are real all-MiniLM-L6-v2 embeddings, and the embedding time is reported
separately. Prints insert throughput, the time to mirror the pool into the index when the
navigator starts, search p50 / p95 for both, and embed + search for the hot path.

    .venv/bin/python tests/benchmarks/bench_retrieval.py [--n 100000] [--queries 200]
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import pct  # noqa: E402  (also puts the repository on sys.path)

from policies.memory_pool import MemoryPool  # noqa: E402
from policies.embedder import Embedder  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    a = ap.parse_args()
    pool_path = str(Path(tempfile.mkdtemp()) / "bench.db")
    pool = MemoryPool(pool_path, 384)
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
    t0 = time.perf_counter()
    pool.index = type(pool.index)(384)  # what a starting navigator does: mirror the whole pool
    mirrored = pool.load_index()
    mirror_s = time.perf_counter() - t0
    emb = Embedder()
    texts = [f"How do I move file number {i} into the temp folder?" for i in range(a.queries)]
    vecs, embed_ms = [], []
    for t in texts:
        s = time.perf_counter()
        vecs.append(emb.embed([t])[0])
        embed_ms.append((time.perf_counter() - s) * 1000)
    pool.search_milvus(vecs[0], 3, min_score=-1)  # warm: loads segments
    search_ms, milvus_ms, same = [], [], 0
    for v in vecs:
        s = time.perf_counter()
        hits = pool.search(v, 3, min_score=-1)
        search_ms.append((time.perf_counter() - s) * 1000)
        s = time.perf_counter()
        ref = pool.search_milvus(v, 3, min_score=-1)
        milvus_ms.append((time.perf_counter() - s) * 1000)
        same += [h.experience_id for h in hits] == [h.experience_id for h in ref]
    total = [e + s for e, s in zip(embed_ms, search_ms)]
    print(f"experiences={a.n} fill={fill:.1f}s ({a.n / fill:.0f} rows/s) count={pool.count()}; "
          f"index mirrored {mirrored} rows in {mirror_s:.1f}s")
    print(f"index search top-3   p50={statistics.median(search_ms):7.1f} ms  p95={pct(search_ms, .95):7.1f} ms")
    print(f"milvus search top-3  p50={statistics.median(milvus_ms):7.1f} ms  p95={pct(milvus_ms, .95):7.1f} ms "
          f"(index/milvus p50 ratio {statistics.median(search_ms) / statistics.median(milvus_ms):.3f}; "
          f"same top-3 in {same}/{len(vecs)} queries)")
    print(f"embed query          p50={statistics.median(embed_ms):7.1f} ms  p95={pct(embed_ms, .95):7.1f} ms")
    print(f"embed + index search p50={statistics.median(total):7.1f} ms  p95={pct(total, .95):7.1f} ms")


if __name__ == "__main__":
    main()
