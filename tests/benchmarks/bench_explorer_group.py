"""What one explorer group costs: old generation vs new, side by side (CPU default model, one torch thread as in `up`).

A group (`policies/rollout.run_group`, as `actors/explorer.py` runs it) is `rollout.group_size` samples of one task
at the rollout temperature, each turn opened with a forced call whose function name each sample chooses by
constrained decoding (`rollout.choose_name`), the first half guided by experiences in the system message. Two ways,
on one engine (`make_engine(role="explorer")`), group by group in turn so that both see the same machine:

- old: every sample's name choice prefills the prompt anew, and `model.generate` prefills every row in full and
  decodes every row until the batch's last one ends;
- new: a choice keeps its prompt's prefill for the next choice on it (`TransformersEngine.choose`), and generation
  prefills each distinct prompt once after the prefix all share, a row leaving the batch when it ends
  (`policies/engines/shared_decode.py`, `roles.SHARED_PREFILL`).

Tasks: BFCL v4 `multiple` train entries (2-4 declared functions, as the clients' tool sets the questioner writes
practice about) and `simple_python` ones (one function: no name to choose). Prints seconds per group, the ratio and
each path's share of accepted calls (the same in distribution), and writes JSON.

    .venv/bin/python tests/benchmarks/bench_explorer_group.py [--tasks 6] [--group-size 4,8] [--out FILE]
"""

import argparse
import json
import random
import statistics
import time
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)

EXPERIENCES = [
    "When a function needs a number, pass the number from the request, not a word.",
    "Fill every required parameter with a value the user gave.",
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "config" / "cpu.yaml"))
    ap.add_argument("--tasks", type=int, default=6, help="train entries per category")
    ap.add_argument("--group-size", default="4,8")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "explorer_group_cpu.json"))
    a = ap.parse_args()

    import torch

    from config.settings import load_settings
    from envs.bfcl_single import SingleTurnEnvironment
    from policies.engines.roles import make_engine
    from policies.rollout import run_group
    from policies.weights.model_store import ensure_base_model

    s = load_settings(a.config)
    s.state_dir = str(ROOT / ".kaizen")
    r = s.rollout
    engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="explorer")
    rng = random.Random(a.seed)
    out = {"config": Path(a.config).name, "torch_threads": s.model.torch_threads, "tasks": a.tasks, "rows": []}
    paths = {"old": (False, False), "new": (True, True)}  # (share_prefill, kept.enabled)
    for cat in ("multiple", "simple_python"):
        env = SingleTurnEnvironment(categories=[cat])
        ids = rng.sample(env.entries("train"), a.tasks)
        for n in [int(x) for x in a.group_size.split(",")]:
            times, acc = {p: [] for p in paths}, {p: [] for p in paths}
            for j, eid in enumerate(ids):
                order = list(paths) if j % 2 == 0 else list(reversed(paths))  # neither path always goes first
                for p in order:
                    engine.share_prefill, engine.kept.enabled = paths[p]
                    torch.manual_seed(j)
                    t0 = time.perf_counter()
                    res = run_group(
                        engine,
                        env,
                        eid,
                        n,
                        max_new_tokens=r.max_new_tokens,
                        temperature=r.temperature,
                        top_p=r.top_p,
                        experiences=EXPERIENCES,
                        guided=n // 2,
                        call_prefix=r.call_prefix,
                        choose_names=r.choose_name,
                    )
                    times[p].append(time.perf_counter() - t0)
                    acc[p].append(sum(x.outcome for x in res.samples) / n)
            row = {"category": cat, "group_size": n}
            for p in paths:
                row[p] = {"seconds_median": round(statistics.median(times[p]), 2), "seconds": [round(x, 2) for x in times[p]]}
                row[p]["accepted"] = round(sum(acc[p]) / len(acc[p]), 3)
            row["speedup"] = round(row["old"]["seconds_median"] / row["new"]["seconds_median"], 2)
            out["rows"].append(row)
            print(
                f"{cat:14s} group {n:2d}: old {row['old']['seconds_median']:6.2f} s  new {row['new']['seconds_median']:6.2f} s"
                f"  {row['speedup']:.2f}x  (accepted {row['old']['accepted']:.2f} / {row['new']['accepted']:.2f})",
                flush=True,
            )
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"written {a.out}")


if __name__ == "__main__":
    main()
