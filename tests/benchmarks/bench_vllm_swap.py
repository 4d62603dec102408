"""vLLM weight swaps with requests in flight (GPU): swap p50 / p99, failed requests, generation
throughput with and without swaps, side by side in one run, and the engine's start time (compile and CUDA graphs
included). Needs CUDA and the `gpu` extra.

The engine is the system's `VllmEngine` (pause keep -> every worker loads the new weights -> prefix-cache
reset -> resume). Two versions are swapped in turn while `--clients` threads keep generating, over each
transport in `--transports`, interleaved so both see the same load: `file` (every worker reads the
safetensors file) and `shared` (the workers copy a gate-like producer's GPU weights over CUDA IPC,
`policies/weights/shared.py`; the producer takes each version in before the timed swap, as the gate does
when it scores a candidate). Default: the converted SmolLM2-135M. `--config DIR` takes a Hugging Face config folder
(config.json + tokenizer files, e.g. a Qwen2-7B config) instead: the engine starts with vLLM's dummy
weights and random weights files of the right names and shapes are written for the swaps.

    python tests/benchmarks/bench_vllm_swap.py [--swaps 20] [--clients 8] [--config DIR] [--transports file,shared]
                                               [--warmup-s 10] [--baseline-s 30]   (shorter in scripts/gpu_check.sh)
"""

import argparse
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import pct  # noqa: E402  (also puts the repository on sys.path)


def random_weights(config_dir: Path, out: Path, seed: int) -> None:
    """A safetensors file with the model's Hugging Face parameter names and shapes, random bf16 values."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM

    cfg = AutoConfig.from_pretrained(str(config_dir))
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in AutoModelForCausalLM.from_config(cfg).state_dict().items()}
    g = torch.Generator(device="cuda").manual_seed(seed)
    sd = {k: (torch.randn(s, generator=g, device="cuda", dtype=torch.bfloat16) * 0.02).cpu() for k, s in shapes.items()}
    save_file(sd, str(out))


def producer(model_dir: Path, tmp: Path):
    """The gate engine's part: one bf16 copy of the model on the GPU, its storages exported once."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from policies.weights.shared import SharedWeights

    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)), dtype=torch.bfloat16)
    return SharedWeights(model, "none", tmp / "shared-layout.json")


