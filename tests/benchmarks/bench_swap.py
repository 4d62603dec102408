"""Swap-time benchmark (CPU): loading a weights version into a live engine, idle and while another thread
is generating, for both update modes side by side: in place (copy into the model between calls: waits
for the running generation) and standby (what serving replicas use: copy into a second copy of the model
while calls run, then flip the pointer). Prints p50 / p95 in milliseconds and generation latency.

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
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.weights.model_store import WeightsStore, ensure_base_model  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=10)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument(
        "--gap-s",
        type=float,
        default=2.5,
        help="time between swaps under load: longer than one "
        "generation, as in service (a standby copy still serving a call makes the next swap wait)",
    )
    a = ap.parse_args()
    base = ensure_base_model(Path(a.state))
    prompt = render([ChatMessage(role="user", content="Tell me about Paris.")])
    for standby in (False, True):
        eng = TransformersEngine(base, dtype="bfloat16", standby=standby)
        store = WeightsStore(Path(tempfile.mkdtemp()))
        sd = {k: v.clone() for k, v in eng.model.state_dict().items() if k != "lm_head.weight"}
        paths = [store.save(sd, f"w-{i:06d}")[0] for i in (1, 2)]
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
            time.sleep(a.gap_s)
        stop.set()
        th.join()
        mode = "standby" if standby else "in place"
        print(
            f"{mode:8} swaps={a.swaps} idle p50={statistics.median(idle):7.1f} ms p95={pct(idle, 0.95):7.1f} ms | "
            f"during generation p50={statistics.median(busy):7.1f} ms p95={pct(busy, 0.95):7.1f} ms | "
            f"generation 32 tok p50={statistics.median(gen_lat):6.0f} ms over {len(gen_lat)} requests, 0 failed"
        )


if __name__ == "__main__":
    main()
