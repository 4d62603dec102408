"""How long does the guard take to check one served version? Old generation vs new, side by side (CPU default model).

A check (policies/promotion/guard.py) scores a version on the guard's held-out suite (config/cpu.yaml: the code env's `add`
and `muladd` held-out entries, categories interleaved), `guard.k` samples an entry at the rollout temperature,
in chunks of `guard.chunk_entries` entries, each chunk seeded by its number, `guard.batch` episodes generated
together: the guard's own `_scores` loop. This times the whole suite (a check that does not stop early; a healthy
version's futility stop at `guard.early_fraction` costs about that share of it) with the base model as the
candidate, on the guard's engine (`make_engine(role="eval")`, `model.torch_threads` threads), two ways, chunk by
chunk in turn so that both see the same machine:

- old: `model.generate` on every row (each of an entry's k copies of a prompt prefilled in full, every row
  decoded until the batch's last one ends), `--old-batch` episodes a call (16, the guard's batch before);
- new: `policies/engines/shared_decode.py` (each distinct prompt prefilled once after the prefix all share, a row leaves
  the batch when it ends), `guard.batch` episodes a call (or `--new-batch`), with the eval role's attention (eager
  on CPU; old uses transformers' default, sdpa). `new@sdpa` is the new path with sdpa, as before eager.

Prints seconds per check, the ratio, where the time went (generation vs the environment's steps), the avg@k of
each (the same in distribution) and writes JSON.

    .venv/bin/python tests/benchmarks/bench_guard_check.py [--entries N] [--paths old,new,new:32,new@sdpa] [--out FILE]
"""

import argparse
import json
import time
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "cpu.yaml"))
    ap.add_argument("--entries", type=int, default=0, help="score only the suite's first N entries (0 = all)")
    ap.add_argument("--paths", default="old,new", help="old | new, comma-separated; new:32 = new at batch 32")
    ap.add_argument("--old-batch", type=int, default=16)
    ap.add_argument("--new-batch", type=int, default=0, help="0 = guard.batch of the config")
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "guard_check_cpu.json"))
    a = ap.parse_args()

    import torch

    from config.settings import load_settings
    from envs.registry import make_env
    from policies.engines.roles import make_engine
    from policies.promotion.guard_decisions import guard_suite
    from policies.rollout import evaluate
    from policies.weights.model_store import ensure_base_model

    s = load_settings(a.config)
    s.state_dir = str(ROOT / ".kaizen")
    g, r = s.guard, s.rollout
    envs = {n: make_env(n, s.env) for n in g.suite}
    suite = guard_suite(envs, g)
    if a.entries:
        suite = {env: ids[: a.entries] for env, ids in suite.items()}
    engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="eval")
    opts = {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "call_prefix": r.call_prefix}
    batches = {"old": a.old_batch, "new": a.new_batch or g.batch}
    paths = {}
    default_attention = engine.model.config._attn_implementation  # the eval role's (eager on CPU)
    for p in a.paths.split(","):  # old | new, optionally with its own batch and attention: new:32, new@sdpa
        spec, _, attention = p.partition("@")
        name, _, batch = spec.partition(":")
        paths[p if batch or attention else name] = {
            "share_prefill": name == "new",
            "batch": int(batch or batches[name]),
            "attention": attention or ("sdpa" if name == "old" else default_attention),
        }
    res = {
        p: {**cfg, "seconds": 0.0, "generate_s": 0.0, "generate_calls": 0, "tokens": 0, "per_entry": {}}
        for p, cfg in paths.items()
    }

    plain = engine.generate

    def timed(path):
        def generate(prompts, *args, **kw):
            t0 = time.monotonic()
            out = plain(prompts, *args, **kw)
            res[path]["generate_s"] += time.monotonic() - t0
            res[path]["generate_calls"] += 1
            res[path]["tokens"] += sum(x.completion_tokens for x in out)
            return out

        return generate

    n = max(1, g.chunk_entries)
    for env, entries in suite.items():
        for no, i in enumerate(range(0, len(entries), n)):
            ids = entries[i : i + n]
            for p, cfg in paths.items():  # the guard's `_scores`, one chunk, each path in turn
                engine.share_prefill, engine.generate = cfg["share_prefill"], timed(p)
                engine.model.set_attn_implementation(cfg["attention"])
                t0 = time.monotonic()
                torch.manual_seed(no)
                out = evaluate(engine, envs[env], ids, k=g.k, batch=cfg["batch"], **opts)
                res[p]["seconds"] += time.monotonic() - t0
                res[p]["per_entry"].update({e: sum(out["entries"][e]) / g.k for e in ids})
                print(f"{env} chunk {no} ({len(ids)} entries) {p}: {res[p]['seconds']:.1f} s so far", flush=True)
            write(a, s, suite, res, done=False)  # after every chunk: a run cut short still compares like with like
    write(a, s, suite, res, done=True)


def write(a, s, suite, res, done: bool) -> None:
    g, r = s.guard, s.rollout
    n_entries = sum(map(len, suite.values()))
    for x in res.values():
        x["entries"] = len(x["per_entry"])
        x["avg"] = sum(x["per_entry"].values()) / max(1, len(x["per_entry"]))
        x["env_s"] = x["seconds"] - x["generate_s"]
    out = {
        "config": Path(a.config).name,
        "suite": {e: len(v) for e, v in suite.items()},
        "complete": done,
        "k": g.k,
        "chunk_entries": g.chunk_entries,
        "temperature": r.temperature,
        "max_new_tokens": r.max_new_tokens,
        "torch_threads": s.model.torch_threads,
        "dtype": s.model.serve_dtype,
        "paths": res,
    }
    first, last = list(res)[0], list(res)[-1]
    if first != last:
        out["ratio"] = {f"{first} / {last}": res[first]["seconds"] / max(1e-9, res[last]["seconds"])}
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    if not done:
        return
    for p, x in res.items():
        print(
            f"{p}: {x['seconds']:.1f} s per check ({n_entries} entries x{g.k}; generation {x['generate_s']:.1f} s "
            f"in {x['generate_calls']} calls, {x['tokens']} tokens; environment {x['env_s']:.1f} s), "
            f"avg@{g.k} {100 * x['avg']:.1f}%"
        )
    for pair, ratio in out.get("ratio", {}).items():
        print(f"{pair}: {ratio:.2f}x")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