def stage(shared, path: Path, version: str) -> None:
    """What the gate's load does: the version into the shared copy, bracketed by the seqlock (not timed)."""
    import torch
    from safetensors.torch import load_file

    sd, params = load_file(str(path), device="cuda"), shared.model.state_dict()
    shared.begin()
    with torch.no_grad():
        for k, v in sd.items():
            if k in params:
                params[k].copy_(v)
    shared.end(version)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--swaps", type=int, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--config", help="HF config folder for a dummy-weights model (e.g. 7B-shaped)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--transports", default="file,shared")
    ap.add_argument("--warmup-s", type=float, default=10, help="clients running before the window without swaps")
    ap.add_argument("--baseline-s", type=float, default=30, help="the window without swaps")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    import torch

    from policies.engines.vllm_engine import VllmEngine

    tmp = Path(tempfile.mkdtemp(prefix="kz-vllm-"))
    t_start = 0.0
    if a.config:
        model_dir = Path(a.config)
        files = [tmp / "a.safetensors", tmp / "b.safetensors"]
        for i, f in enumerate(files):
            random_weights(model_dir, f, i)
        t_start = time.perf_counter()
        eng = VllmEngine(model_dir, gpu_memory_utilization=a.gpu_memory_utilization, load_format="dummy")
    else:
        from safetensors.torch import load_file, save_file

        from policies.weights.model_store import ensure_base_model

        model_dir = ensure_base_model(Path(".kaizen") if Path(".kaizen/model").exists() else tmp)
        base = load_file(str(model_dir / "model.safetensors"))
        torch.manual_seed(0)
        files = [model_dir / "model.safetensors", tmp / "b.safetensors"]
        save_file({k: v * (1 + 0.01 * torch.randn_like(v.float()).to(v.dtype)) for k, v in base.items()}, str(files[1]))
        t_start = time.perf_counter()
        eng = VllmEngine(model_dir, gpu_memory_utilization=a.gpu_memory_utilization)
    prompt = "<|im_start|>user\nTell me a long story about a lighthouse keeper.<|im_end|>\n<|im_start|>assistant\n"
    engine_start_s = time.perf_counter() - t_start
    print(f"engine started in {engine_start_s:.1f}s", flush=True)
    stopped: list[float] = []  # when a SIGTERM came: what fails after it (the engine got it too) is not the swaps'

    def on_term(*_):
        stopped.append(time.perf_counter())
        sys.exit("stopped by SIGTERM: the figures so far are written")

    signal.signal(signal.SIGTERM, on_term)
    stop, records = threading.Event(), []  # (start, end, tokens, ok)

    def client():
        while not stop.is_set():
            t0 = time.perf_counter()
            try:
                g = eng.generate([prompt], a.max_tokens, temperature=0.8)[0]
                records.append((t0, time.perf_counter(), g.completion_tokens, True))
            except Exception as exc:  # noqa: BLE001 - every failure counts
                records.append((t0, time.perf_counter(), 0, False))
                print("request failed:", repr(exc)[:200])

    threads = [threading.Thread(target=client, daemon=True) for _ in range(a.clients)]
    transports = a.transports.split(",")
    swap_ms: dict[str, list[float]] = {t: [] for t in transports}
    t_base = t_swap = t_end = None
    try:
        eng.generate([prompt], 8)  # warm
        for t in threads:
            t.start()
        time.sleep(a.warmup_s)
        t_base = time.perf_counter()
        time.sleep(a.baseline_s)  # a window without swaps
        t_swap = time.perf_counter()
        shared = producer(model_dir, tmp) if "shared" in transports else None
        for i in range(a.swaps * len(transports)):
            how, f, v = transports[i % len(transports)], files[(i + 1) % 2], f"w-{i + 1:06d}"
            ref = None
            if how == "shared":
                stage(shared, f, v)
                ref = shared.ref()
            swap_ms[how].append(eng.load_weights(f, v, shared=ref))
            assert eng.last_load == how, eng.last_load  # a shared swap that fell back to the file is not one
            print(f"swap {i + 1} ({how}): {swap_ms[how][-1]:.1f} ms", flush=True)
            time.sleep(1.5)
        t_end = time.perf_counter()
    finally:  # stopped early (a budget's SIGTERM, a failed swap): what was measured is still written, within the
        stop.set()  # 10 s the check leaves between its SIGTERM and its SIGKILL
        deadline = time.monotonic() + (300 if t_end else 3)
        for t in (t for t in threads if t.ident):  # the started ones
            t.join(max(0.0, deadline - time.monotonic()))
        end = t_end or (stopped[0] if stopped else time.perf_counter())
        done = list(records) if t_end else [r for r in list(records) if r[1] < end]
        res = results(a, model_dir, engine_start_s, done, swap_ms, t_base, t_swap, end)
        print(json.dumps(res, indent=1), flush=True)
        if a.out:
            Path(a.out).write_text(json.dumps(res, indent=1))
    eng.shutdown()


def results(a, model_dir, engine_start_s, records, swap_ms, t_base, t_swap, t_end) -> dict:
    """The figures of the windows that were reached; `complete` says whether every swap ran."""

    def window(t0, t1):
        rs = [r for r in records if t0 <= r[0] < t1]
        lat = [(e - s) * 1000 for s, e, _, ok in rs if ok]
        return {
            "requests": len(rs),
            "failed": sum(not r[3] for r in rs),
            "tokens_per_s": sum(r[2] for r in rs) / (t1 - t0),
            "p50_ms": statistics.median(lat) if lat else None,
            "p99_ms": pct(lat, 0.99) if lat else None,
        }

    res = {
        "model": str(model_dir),
        "clients": a.clients,
        "swaps_each": a.swaps,
        "complete": all(len(xs) == a.swaps for xs in swap_ms.values()),
        "engine_start_s": round(engine_start_s, 1),
        "swap_ms": {t: {"n": len(xs), "p50": statistics.median(xs), "p99": pct(xs, 0.99)} for t, xs in swap_ms.items() if xs},
        "no_swaps": window(t_base, t_swap) if t_swap else None,
        "swapping": window(t_swap, t_end) if t_swap else None,
    }
    if {"file", "shared"} <= res["swap_ms"].keys():
        res["file_over_shared_p50"] = res["swap_ms"]["file"]["p50"] / res["swap_ms"]["shared"]["p50"]
    return res


if __name__ == "__main__":
    main()
