"""Swaps from GPU memory over CUDA IPC: the gate engine's weights exported once, copied by another process on the
same GPU, and the seqlock sending a stale reader to the file; the timing of a copy of the whole model. Skipped
without a GPU (tests/unit/test_shared_weights.py runs the same protocol over CPU shared memory)."""

import json
import multiprocessing as mp
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _reader(requests, replies):
    import torch

    from policies.weights.shared import SharedChanged, read_shared

    target = None
    for ref in iter(requests.get, None):
        try:
            t0 = time.perf_counter()

            def copy(views):
                nonlocal target
                views = list(views)
                if target is None:
                    target = {n: torch.empty_like(t) for n, t in views}
                for n, t in views:
                    target[n].copy_(t)
                torch.cuda.synchronize()

            read_shared(json.loads(ref), copy)
            ms = (time.perf_counter() - t0) * 1000
            replies.put(("ok", {n: float(t.double().sum()) for n, t in target.items()}, ms))
        except SharedChanged as exc:
            replies.put(("changed", str(exc), 0.0))


def test_another_process_copies_the_gate_engines_cuda_weights(model_dir, tmp_path):
    from policies.engines.engine import TransformersEngine

    gate = TransformersEngine(model_dir, dtype="bfloat16", device="cuda", threads=0)
    gate.share(tmp_path / "layout.json")
    ctx = mp.get_context("spawn")
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_reader, args=(requests, replies), daemon=True)
    proc.start()
    try:
        ref = gate.shared.ref()
        times = []
        for _ in range(5):
            requests.put(json.dumps(ref))
            kind, sums, ms = replies.get(timeout=300)
            assert kind == "ok", sums
            times.append(ms)
        want = {k: float(v.double().sum()) for k, v in gate.model.state_dict().items() if k in sums}
        assert sums == pytest.approx(want)
        print(f"shared copy of {len(sums)} tensors: first {times[0]:.1f} ms, then p50 {sorted(times[1:])[2]:.1f} ms")

        sd = {k: v.detach().cpu() * 1.01 for k, v in gate.model.state_dict().items()}
        gate.load_state_dict(sd, "w-000001")  # the next candidate: the old ref is stale
        requests.put(json.dumps(ref))
        assert replies.get(timeout=60)[0] == "changed"
        requests.put(json.dumps(gate.shared.ref()))
        kind, sums, _ = replies.get(timeout=60)
        assert kind == "ok" and sums == pytest.approx(
            {k: float(v.double().sum()) for k, v in gate.model.state_dict().items() if k in sums}
        )
    finally:
        requests.put(None)
        proc.join(60)
