"""bfloat16 vs float32 on this machine's CPU, side by side in one run (what `"auto"` float types decide).

Generation with the real 135M policy (one torch thread, as in `up`): a short chat alone and 8 at once,
a `code` group (4 samples) and a BFCL group (4 samples of a ~1,000-token prompt with its tool schemas);
the learner's forward + backward (token log-probs of 4 x 256 tokens, float32 master weights, the body
under bf16 autocast or not); one embedding query. Prints the CPU's bf16 flags and what "auto" picks.

    .venv/bin/python tests/benchmarks/bench_dtype.py [--out results/dtype_cpu.json]
"""

import argparse
import json
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from actors.events import ChatMessage  # noqa: E402
from config.hardware import NATIVE_BF16_FLAGS, cpu_flags, resolve_dtype  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.registry import make_env  # noqa: E402
from policies.chat import render  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402


def prompt_of(env, entry):
    ep = env.episode(entry)
    u = ep.next_user_message()
    return render([ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=u)], ep.tools, None)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "dtype_cpu.json"))
    a = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from policies.engines.engine import TransformersEngine
    from policies.learning import grpo
    from policies.memory.embedder import Embedder

    torch.set_num_threads(1)
    flags = sorted(cpu_flags(Path("/proc/cpuinfo").read_text()) & (NATIVE_BF16_FLAGS | {"avx2", "avx512f"}))
    print(f"CPU flags of note: {flags}; auto picks {resolve_dtype('auto', 'cpu')}", flush=True)
    base = ensure_base_model(ROOT / ".kaizen")
    s = load_settings()
    short = render([ChatMessage(role="user", content="What is 17 + 25? Answer briefly.")], [], None)
    code = prompt_of(make_env("code", s.env), make_env("code", s.env).entries("train")[0])
    bfcl = prompt_of(make_env("bfcl", s.env), "multi_turn_base_0")
    cases = [
        ("chat x1, 32 tokens", short, 1, 32),
        ("chat x8, 32 tokens", short, 8, 32),
        ("code group x4, 64 tokens", code, 4, 64),
        ("BFCL group x4, 32 tokens", bfcl, 4, 32),
    ]
    res = {"cpu_flags": flags, "auto": resolve_dtype("auto", "cpu"), "generation": {}, "learner": {}, "embedding": {}}
    for dtype in ("bfloat16", "float32"):
        eng = TransformersEngine(base, dtype=dtype)
        eng.generate([short], max_new_tokens=4)  # warm-up
        for name, p, n, new in cases:
            secs, gens = timed(lambda: eng.generate([p] * n, max_new_tokens=new, temperature=0.9, top_p=0.95))
            toks = sum(g.completion_tokens for g in gens)
            res["generation"].setdefault(name, {"prompt_tokens": eng.count_tokens(p)})[dtype] = {
                "seconds": round(secs, 2),
                "tokens_per_s": round(toks / secs, 2),
            }
            print(
                f"{dtype:9s} {name:26s} prompt {eng.count_tokens(p):5d} tok  {secs:7.2f} s  {toks / secs:6.1f} tok/s", flush=True
            )
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    ids = torch.randint(100, 40000, (4, 256), generator=torch.Generator().manual_seed(0))
    for bf16 in (True, False):

        def step():
            grpo.token_logprobs(model, ids, torch.ones_like(ids), bf16).sum().backward()
            model.zero_grad()

        secs, _ = timed(step)
        res["learner"]["bfloat16 autocast" if bf16 else "float32"] = round(secs, 2)
        print(f"learner forward+backward 4 x 256 tokens, {'bf16 autocast' if bf16 else 'float32'}: {secs:.1f} s", flush=True)
    for dtype in ("bfloat16", "float32"):
        emb = Embedder(s.embedding.source, dtype)
        emb.embed(["warm up"])
        secs, _ = timed(lambda: [emb.embed([f"how do I list the files in folder {i}"]) for i in range(20)])
        res["embedding"][dtype] = round(secs / 20 * 1000, 2)
        print(f"embedding query, {dtype}: {secs / 20 * 1000:.1f} ms", flush=True)
    g = res["generation"]
    res["float32_speedup"] = {k: round(v["float32"]["tokens_per_s"] / v["bfloat16"]["tokens_per_s"], 2) for k, v in g.items()}
    res["float32_speedup"]["learner"] = round(res["learner"]["bfloat16 autocast"] / res["learner"]["float32"], 2)
    res["float32_speedup"]["embedding"] = round(res["embedding"]["bfloat16"] / res["embedding"]["float32"], 2)
    print("float32 over bfloat16:", json.dumps(res["float32_speedup"]), flush=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
