"""Weight swaps under sustained load (CPU): latency and failed requests with and without swaps, side by side.

Starts what `up` starts for serving: an embedded nats-server, local Ray, and the Serve app (one replica,
SmolLM2-135M). This script then plays the broadcaster's part of the protocol: it writes two weights
versions (the base weights and a perturbed copy), and for each swap moves the LIVE pointer to the other
one (its copy in the state dir and the key in the bus's key-value bucket, as `LivePolicy.announce` does) and
publishes `evo.weights_promoted`; the replica copies the file into a standby copy of its model
while requests run, flips the model pointer and reports `evo.weights_swapped`. Meanwhile `--clients` threads keep
sending chat completions
through the OpenAI client (16 new tokens each). Time alternates between blocks without swaps and
blocks with swaps (`--swaps` in all), so both conditions see the same machine; the latency of every
request is attributed to its block. Swaps alternate between the transports in `--transports`: `file` (the
replica reads the safetensors file) and `shared` (the replica copies the weights from this script's
gate-like engine, which takes each version in before the pointer moves, as the broadcaster's gate engine
has when it promotes a candidate; `serve.weights_transport: shared`, `policies/weights/shared.py`).

    .venv/bin/python tests/benchmarks/bench_serve_swaps.py [--swaps 20] [--clients 3] [--block-s 45] \
        [--transports file,shared]
"""
import argparse
import asyncio
import os
import json
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import pct  # noqa: E402  (also puts the repository on sys.path)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=20)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--block-s", type=float, default=45.0)
    ap.add_argument("--blocks", type=int, default=4, help="blocks of each kind, alternating")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--transports", default="file,shared", help="how swaps reach the replica, alternating")
    ap.add_argument("--out", default="", help="write the figures as JSON here")
    a = ap.parse_args()

    import openai
    import torch
    from safetensors.torch import load_file

    from actors.bus import Bus
    from actors.events import WeightsPromoted, WeightsRef
    from config.settings import load_settings
    from deploy import ray_local
    from deploy.nats import EmbeddedNats, free_port
    from policies.weights.live_board import LiveBoard
    from policies.weights.model_store import WeightsStore, ensure_base_model

    s = load_settings(None)
    s.state_dir = str(Path(tempfile.mkdtemp(prefix="kz-swaps-")) / "st")
    s.serve.port = free_port()
    s.serve.api_key = "bench-key"
    s.state.mkdir(parents=True)
    base = ensure_base_model(Path(".kaizen") if Path(".kaizen/model").exists() else s.state, progress=True)
    s.model.source, s.model.path = "hf-folder", str(base)
    nats = EmbeddedNats(s.state).start()
    s.nats.url, s.nats.password = nats.url, nats.password
    store = WeightsStore(s.state)
    sd = {k: v.to(torch.bfloat16) for k, v in load_file(str(Path(base) / "model.safetensors")).items()}
    torch.manual_seed(0)
    other = {k: (v.float() * (1 + 0.01 * torch.randn_like(v.float()))).to(torch.bfloat16) for k, v in sd.items()}
    refs = []
    for name, weights in (("w-000001", other), ("w-000002", sd)):
        path, sha = store.save(weights, name, {"parent": "w-000000"})
        refs.append(WeightsRef(version=name, path=str(path), sha256=sha, parent="w-000000", step=1))

    async def ensure_stream():
        bus = await Bus.from_settings(s.nats, "bench").connect()
        await bus.close()
    asyncio.run(ensure_stream())
    transports = a.transports.split(",")
    gate = None
    if "shared" in transports:
        from policies.engines.engine import TransformersEngine

        gate = TransformersEngine(base, dtype="bfloat16", threads=1)  # the broadcaster's gate engine, shared
        gate.share(store.dir / "shared-layout.json")
    os.environ.update(ray_local.process_env(s.state))  # this script is its own entry point, like main.py
    ray_local.init_ray(s)
    from ray import serve

    from serve.app import build_app

    serve.start(http_options={"host": "127.0.0.1", "port": s.serve.port})
    serve.run(build_app(s, s.serve.api_key), name="kaizen", route_prefix="/", blocking=False)
    import httpx

    for _ in range(600):
        try:
            if httpx.get(f"http://127.0.0.1:{s.serve.port}/readyz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.serve.port}/v1", api_key="bench-key", max_retries=0,
                           timeout=120)
    records, stop = [], threading.Event()  # (start, end, ok)

    def load(i):
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            ok = True
            try:
                client.chat.completions.create(model=s.model.name, max_tokens=a.max_tokens, temperature=0.7,
                                               messages=[{"role": "user", "content": f"Tell me a fact about number {i}-{n}."}],
                                               extra_body={"memory": False})
            except Exception as exc:  # noqa: BLE001 - every failure counts
                ok = False
                print("request failed:", repr(exc)[:200], flush=True)
            records.append((t0, time.perf_counter(), ok))
            n += 1

    swap_ms: dict[str, list[float]] = {t: [] for t in transports}
    vias: list[str] = []

    async def swapper(blocks):
        bus = await Bus.from_settings(s.nats, "bench").connect()
        board = await LiveBoard(s, store).open(bus.js)  # the pointer's bucket, which the replica watches
        sub = await bus.nc.subscribe("evo.weights_swapped")
        try:
            k = 0
            for kind, t_start, t_end in blocks:
                while time.perf_counter() < t_start:
                    await asyncio.sleep(0.05)
                if kind != "swap":
                    continue
                per_block = a.swaps // a.blocks
                gap = (t_end - t_start) / per_block
                for j in range(per_block):
                    ref, how = refs[k % 2], transports[k % len(transports)]
                    k += 1
                    shared = None
                    if how == "shared":  # the gate scored it: its engine holds it (not timed)
                        await asyncio.to_thread(gate.load_weights, ref.path, ref.version)
                        shared = gate.shared.ref()
                    await board.put(store.set_live(ref.version, ref.path, ref.sha256, shared=shared))
                    await bus.publish(WeightsPromoted(weights=ref, candidate_score=0, live_score=0, previous="",
                                                      stage="live"), weights_version=ref.version)
                    deadline = time.perf_counter() + 60
                    while time.perf_counter() < deadline:  # the replica reports the swap
                        try:
                            m = await sub.next_msg(timeout=1.0)
                        except Exception:  # noqa: BLE001
                            continue
                        ev = json.loads(m.data)
                        if ev["version"] == ref.version:
                            swap_ms[how].append(ev["swap_ms"])
                            vias.append(f"{how}: {ev['reason']}")
                            break
                    while time.perf_counter() < t_start + (j + 1) * gap:
                        await asyncio.sleep(0.05)
        finally:
            await bus.close()

    threads = [threading.Thread(target=load, args=(i,), daemon=True) for i in range(a.clients)]
    for t in threads:
        t.start()
    time.sleep(20)  # warm up
    t0 = time.perf_counter()
    blocks = []
    for b in range(2 * a.blocks):
        start = t0 + b * a.block_s
        blocks.append(("base" if b % 2 == 0 else "swap", start, start + a.block_s))
    asyncio.run(swapper(blocks))
    while time.perf_counter() < blocks[-1][2]:
        time.sleep(0.2)
    stop.set()
    for t in threads:
        t.join(120)

    def in_block(kind):
        out = []
        for k, s0, s1 in blocks:
            if k == kind:
                out += [r for r in records if s0 <= r[0] < s1]
        return out
    res = {}
    for kind in ("base", "swap"):
        rs = in_block(kind)
        lat = [(e - b) * 1000 for b, e, ok in rs if ok]
        res[kind] = {"requests": len(rs), "failed": sum(not ok for *_, ok in rs), "p50_ms": statistics.median(lat),
                     "p95_ms": pct(lat, .95), "p99_ms": pct(lat, .99), "max_ms": max(lat)}
    res["swaps"] = sum(map(len, swap_ms.values()))
    res["swap_ms"] = {t: {"swaps": len(xs), "p50": statistics.median(xs), "p99": pct(xs, .99)}
                      for t, xs in swap_ms.items() if xs}
    res["fell_back"] = [v for v in vias if v.startswith("shared") and not v.endswith("via shared")]
    if {"file", "shared"} <= res["swap_ms"].keys():
        res["file_over_shared_p50"] = res["swap_ms"]["file"]["p50"] / res["swap_ms"]["shared"]["p50"]
    res["p99_ratio"] = res["swap"]["p99_ms"] / res["base"]["p99_ms"]
    print(f"clients={a.clients} max_tokens={a.max_tokens} blocks={a.blocks}x2 of {a.block_s:.0f}s")
    for kind in ("base", "swap"):
        r = res[kind]
        print(f"{'no swaps' if kind == 'base' else 'swapping':9} requests={r['requests']:4d} failed={r['failed']} "
              f"p50={r['p50_ms']:7.0f} ms p95={r['p95_ms']:7.0f} ms p99={r['p99_ms']:7.0f} ms max={r['max_ms']:7.0f} ms")
    for t, r in res["swap_ms"].items():
        print(f"{t:6} swaps={r['swaps']} inside the replica p50={r['p50']:.0f} ms p99={r['p99']:.0f} ms")
    print(f"file / shared p50 = {res.get('file_over_shared_p50', float('nan')):.2f}; shared swaps that fell back to "
          f"the file: {len(res['fell_back'])}; p99 ratio swapping / no swaps = {res['p99_ratio']:.2f}")
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
    serve.shutdown()
    import ray

    ray.shutdown()
    nats.stop()


if __name__ == "__main__":
    main()
