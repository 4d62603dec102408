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
has when it promotes a candidate; `serve.weights_transport: shared`, `policies/weights/shared.py`) and `objects`
(`weights.store: nats`, policies/weights/objects.py: the version is fetched from the bus's object store, as by a
replica on another host). With `objects` among them, the replica runs with `weights.store: nats`; its `file` swaps
still read the file where the pointer names it (this state dir, a shared disk: the `state_dir` store's path), while
the `objects` versions are saved by "another host" (a second state dir: `WeightsStore.save` uploads each into the
object store, then that dir is removed, so the path the pointer names is not on this node) and, before each swap to
one, this node's fetched copy from an earlier swap is removed: every `objects` swap fetches (download, the object
store's digest, our sha256 against the pointer's, install), then loads. The fetch's share of a swap is read from
the replica's log (`weights.fetched`). Per transport (tests/benchmarks/_swaps.py): the replica's swap time, pointer
moved -> `evo.weights_swapped` on this script's clock, the fetch, and the requests in flight during its swaps.
With `--prefetch` each objects version is published (`evo.weights_published`) one swap ahead, as the learner
publishes before the gate, and the replica fetches it then (`ReplicaWeights.prefetch`): the swap finds the file.

    .venv/bin/python tests/benchmarks/bench_serve_swaps.py [--swaps 20] [--clients 3] [--block-s 45] \
        [--transports file,shared|file,objects] [--prefetch]
