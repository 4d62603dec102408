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

`--env bfcl_single --families simple_python` trains on BFCL's single-turn train entries instead, judged by BFCL's
own AST checker, as the explorer practises them in `up`: groups sampled with the preset's rollout settings, held-out
avg@k scored as bench_live_traffic scores it (its first `--heldout` held-out entries of those categories, the
preset's temperature, token limit and forced call; the base's scores come from the state dir's cache when they are
there). `--drift` ties the step size to the drift from the base as the learner in `up` does (`learner.kl_target`,
`policies/learning/step_size.py`; `--kl-target` moves its bound); without it the step size stays at `learner.lr`.
Every step's lr and KL are kept.

    .venv/bin/python tests/benchmarks/bench_floor.py [--groups 24] [--heldout 16] [--k 4]
    .venv/bin/python tests/benchmarks/bench_floor.py --env bfcl_single --families simple_python --heldout 48 \
        --runs mixed --drift --groups 120 --eval-every 15
"""

import argparse
import json
import random
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from actors.events import Judgement  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.code import CodeEnvironment  # noqa: E402
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.judge.stats import score_rollout  # noqa: E402
from policies.learning.groups import at_floor, informative  # noqa: E402
from policies.learning.step_size import StepSize  # noqa: E402
from policies.learning.trainer import Trainer  # noqa: E402
from policies.rollout import evaluate, reference_sample, run_group  # noqa: E402
from policies.stats import paired_test  # noqa: E402
from policies.weights.model_store import BASE_VERSION, ensure_base_model  # noqa: E402


def scores(engine, env, heldout, a):
    ev = evaluate(engine, env, heldout, a.k, a.max_new_tokens, a.temperature, call_prefix=a.call_prefix, batch=a.score_batch)
    return [sum(ev["entries"][e]) / a.k for e in heldout]


def run(name, settings, base, env, plan, heldout, base_scores, a):
    import tempfile

    import torch

    torch.manual_seed(a.seed)
    st = settings.model_copy(deep=True)
    st.state_dir = tempfile.mkdtemp(prefix=f"kaizen-floor-{name}-")
    trainer = Trainer(st, base)
    drift = StepSize.from_settings(st.learner) if a.drift else None
    eng = TransformersEngine(base, dtype="bfloat16", threads=a.threads)
    t0, ready, steps, n_informative, with_ref, rewards, curve, trace = time.monotonic(), [], 0, 0, 0, [], [], []
    r = st.rollout
    for i, entry in enumerate(plan):
        res = run_group(
            eng, env, entry, a.group_size, max_new_tokens=a.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
            call_prefix=a.call_prefix, choose_names=r.choose_name,
        )  # fmt: skip
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
            lr = trainer.lr
            stats = trainer.train_step(ready)
            ready, steps = [], steps + 1
            if drift:
                trainer.set_lr(drift.after_step(trainer.lr, stats["kl"]))
            trace.append({"step": steps, "lr": lr, "kl": round(stats["kl"], 5), "seconds": round(stats["seconds"], 1)})
            eng.load_state_dict(trainer.export("bfloat16"), f"w-{steps:06d}")
            print(
                f"  {name} step {steps}: loss {stats['loss']:.4f} grad {stats['grad_norm']:.3f} "
                f"off-policy {stats['off_policy_samples']} reward {stats['mean_reward']:.2f} kl {stats['kl']:.4f} lr {lr:.3g}",
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
        "steps": trace,
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
    ap.add_argument("--env", default="code", choices=["code", "bfcl_single"])
    ap.add_argument("--families", default="add", help="comma-separated code families (ladder rungs) or BFCL categories")
    ap.add_argument("--heldout", type=int, default=16)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument(
        "--temperature", type=float, default=None, help="of the held-out avg@k (code: 0.7; bfcl_single: the preset's)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=None, help="code: 48; bfcl_single: the preset's")
    ap.add_argument("--score-batch", type=int, default=1, help="episodes scored together (whole entries)")
    ap.add_argument("--drift", action="store_true", help="tie the step size to the drift from the base, as in up")
    ap.add_argument("--eval-every", type=int, default=0, help="also evaluate every N learner steps")
    ap.add_argument("--runs", default="on_policy,mixed")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--kl-target", type=float, default=None, help="with --drift: learner.kl_target (the preset's otherwise)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument("--out", default=None, help="write the JSON summary here too")
    a = ap.parse_args()
    settings = load_settings(None)
    settings.model.torch_threads = a.threads
    if a.lr:
        settings.learner.lr = a.lr
    if a.kl_target is not None:
        if not a.drift:
            raise SystemExit("--kl-target sets the drift bound of --drift")
        settings.learner.kl_target = a.kl_target
    settings.state_dir = a.state
    base = ensure_base_model(Path(a.state))
    fams = a.families.split(",")
    rng = random.Random(a.seed)
    env, heldout, cache = _env(settings, a, fams)
    train = [e for e in env.entries("train") if env.category_of(e) in fams]
    plan = [rng.choice(train) for _ in range(a.groups)]
    import torch

    torch.manual_seed(a.seed)
    cached = cache.get(BASE_VERSION) if cache else None
    if cached:
        base_scores = cached[env.name]["per_entry"]
    else:
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
        "env": a.env,
        "temperature": a.temperature,
        "max_new_tokens": a.max_new_tokens,
        "lr": settings.learner.lr,
        "drift": a.drift,
        "kl_target": settings.learner.kl_target if a.drift else None,
        "seed": a.seed,
        "heldout": heldout,
        "results": results,
    }
    print(json.dumps(summary))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2))


def _env(settings, a, fams):
    """(environment, held-out entries, the state dir's cache of the base's scores or None); sets the scoring
    options (a.temperature, a.max_new_tokens, a.call_prefix) the environment is scored with."""
    if a.env == "code":
        a.temperature = 0.7 if a.temperature is None else a.temperature
        a.max_new_tokens = a.max_new_tokens or 48
        a.call_prefix = True
        env = CodeEnvironment()
        per = max(1, a.heldout // len(fams))  # the same number of held-out entries from each family
        return env, [e for f in fams for e in [x for x in env.entries("heldout") if env.category_of(x) == f][:per]], None
    from deploy.reports import heldout_cache
    from envs.bfcl_single import SingleTurnEnvironment

    if a.temperature is not None or a.max_new_tokens is not None:
        raise SystemExit("bfcl_single is scored with the preset's rollout options, as bench_live_traffic scores it")
    env = SingleTurnEnvironment(categories=fams, heldout_fraction=settings.env.heldout_fraction)
    cache = heldout_cache(settings, {env.name: env}, {env.name: a.heldout}, a.k, {env.name: fams})
    a.temperature, a.max_new_tokens, a.call_prefix = (cache.opts[k] for k in ("temperature", "max_new_tokens", "call_prefix"))
    return env, cache.entries[env.name], cache


if __name__ == "__main__":
    main()
