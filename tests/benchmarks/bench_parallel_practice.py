"""Two-call practice on the clients' tools: what the questioner writes, and how often the policy answers it right.

`questioner.client_parallel_share` makes a share of the tasks on the clients' own tools ask for one function twice in
one answer (`policies/tasks/client_tasks.py`). This writes tasks with the base policy about the tool sets of BFCL
`parallel` train entries (as the users of bench_live_traffic declare them), once with every task allowed two calls
(share 1) and once with none (share 0), and rolls each verified task out `--k` times at each new-token budget in
`--budgets` (unguided, in one batch as the held-out scoring rolls out: `run_episodes`, a forced call of a declared
function, read as Serve sends it; BFCL's checker on the client's schema). It prints and writes, per share: the
writer's outcomes, tasks by number of calls, right rate by number of calls and budget, and how many tasks sit in the
questioner's band (0.3-0.8). A task type whose right rate is 0 can teach only through the off-policy reference
(`rollout.reference_on_failure`). Minutes on a 2-core host (24 sets, k = 4: 327 s).

    .venv/bin/python tests/benchmarks/bench_parallel_practice.py [--sets 24] [--k 4] [--budgets 64,128] --out F.json
"""

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def main() -> None:
    from config.settings import load_settings
    from envs.base import split_of
    from envs.bfcl_single import load, to_tool_spec
    from envs.client_tools import ClientToolsEnvironment
    from policies.engines.roles import make_engine
    from policies.memory.embedder import Embedder
    from policies.rollout import run_episodes
    from policies.tasks.client_tasks import ClientTaskWriter, ToolSets
    from policies.tasks.generators import PolicyGenerator
    from policies.tasks.synthesis import TaskIndex
    from policies.weights.model_store import ensure_base_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sets", type=int, default=24, help="BFCL `parallel` train entries whose tool sets are kept")
    ap.add_argument("--k", type=int, default=4, help="rollouts per task")
    ap.add_argument("--budgets", default="64,128", help="rollout.max_new_tokens values to roll out at")
    ap.add_argument("--config", default=str(ROOT / "tests" / "benchmarks" / "configs" / "live_traffic_cpu.yaml"))
    ap.add_argument("--state-dir", default=str(ROOT / ".kaizen"), help="where the base model is (converted once)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "parallel_practice_cpu.json"))
    a = ap.parse_args()
    budgets = [int(b) for b in a.budgets.split(",")]
    t0 = time.monotonic()
    tmp = tempfile.mkdtemp(prefix="kz-parallel-")
    s = load_settings(a.config)
    s.state_dir = tmp
    engine = make_engine(s, str(ensure_base_model(Path(a.state_dir), progress=False)), role="explorer")
    gen = PolicyGenerator(engine)
    entries, _ = load("parallel")
    train = [e for e in sorted(entries) if split_of(e, s.env.heldout_fraction) == "train"][: a.sets]
    embedder = Embedder(s.embedding.source, s.embedding.dtype)
    env = ClientToolsEnvironment()
    out: dict = {"sets": len(train), "k": a.k, "budgets": budgets, "config": Path(a.config).name}
    for share in (1.0, 0.0):
        sets = ToolSets(size=256, per_user=256)
        for i, e in enumerate(train):  # one user per set: the writer's per-user cap keeps them all
            sets.add([to_tool_spec(d) for d in entries[e]["function"]], f"u{i}", entries[e]["question"][0][-1]["content"])
        index = TaskIndex(f"{tmp}/tasks-{share}.db", s.embedding.dim)
        q = s.questioner.model_copy(update={"client_parallel_share": share})
        writer = ClientTaskWriter(embedder, index, gen, Counter(), random.Random(a.seed), q)
        recs = [writer.write([], set(), sets.snapshot()) for _ in train]
        tasks = [r["task"] for r in recs if r["outcome"] == "verified"]
        specs = {t.entry: {"query": t.query, "reference": t.reference, "tools": t.tools} for t in tasks}

        class Tasks:
            def episode(self, entry_id, spec=None):
                return env.episode(entry_id, specs[entry_id])

        row: dict = {
            "outcomes": dict(Counter(r["outcome"] for r in recs)),
            "tasks_by_calls": {str(n): c for n, c in sorted(Counter(len(t.reference) for t in tasks).items())},
            "rejected_for": Counter(r.get("reason", "")[:60] for r in recs if r["outcome"] == "rejected").most_common(4),
            "examples": [{"reference": t.reference, "request": t.query} for t in tasks[:4]],
        }
        for budget in budgets:
            groups = run_episodes(
                engine,
                Tasks(),
                list(specs),
                a.k,
                max_new_tokens=budget,
                temperature=s.rollout.temperature,
                top_p=s.rollout.top_p,
                call_prefix=True,
            )
            by: dict[str, list[float]] = {}
            for t, samples in zip(tasks, groups):
                by.setdefault(str(len(t.reference)), []).append(sum(x.outcome for x in samples) / a.k)
            row[f"right_at_{budget}"] = {n: round(sum(v) / len(v), 3) for n, v in sorted(by.items())}
            row[f"in_band_at_{budget}"] = {
                n: sum(s.questioner.band_low <= x <= s.questioner.band_high for x in v) for n, v in sorted(by.items())
            }
        out[f"share_{share}"] = row
        print(json.dumps({f"share_{share}": {k: v for k, v in row.items() if k != "examples"}}), flush=True)
    out["wall_s"] = round(time.monotonic() - t0)
    Path(a.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print(f"written {a.out} in {out['wall_s']} s")


if __name__ == "__main__":
    main()