"""

import argparse
import asyncio
import json
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import pct  # noqa: E402  (also puts the repository on sys.path)
from _swaps import fetches, pair_fetches, per_transport, spread, table  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=20)
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--block-s", type=float, default=45.0)
    ap.add_argument("--blocks", type=int, default=4, help="blocks of each kind, alternating")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--transports", default="file,shared", help="how swaps reach the replica, alternating")
    ap.add_argument(
        "--prefetch",
        action="store_true",
        help="objects: publish each version (evo.weights_published) one swap ahead, as the learner publishes before the "
        "gate scores it, so that the replica may fetch it before the pointer moves (else every objects swap fetches)",
    )
    ap.add_argument("--out", default="", help="write the figures as JSON here")
    a = ap.parse_args()
    transports = a.transports.split(",")
    if set(transports) - {"file", "shared", "objects"}:
        ap.error(f"--transports: file, shared or objects, not {a.transports}")

    import openai
    import torch
    from safetensors.torch import load_file

    from actors.bus import Bus
    from actors.events import WeightsPromoted, WeightsPublished, WeightsRef
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
    refs: dict[str, list] = {}
    stores = {"file": store, "shared": store}  # whose pointer (the stat it pins) a swap of each transport gets

    def save(into, pairs):
        for name, weights in pairs:
            path, sha = into.save(weights, name, {"parent": "w-000000"})
            yield WeightsRef(version=name, path=str(path), sha256=sha, parent="w-000000", step=1)

    refs["file"] = refs["shared"] = list(save(store, (("w-000001", other), ("w-000002", sd))))

    async def prepare():
        bus = await Bus.from_settings(s.nats, "bench").connect()
        if "objects" in transports:  # saved on another host, as its learner saves: into the object store
            from policies.weights.objects import ObjectWeights

            away = WeightsStore(s.state.parent / "other-host")
            away.remote = await ObjectWeights(s, away).open(bus.js)
            pairs = (("w-000003", other), ("w-000004", sd))
            refs["objects"] = await asyncio.to_thread(lambda: list(save(away, pairs)))
            shutil.rmtree(away.dir.parent)  # that host's disk is not this one's (its stats stay pinned in `away`)
            stores["objects"] = away
        await bus.close()

    asyncio.run(prepare())
    if "objects" in transports:
        s.weights.store = "nats"  # the replica fetches a version its state dir lacks
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
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{s.serve.port}/v1", api_key="bench-key", max_retries=0, timeout=120)
    records, stop = [], threading.Event()  # (start, end, ok)

    def load(i):
        n = 0
        while not stop.is_set():
            t0 = time.perf_counter()
            ok = True
            try:
                client.chat.completions.create(
                    model=s.model.name,
                    max_tokens=a.max_tokens,
                    temperature=0.7,
                    messages=[{"role": "user", "content": f"Tell me a fact about number {i}-{n}."}],
                    extra_body={"memory": False},
                )
            except Exception as exc:  # noqa: BLE001 - every failure counts
                ok = False
                print("request failed:", repr(exc)[:200], flush=True)
            records.append((t0, time.perf_counter(), ok))
            n += 1

    swaps: list[dict] = []
    vias: list[str] = []

    async def swapper(blocks):
        bus = await Bus.from_settings(s.nats, "bench").connect()
        board = await LiveBoard(s, store).open(bus.js)  # the pointer's bucket, which the replica watches
        sub = await bus.nc.subscribe("evo.weights_swapped")

        async def publish_ahead(k):  # the objects version the next objects swap goes to, published (and not here)
            at = next(i for i in range(k, k + len(transports)) if transports[i % len(transports)] == "objects")
            nxt = refs["objects"][at % 2]
            store.remove(nxt.version)
            await bus.publish(WeightsPublished(weights=nxt), weights_version=nxt.version)

        try:
            k = 0
            if a.prefetch:
                await publish_ahead(0)
            for kind, t_start, t_end in blocks:
                while time.perf_counter() < t_start:
                    await asyncio.sleep(0.05)
                if kind != "swap":
                    continue
                per_block = a.swaps // a.blocks
                gap = (t_end - t_start) / per_block
                for j in range(per_block):
                    how = transports[k % len(transports)]
                    ref = refs[how][k % 2]  # never the version live now: file and shared share theirs
                    k += 1
                    shared = None
                    if how == "shared":  # the gate scored it: its engine holds it (not timed)
                        await asyncio.to_thread(gate.load_weights, ref.path, ref.version)
                        shared = gate.shared.ref()
                    if how == "objects" and not a.prefetch:  # a new version here: the copy an earlier swap fetched goes
                        store.remove(ref.version)
                    ptr = stores[how].make_live(ref.version, ref.path, ref.sha256, shared=shared)
                    store.keep_live(ptr, force=True)  # the broadcaster's node copy, then the bus's key
                    sw = {"how": how, "version": ref.version, "put": time.perf_counter(), "swapped": None}
                    swaps.append(sw)
                    await board.put(ptr)
                    await bus.publish(
                        WeightsPromoted(weights=ref, candidate_score=0, live_score=0, previous="", stage="live"),
                        weights_version=ref.version,
                    )
                    deadline = time.perf_counter() + 60
                    while time.perf_counter() < deadline:  # the replica reports the swap
                        try:
                            m = await sub.next_msg(timeout=1.0)
                        except Exception:  # noqa: BLE001
                            continue
                        ev = json.loads(m.data)
                        if ev["version"] == ref.version:
                            sw["swapped"], sw["swap_ms"] = time.perf_counter(), ev["swap_ms"]
                            vias.append(f"{how}: {ev['reason']}")
                            break
                    if a.prefetch and how != "objects":  # the objects version is not live now: published again
                        await publish_ahead(k)
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
        res[kind] = {
            "requests": len(rs),
            "failed": sum(not ok for *_, ok in rs),
            "p50_ms": statistics.median(lat),
            "p95_ms": pct(lat, 0.95),
            "p99_ms": pct(lat, 0.99),
            "max_ms": max(lat),
        }
    res["swaps"] = len(swaps)
    fetched = fetches((s.state / "logs" / "serve.log").read_text(errors="replace")) if "objects" in transports else []
    if a.prefetch:  # the fetches were made ahead of the swaps: their own figures
        res["prefetches"] = spread([sec * 1000 for _, sec in fetched])
    else:  # the fetch inside each objects swap, from the replica's log
        pair_fetches([sw for sw in swaps if sw["how"] == "objects"], fetched)
    res["transports"] = per = per_transport(swaps, records)
    res["fell_back"] = [v for v in vias if v.startswith("shared") and not v.endswith("via shared")]
    for x, y in (("file", "shared"), ("objects", "file")):
        if per.get(x, {}).get("swap_ms") and per.get(y, {}).get("swap_ms"):
            res[f"{x}_over_{y}_p50"] = per[x]["swap_ms"]["p50"] / per[y]["swap_ms"]["p50"]
    res["p99_ratio"] = res["swap"]["p99_ms"] / res["base"]["p99_ms"]
    res["swap_log"] = [{**sw, "put": sw["put"] - t0, "swapped": sw["swapped"] and sw["swapped"] - t0} for sw in swaps]
    lines = [f"clients={a.clients} max_tokens={a.max_tokens} blocks={a.blocks}x2 of {a.block_s:.0f}s transports={a.transports}"]
    for kind in ("base", "swap"):
        r = res[kind]
        lines.append(
            f"{'no swaps' if kind == 'base' else 'swapping':9} requests={r['requests']:4d} failed={r['failed']} "
            f"p50={r['p50_ms']:7.0f} ms p95={r['p95_ms']:7.0f} ms p99={r['p99_ms']:7.0f} ms "
            f"max={r['max_ms']:7.0f} ms"
        )
    lines += table(per)
    lines.append(
        "; ".join(f"{k} = {v:.2f}" for k, v in res.items() if k.endswith("_p50")) + f"; shared swaps that "
        f"fell back to the file: {len(res['fell_back'])}; p99 ratio swapping / no swaps = {res['p99_ratio']:.2f}"
    )
    print("\n".join(lines))
    if a.out:
        Path(a.out).write_text(json.dumps(res, indent=1))
        Path(a.out).with_suffix(".txt").write_text("\n".join(lines) + "\n")
    serve.shutdown()
    import ray

    ray.shutdown()
    nats.stop()
    shutil.rmtree(s.state.parent, ignore_errors=True)  # the versions, the bus's store (GBs)


if __name__ == "__main__":
    main()
