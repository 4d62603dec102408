"""Swap-time benchmark (CPU): in-place load of a weights version into a live engine, idle and while
another thread is generating. Prints p50 / p95 in milliseconds and generation latency side by side.

    .venv/bin/python tests/benchmarks/bench_swap.py [--swaps 10]
"""
import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from _common import pct  # noqa: E402  (also puts the repository on sys.path)

from actors.events import ChatMessage  # noqa: E402
from policies.chat import render  # noqa: E402
from policies.engine import TransformersEngine  # noqa: E402
from policies.model_store import WeightsStore, ensure_base_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=10)
    ap.add_argument("--state", default=".kaizen")
    a = ap.parse_args()
    base = ensure_base_model(Path(a.state))
    eng = TransformersEngine(base, dtype="bfloat16")
    store = WeightsStore(Path(tempfile.mkdtemp()))
    sd = {k: v.clone() for k, v in eng.model.state_dict().items() if k != "lm_head.weight"}
    paths = [store.save(sd, f"w-{i:06d}")[0] for i in (1, 2)]
    prompt = render([ChatMessage(role="user", content="Tell me about Paris.")])

    idle = [eng.load_weights(paths[i % 2], f"w-{i:06d}") for i in range(a.swaps)]
    gen_lat, stop = [], threading.Event()

    def load():
        while not stop.is_set():
            t = time.perf_counter()
            eng.generate([prompt], 32, temperature=0.7)
            gen_lat.append((time.perf_counter() - t) * 1000)
    th = threading.Thread(target=load)
    th.start()
    busy = []
    for i in range(a.swaps):
        t = time.perf_counter()
        eng.load_weights(paths[i % 2], f"w-{i:06d}")
        busy.append((time.perf_counter() - t) * 1000)
        time.sleep(0.5)
    stop.set()
    th.join()
    print(f"swaps={a.swaps}")
    print(f"swap idle      p50={statistics.median(idle):8.1f} ms  p95={pct(idle, .95):8.1f} ms")
    print(f"swap under gen p50={statistics.median(busy):8.1f} ms  p95={pct(busy, .95):8.1f} ms  (includes waiting for the running generation)")
    print(f"generation 32 tok p50={statistics.median(gen_lat):8.1f} ms over {len(gen_lat)} requests, 0 failed")


if __name__ == "__main__":
    main()
