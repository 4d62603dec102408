"""Retrieval latency of the experience pool at N experiences, as the Serve app sees it.

A real navigator process (the `Navigator` actor, its settings from `config/cpu.yaml`) is started on
an embedded nats-server over a Milvus Lite pool pre-filled with N experiences; the client then
sends `retrieve` requests over NATS request/reply, exactly as a serving replica does, and times the
round trip (query embedding + index search + ranking + two NATS hops). In the same run, in this
process, it also times the pieces: the query embedding, the in-process index search, and Milvus
Lite's own FLAT search over the same rows (so the ratio is measured side by side).

The pool holds `--real` experiences embedded from real BFCL requests and N - real random unit
vectors (embedding 100k real texts would take minutes on 2 cores); queries are paraphrases of the
real ones, and the benchmark reports how often the source request comes back first.

    .venv/bin/python tests/benchmarks/bench_retrieval.py [--n 100000] [--queries 200]
"""

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import ROOT, pct  # noqa: E402  (also puts the repository on sys.path)


def fill(pool_path: str, n: int, real_texts: list[str], real_vecs: list[list[float]]) -> float:
    from policies.memory.pool import COLLECTION, MemoryPool

    pool = MemoryPool(pool_path, 384)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    rows = [
        {
            "id": f"real{i}",
            "vector": v,
            "text": f"for a request like {t!r}: call cd first",
            "success": True,
            "state": "active",
            "meta": json.dumps({"origin": "env", "created_at": None}),
        }
        for i, (t, v) in enumerate(zip(real_texts, real_vecs))
    ]
    pool.client.insert(COLLECTION, rows)
    for start in range(len(rows), n, 5000):
        v = rng.standard_normal((min(5000, n - start), 384)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        pool.client.insert(
            COLLECTION,
            [
                {
                    "id": f"x{start + i}",
                    "vector": v[i].tolist(),
                    "text": f"experience {start + i}",
                    "success": True,
                    "state": "active",
                    "meta": "{}",
                }
                for i in range(len(v))
            ],
        )
    pool.client.flush(COLLECTION)
    secs = time.perf_counter() - t0
    pool.close()  # stops Milvus Lite's in-process server: its files are complete before the process ends
    return secs


def paraphrase(text: str) -> str:
    return "Could you please " + text[0].lower() + text[1:] + " Thanks!"


async def rpc_latency(settings, queries: list[str], k: int, nav) -> tuple[list[float], list[float], list[list[str]]]:
    from actors.bus import Bus
    from actors.events import RetrieveReply, RetrieveRequest

    bus = await Bus.from_settings(settings.nats, "bench").connect()
    try:
        for _ in range(600):  # the navigator answers once it has mirrored the pool
            if nav.poll() is not None:
                raise RuntimeError(f"the navigator exited with {nav.returncode}")
            try:
                await bus.request("retrieve", RetrieveRequest(query="warm up", k=k), RetrieveReply, timeout=1.0)
                break
            except Exception:
                await asyncio.sleep(0.5)
        ms, server_ms, ids = [], [], []
        for q in queries:
            t = time.perf_counter()
            rep = await bus.request("retrieve", RetrieveRequest(query=q, k=k, origin="serve"), RetrieveReply, timeout=5.0)
            ms.append((time.perf_counter() - t) * 1000)
            server_ms.append(rep.took_ms)
            ids.append([e.experience_id for e in rep.experiences])
        return ms, server_ms, ids
    finally:
        await bus.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--real", type=int, default=400, help="experiences embedded from real BFCL requests")
    ap.add_argument("--k", type=int, default=2, help="experiences per request (serve.experiences_k)")
    a = ap.parse_args()

    import torch

    from config.settings import load_settings
    from deploy.nats import EmbeddedNats
    from envs.bfcl import load_category
    from policies.memory.embedder import Embedder
    from policies.memory.pool import MemoryPool

    state = Path(tempfile.mkdtemp()) / "state"
    s = load_settings(None)
    s.state_dir = str(state)
    torch.set_num_threads(s.memory.search_threads)
    emb = Embedder(s.embedding.source, s.embedding.dtype)
    texts = []
    for cat in ("base", "long_context", "miss_func", "miss_param"):
        texts += [e["question"][0][0]["content"][:300] for e in load_category(cat)[0].values()]
    texts = list(dict.fromkeys(texts))[: a.real]
    real_vecs = [v for i in range(0, len(texts), 64) for v in emb.embed(texts[i : i + 64])]
    pool_path = state / "milvus" / "experiences.db"
    pool_path.parent.mkdir(parents=True)
    import multiprocessing as mp  # Milvus Lite holds its data dir until the process ends: fill in a child

    p = mp.get_context("spawn").Pool(1)
    fill_s = p.apply(fill, (str(pool_path), a.n, texts, real_vecs))
    p.close()
    p.join()  # a normal exit (Pool.__exit__ would terminate the child mid-write)

    nats = EmbeddedNats(state).start()
    s.nats.url, s.nats.password = nats.url, nats.password
    (state / "settings.json").write_text(s.model_dump_json())
    script = (
        "import asyncio, sys; sys.path.insert(0, %r)\n"
        "from config.settings import Settings\nfrom actors.navigator import Navigator\n"
        "s = Settings.model_validate_json(open(%r).read())\nasyncio.run(Navigator(s).run())\n"
        % (str(ROOT), str(state / "settings.json"))
    )
    # the environment `up` gives the navigator actor (deploy/ray_local.py)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(s.memory.search_threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    t0 = time.perf_counter()
    nav = subprocess.Popen(
        [sys.executable, "-c", script],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=open(state / "navigator.err", "w"),
    )
    queries = [paraphrase(texts[i % len(texts)]) for i in range(a.queries)]
    try:
        from actors.bus import Bus  # noqa: F401  (imported here so its import time is not in the first request)

        rpc_ms, server_ms, rpc_ids = asyncio.run(rpc_latency(s, queries, a.k, nav))
        nav_ready_s = time.perf_counter() - t0
    finally:
        nav.terminate()
        nav.wait(60)
        nats.stop()
    first = sum(ids[:1] == [f"real{i % len(texts)}"] for i, ids in enumerate(rpc_ids))

    # the pieces, in this process, over the same pool (the navigator has closed it)
    pool = MemoryPool(str(pool_path), 384)
    embed_ms, vecs = [], []
    for q in queries:
        t = time.perf_counter()
        vecs.append(emb.embed([q])[0])
        embed_ms.append((time.perf_counter() - t) * 1000)
    index_ms = []
    for v in vecs:
        t = time.perf_counter()
        pool.search(v, 4 * a.k, min_score=s.memory.min_score)
        index_ms.append((time.perf_counter() - t) * 1000)
    pool.search_milvus(vecs[0], a.k, min_score=-1)  # warm: loads segments
    milvus_ms, same = [], 0
    for v in vecs[:50]:
        t = time.perf_counter()
        ref = pool.search_milvus(v, 3, min_score=-1)
        milvus_ms.append((time.perf_counter() - t) * 1000)
        same += [h.experience_id for h in pool.search(v, 3, min_score=-1)] == [h.experience_id for h in ref]

    print(
        f"experiences={a.n} ({len(texts)} real) fill={fill_s:.1f}s; navigator answered {nav_ready_s:.1f}s after start "
        f"(mirrors the pool); torch threads={s.memory.search_threads}, embedding dtype={s.embedding.dtype}"
    )
    print(
        f"retrieve over NATS (serve -> navigator -> serve)  p50={statistics.median(rpc_ms):6.1f} ms  "
        f"p95={pct(rpc_ms, 0.95):6.1f} ms  p99={pct(rpc_ms, 0.99):6.1f} ms; source request ranked first in "
        f"{first}/{len(queries)}"
    )
    print(
        f"  of which in the navigator (embed + search + rank) p50={statistics.median(server_ms):6.1f} ms  "
        f"p95={pct(server_ms, 0.95):6.1f} ms"
    )
    print(
        f"  embed query                                    p50={statistics.median(embed_ms):6.1f} ms  "
        f"p95={pct(embed_ms, 0.95):6.1f} ms"
    )
    print(
        f"  index search (top-{4 * a.k} before ranking)             p50={statistics.median(index_ms):6.1f} ms  "
        f"p95={pct(index_ms, 0.95):6.1f} ms"
    )
    print(
        f"  milvus lite FLAT search, same rows             p50={statistics.median(milvus_ms):6.1f} ms  "
        f"p95={pct(milvus_ms, 0.95):6.1f} ms  "
        f"(index/milvus p50 {statistics.median(index_ms) / statistics.median(milvus_ms):.3f}; "
        f"same top-3 in {same}/{len(milvus_ms)})"
    )


if __name__ == "__main__":
    main()
