"""Learning from the floor: mixed-policy GRPO (verified references in unsolved groups) against plain
on-policy GRPO, on the same tasks, scored on the same held-out entries (CPU, the real 135M policy).

Both runs start from the base weights and spend the same rollout budget (`--groups` groups of
`--group-size` samples) on the same train entries of the code ladder's lowest rungs (`--families`).
  on_policy   groups without outcome variance teach nothing and are skipped (what main had)
  mixed       a group that no sample solved gets the environment's reference trajectory as an
              off-policy sample (LUFFY-style shaped loss, `grpo.off_policy_loss`); as in the
              learner, it stays only where the policy's own samples carry no signal (`at_floor`)
A learner step every `--groups-per-step` informative groups. Every `--eval-every` steps, and at the
end, the version is scored avg@k (sampled, `--k`) on the same held-out entries, and compared with
the base by the exact paired sign-flip test (`policies/stats.py`). Prints one line per evaluation
and a JSON summary (written to `--out` too).

    .venv/bin/python tests/benchmarks/bench_floor.py [--groups 24] [--heldout 16] [--k 4]
"""

import argparse
import json
import random
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from actors.attributor import score_rollout  # noqa: E402
from actors.events import Judgement  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.code import CodeEnvironment  # noqa: E402
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.learning.groups import at_floor, informative  # noqa: E402
from policies.learning.trainer import Trainer  # noqa: E402
from policies.rollout import evaluate, reference_sample, run_group  # noqa: E402
from policies.stats import paired_test  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402


def scores(engine, env, heldout, a):
    ev = evaluate(engine, env, heldout, k=a.k, max_new_tokens=a.max_new_tokens, temperature=a.temperature, call_prefix=True)
    return [sum(ev["entries"][e]) / a.k for e in heldout]


def run(name, settings, base, env, plan, heldout, base_scores, a):
    import tempfile

    import torch

    torch.manual_seed(a.seed)
    st = settings.model_copy(deep=True)
    st.state_dir = tempfile.mkdtemp(prefix=f"kaizen-floor-{name}-")
    trainer = Trainer(st, base)
    eng = TransformersEngine(base, dtype="bfloat16", threads=a.threads)
    t0, ready, steps, n_informative, with_ref, rewards, curve = time.monotonic(), [], 0, 0, 0, [], []
    for i, entry in enumerate(plan):
        res = run_group(
            eng, env, entry, a.group_size, max_new_tokens=a.max_new_tokens, temperature=0.9, top_p=0.95, call_prefix=True
        )
        samples = list(res.samples)
        rewards += [s.outcome for s in samples]
        if name == "mixed" and max(s.outcome for s in samples) < 1.0:
            ref = reference_sample(env, entry)
            if ref is not None:
                samples.append(ref)
        scored = [score_rollout(s) for s in samples]
        j = at_floor(
            Judgement(
                group_id=f"{name}-{i}",
                source="rollout",
                task_id=entry,
                samples=samples,
                outcomes=[o for o, _ in scored],
                step_labels=[lab for _, lab in scored],
            ),
            st.learner.adca_alpha,
        )  # as the learner does: a reference only where the group is flat
        with_ref += any(s.off_policy for s in j.samples)
        if informative(j, st.learner.adca_alpha):
            n_informative += 1
            ready.append(j)
        if len(ready) >= a.groups_per_step:
            stats = trainer.train_step(ready)
            ready, steps = [], steps + 1
            eng.load_state_dict(trainer.export("bfloat16"), f"w-{steps:06d}")
            print(
                f"  {name} step {steps}: loss {stats['loss']:.4f} grad {stats['grad_norm']:.3f} "
                f"off-policy {stats['off_policy_samples']} reward {stats['mean_reward']:.2f}",
                flush=True,
            )
            if a.eval_every and steps % a.eval_every == 0 and i < len(plan) - 1:
                curve.append(_point(name, steps, i + 1, eng, env, heldout, base_scores, a, t0))
    curve.append(_point(name, steps, len(plan), eng, env, heldout, base_scores, a, t0))
    return {
        "run": name,
        "groups": len(plan),
        "informative_groups": n_informative,
        "groups_with_reference": with_ref,
        "learner_steps": steps,
        "train_reward": round(sum(rewards) / len(rewards), 4),
        "curve": curve,
        "seconds": round(time.monotonic() - t0, 1),
    }


def _point(name, steps, groups, eng, env, heldout, base_scores, a, t0):
    s = scores(eng, env, heldout, a) if steps else list(base_scores)
    t = paired_test(base_scores, s)
    p = {
        "steps": steps,
        "groups": groups,
        "heldout_avg": round(sum(s) / len(s), 4),
        "per_entry": s,
        "delta_vs_base": round(t["mean_diff"], 4),
        "p_value": round(t["p_value"], 4),
        "wins": t["wins"],
        "losses": t["losses"],
        "elapsed_s": round(time.monotonic() - t0, 1),
    }
    print(
        f"{name:9s} step {steps:3d} ({groups} groups): held-out avg@{a.k} {p['heldout_avg']:.3f} "
        f"delta {p['delta_vs_base']:+.3f} p={p['p_value']:.4f} (+{t['wins']}/-{t['losses']}) {p['elapsed_s']:.0f} s",
        flush=True,
    )
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=24)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--groups-per-step", type=int, default=2)
    ap.add_argument("--families", default="add", help="comma-separated code families (ladder rungs) to train on")
    ap.add_argument("--heldout", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature of the held-out avg@k")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N learner steps")
    ap.add_argument("--runs", default="on_policy,mixed")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument("--out", default=None, help="write the JSON summary here too")
    a = ap.parse_args()
    settings = load_settings(None)
    settings.model.torch_threads = a.threads
    if a.lr:
        settings.learner.lr = a.lr
    base = ensure_base_model(Path(a.state))
    env = CodeEnvironment()
    fams = a.families.split(",")
    rng = random.Random(a.seed)
    train = [e for e in env.entries("train") if env.category_of(e) in fams]
    per = max(1, a.heldout // len(fams))  # the same number of held-out entries from each family
    heldout = [e for f in fams for e in [x for x in env.entries("heldout") if env.category_of(x) == f][:per]]
    plan = [rng.choice(train) for _ in range(a.groups)]
    import torch

    torch.manual_seed(a.seed)
    base_scores = scores(TransformersEngine(base, dtype="bfloat16", threads=a.threads), env, heldout, a)
    print(f"base      held-out avg@{a.k} {sum(base_scores) / len(base_scores):.3f} on {len(heldout)} entries", flush=True)
    results = [{"run": "base", "heldout_avg": round(sum(base_scores) / len(base_scores), 4), "per_entry": base_scores}]
    for name in a.runs.split(","):
        r = run(name, settings, base, env, plan, heldout, base_scores, a)
        results.append(r)
        print(
            f"{name:9s} informative groups {r['informative_groups']}/{r['groups']} (with reference "
            f"{r['groups_with_reference']}) | learner steps {r['learner_steps']} | train reward "
            f"{r['train_reward']:.3f} | {r['seconds']:.0f} s",
            flush=True,
        )
    summary = {
        "families": fams,
        "groups": a.groups,
        "group_size": a.group_size,
        "k": a.k,
        "temperature": a.temperature,
        "lr": settings.learner.lr,
        "heldout": heldout,
        "results": results,
    }
    print(json.dumps(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
