"""A fresh optimizer's first update, by its size: from the base weights, one learner step on the same practice groups
at each step size, and the gate's reference NLL of the result (`gate.reference_pairs` / `reference_nll`, the figure
that rejected the first version of 8 of 19 live-traffic hours, LOG.md 2026-11-30).

Question: does the first update's move of the reference NLL scale with its size? If it moves as far at a quarter of
the preset's step size as at all of it, a ramp over a fresh optimizer's first updates (`learner.lr_warmup`) cannot
change what the first version does, and is not worth an hour.

Groups: `--pairs` pairs of BFCL single-turn train entries of `--families` (bench_floor's practice), each sampled
`rollout.group_size` times from the base with the preset's rollout options and scored by BFCL's checker
(`score_rollout`); a group none of whose samples solved it gets its verified reference, which stays only where the
policy's own samples teach nothing (`at_floor`), as in `up`, and only groups that teach something are kept
(`informative`), as the learner keeps them. Each pair is trained from the base at every `--lrs`
value by a fresh `Trainer` (a fresh AdamW: the learner's first step, or its step after a reset), with
`--warmup` as `learner.lr_warmup`. The reference pairs are the gate's in `up` with `--config` (`env.names`,
`gate.nll_entries`, `--bfcl-categories` for bfcl_single's held-out split; the live-traffic hours' preset by
default). All groups are sampled before any training. Prints one line per pair and step size and a JSON summary
(`--out` too).

    .venv/bin/python tests/benchmarks/bench_first_step.py --pairs 6 \
        --lrs 0,2e-5,1e-5,5e-6,2.5e-6 --out tests/benchmarks/results/first_step_cpu.json

`--lrs 0` is the control: the same fresh trainer, export and load, without a move of any weight.
"""

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from actors.events import Judgement  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.registry import make_env  # noqa: E402
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.judge.stats import score_rollout  # noqa: E402
from policies.learning.groups import at_floor, informative  # noqa: E402
from policies.learning.trainer import Trainer  # noqa: E402
from policies.promotion.gate import reference_nll, reference_pairs  # noqa: E402
from policies.rollout import reference_sample, run_group  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402


def group(engine, env, entry, settings, name) -> Judgement:
    r = settings.rollout
    res = run_group(
        engine, env, entry, r.group_size, max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
        call_prefix=r.call_prefix, choose_names=r.choose_name,
    )  # fmt: skip
    samples = list(res.samples)
    if max(s.outcome for s in samples) < 1.0 and (ref := reference_sample(env, entry)) is not None:
        samples.append(ref)
    scored = [score_rollout(s) for s in samples]
    j = Judgement(
        group_id=name,
        source="rollout",
        task_id=entry,
        samples=samples,
        outcomes=[o for o, _ in scored],
        step_labels=[lab for _, lab in scored],
    )
    return at_floor(j, settings.learner.adca_alpha)


def informative_group(engine, env, train, rng, settings, name, tries=20) -> Judgement:
    """A group that teaches something (the learner in `up` trains no other), from the first entries drawn that give one."""
    for _ in range(tries):
        if informative(j := group(engine, env, rng.choice(train), settings, name), settings.learner.adca_alpha):
            return j
    raise SystemExit(f"no informative group in {tries} draws")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--config",
        default=str(ROOT / "tests" / "benchmarks" / "configs" / "live_traffic_cpu.yaml"),
        help="the preset whose learner, rollout and gate settings apply (the live-traffic hours' by default)",
    )
    ap.add_argument("--bfcl-categories", default="simple_python", help="bfcl_single's categories (the gate's split)")
    ap.add_argument("--families", default="simple_python", help="BFCL single-turn categories the practice comes from")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--lrs", default="0,2e-5,1e-5,5e-6,2.5e-6")
    ap.add_argument("--warmup", type=int, default=0, help="learner.lr_warmup of the fresh trainers")
    ap.add_argument("--dtype", default="float32", help="of the engine and the exported weights (`up` on an AVX2 CPU: float32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default=".kaizen")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    import torch

    settings = load_settings(a.config, **{"env.bfcl_single_categories": a.bfcl_categories.split(",")})
    settings.model.torch_threads = a.threads
    settings.learner.lr_warmup = a.warmup
    settings.state_dir = a.state
    base = ensure_base_model(Path(a.state))
    names = list(dict.fromkeys([*settings.env.names, "bfcl_single"]))
    envs = {n: make_env(n, settings.env) for n in names}
    pairs = reference_pairs(envs, settings.gate.nll_entries)
    eng = TransformersEngine(base, dtype=a.dtype, threads=a.threads)
    base_nll = reference_nll(eng, pairs)
    print(f"base reference NLL {base_nll:.4f} on {len(pairs)} pairs", flush=True)

    env, fams, rng = envs["bfcl_single"], a.families.split(","), random.Random(a.seed)
    train = [e for e in env.entries("train") if env.category_of(e) in fams]
    torch.manual_seed(a.seed)
    plan = [[informative_group(eng, env, train, rng, settings, f"p{i}g{k}") for k in range(2)] for i in range(a.pairs)]
    lrs = [float(x) for x in a.lrs.split(",")]
    rows = []
    for i, groups in enumerate(plan):
        refs = sum(s.off_policy for g in groups for s in g.samples)
        for lr in lrs:
            st = settings.model_copy(deep=True)
            st.learner.lr = lr
            t0 = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="kaizen-first-step-") as st.state_dir:
                trainer = Trainer(st, base)
                stats = trainer.train_step(groups)
                eng.load_state_dict(trainer.export(a.dtype), f"p{i}-{lr:g}")
            nll = reference_nll(eng, pairs)
            row = {
                "pair": i,
                "lr": lr,
                "lr_applied": stats["lr"],
                "references": refs,
                "outcomes": [g.outcomes for g in groups],
                "grad_norm": round(stats["grad_norm"], 4),
                "nll": round(nll, 4),
                "nll_move": round(nll - base_nll, 4),
                "seconds": round(time.monotonic() - t0, 1),
            }
            rows.append(row)
            print(
                f"pair {i} ({refs} references, grad {row['grad_norm']:.2f}) lr {lr:.3g} (applied {stats['lr']:.3g}): "
                f"reference NLL {nll:.4f} ({row['nll_move']:+.4f})",
                flush=True,
            )

    by_lr = {
        f"{lr:g}": {
            "mean_move": round(statistics.mean(r["nll_move"] for r in rows if r["lr"] == lr), 4),
            "mean_abs_move": round(statistics.mean(abs(r["nll_move"]) for r in rows if r["lr"] == lr), 4),
        }
        for lr in lrs
    }
    summary = {
        "config": a.config,
        "pairs": a.pairs,
        "warmup": a.warmup,
        "dtype": a.dtype,
        "seed": a.seed,
        "base_nll": round(base_nll, 4),
        "reference_pairs": len(pairs),
        "by_lr": by_lr,
        "rows": rows,
    }
    print(json.dumps({k: v for k, v in summary.items() if k != "rows"}))
    if a.out:
        Path(a.out).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
