"""Ablation of self-questioning and self-attributing on equal rollout budgets (CPU, the real 135M policy).

Three runs start from the same base weights and spend the same number of rollout groups
(`--groups`, `--group-size` samples each) on BFCL v3 train tasks, taking a learner step every
`--groups-per-step` informative groups, then score greedy on the same held-out entries:
  env_only          dataset tasks only, outcome-only GRPO (verl's estimator)
  plus_synthetic    half of the groups on self-generated tasks (explore -> write -> verify)
  plus_attribution  as plus_synthetic, with step-level credit (ADCA-GRPO, alpha 0.1)
Synthetic tasks are written once, by the base policy, and shared by the last two runs; their
cost is reported apart from the rollout budget. Prints one line per run and a JSON summary.

    .venv/bin/python tests/benchmarks/bench_self_evolution.py [--groups 12] [--heldout 12]
"""

import argparse
import json
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from actors.events import Judgement  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.registry import make_env  # noqa: E402
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.judge.stats import score_rollout  # noqa: E402
from policies.learning.trainer import Trainer  # noqa: E402
from policies.rollout import evaluate, run_group  # noqa: E402
from policies.tasks import synthesis as syn  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402


def make_tasks(env, base_engine, n, seed):
    gen, rng, visits, out, t0 = syn.PolicyGenerator(base_engine), random.Random(seed), Counter(), [], time.monotonic()
    tries = 0
    while len(out) < n and tries < 6 * n:
        tries += 1
        base = rng.choice(env.entries("train"))
        exp = syn.explore(gen, env, base, 3, visits, rng)
        exp.steps = [s for s in exp.steps if s.ok][:2]
        if not exp.reference:
            continue
        query, who = syn.write_query(gen, exp, env.probe(base).tools, [])
        entry = syn.task_entry_id(syn.signature("bfcl", base, exp.reference))
        spec = {"base_entry_id": base, "query": query, "reference": exp.reference}
        if syn.verify(env, entry, spec)[0]:
            out.append((entry, spec, who))
    return out, tries, time.monotonic() - t0


def run(name, settings, base, env, plan, heldout, a):
    torch_seed = 1234
    import torch

    torch.manual_seed(torch_seed)
    st = settings.model_copy(deep=True)
    st.state_dir = tempfile.mkdtemp(prefix=f"kaizen-bench-{name}-")
    st.learner.adca_alpha = 0.1 if name == "plus_attribution" else 0.0
    trainer = Trainer(st, base)
    eng = TransformersEngine(base, dtype="bfloat16")
    t0, ready, steps, informative, rewards = time.monotonic(), [], 0, 0, []
    for i, (entry, spec, origin) in enumerate(plan):
        res = run_group(
            eng, env, entry, a.group_size, max_new_tokens=64, temperature=0.9, top_p=0.95, call_prefix=True, spec=spec
        )
        scored = [score_rollout(s) for s in res.samples]
        rewards += [s.outcome for s in res.samples]
        j = Judgement(
            group_id=f"{name}-{i}",
            source="rollout",
            task_id=entry,
            samples=res.samples,
            outcomes=[o for o, _ in scored],
            step_labels=[lab for _, lab in scored],
            origin=origin,
        )
        if len(set(j.outcomes)) > 1:
            informative += 1
            ready.append(j)
        if len(ready) >= a.groups_per_step:
            trainer.train_step(ready)
            ready, steps = [], steps + 1
            eng.load_state_dict(trainer.export("bfloat16"), f"w-{steps:06d}")
    train_s = time.monotonic() - t0
    ev = evaluate(eng, env, heldout, k=1, max_new_tokens=64, temperature=0.0, call_prefix=True)
    return {
        "run": name,
        "groups": len(plan),
        "informative_groups": informative,
        "learner_steps": steps,
        "train_reward": round(sum(rewards) / len(rewards), 4),
        "heldout_avg": round(ev["avg"], 4),
        "heldout_solved": sum(1 for s in ev["entries"].values() if s[0] >= 1.0),
        "train_s": round(train_s, 1),
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=12)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--heldout", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument("--out", default=None, help="write the JSON summary here too")
    a = ap.parse_args()
    settings = load_settings(None)
    base = ensure_base_model(Path(a.state))
    env = make_env("bfcl", settings.env)
    rng = random.Random(a.seed)
    heldout = sorted(rng.sample(env.entries("heldout"), a.heldout))
    env_tasks = [(e, None, "env") for e in rng.sample(env.entries("train"), a.groups)]
    base_engine = TransformersEngine(base, dtype="bfloat16")
    base_eval = evaluate(base_engine, env, heldout, k=1, max_new_tokens=64, temperature=0.0, call_prefix=True)
    n_syn = a.groups // 2
    synth, tries, synth_s = make_tasks(env, base_engine, n_syn, a.seed)
    del base_engine
    mixed = []
    for i in range(a.groups):  # alternate dataset and synthetic tasks; same dataset order as env_only
        if i % 2 == 1 and synth:
            e, spec, _ = synth[(i // 2) % len(synth)]
            mixed.append((e, spec, "synthetic"))
        else:
            mixed.append(env_tasks[i // 2 if synth else i])
    print(f"base weights: held-out avg {base_eval['avg']:.4f} on {len(heldout)} entries")
    print(
        f"synthetic tasks: {len(synth)} verified from {tries} explorations in {synth_s:.0f} s "
        f"(writers: {dict(Counter(w for _, _, w in synth))})"
    )
    results = [{"run": "base", "heldout_avg": round(base_eval["avg"], 4)}]
    for name, plan in [("env_only", env_tasks), ("plus_synthetic", mixed), ("plus_attribution", mixed)]:
        r = run(name, settings, base, env, plan, heldout, a)
        results.append(r)
        print(
            f"{name:17s} held-out avg {r['heldout_avg']:.4f} (solved {r['heldout_solved']}/{len(heldout)}) | "
            f"train reward {r['train_reward']:.3f} | informative groups {r['informative_groups']}/{r['groups']} | "
            f"learner steps {r['learner_steps']} | {r['train_s']:.0f} s"
        )
    summary = {
        "groups": a.groups,
        "group_size": a.group_size,
        "heldout": heldout,
        "results": results,
        "synthetic": {
            "verified": len(synth),
            "explorations": tries,
            "seconds": round(synth_s, 1),
            "queries": [s["query"] for _, s, _ in synth],
        },
    }
    print(json.dumps(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
