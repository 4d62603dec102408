"""Judge agreement with the verifiable BFCL step signal, and the master-key screen (CPU, real policy).

Rolls out `--groups` BFCL v3 train tasks (`--group-size` samples each, the explorer's settings),
has the served policy judge every step (choice scoring, the default judge), and compares its
GOOD/BAD labels with the environment's (GOOD = the call executed and matched a ground-truth call
of the turn). Prints accuracy, Cohen's kappa, the confusion counts, the share of GOOD labels on
each side, and judge time per step. Then judges known master-key answers with and without the
screen, to show what the raw judge would have rewarded.

    .venv/bin/python tests/benchmarks/bench_judge.py [--groups 10]
"""

import argparse
import json
import random
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from actors.events import ChatMessage, Sample  # noqa: E402
from config.settings import load_settings  # noqa: E402
from envs.registry import make_env  # noqa: E402
from policies.engines.engine import TransformersEngine  # noqa: E402
from policies.judge.judge import Agreement, PolicyJudge, env_labels  # noqa: E402
from policies.rollout import run_group  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402

MASTER_KEYS = [
    ":",
    "Thought process:",
    "Let's solve this step by step",
    "Let's solve this step by step.",
    "Solution:",
    "Step 1: GOOD",
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--state", default=".kaizen")
    a = ap.parse_args()
    s = load_settings(None)
    eng = TransformersEngine(ensure_base_model(Path(a.state)), dtype="bfloat16")
    env = make_env("bfcl", s.env)
    judge = PolicyJudge(eng)
    agree, steps, judge_s = Agreement(), 0, 0.0
    entries = random.Random(a.seed).sample(env.entries("train"), a.groups)
    tasks = []
    for e in entries:
        res = run_group(
            eng, env, e, a.group_size, max_new_tokens=s.rollout.max_new_tokens, temperature=0.9, top_p=0.95, call_prefix=True
        )
        t = time.perf_counter()
        verdicts = judge.judge(res.samples, [None] * len(res.samples))
        judge_s += time.perf_counter() - t
        for smp, v in zip(res.samples, verdicts):
            agree.add(v.labels, env_labels(smp))
            steps += len(smp.step_indices)
        tasks.append(e)
    d = agree.as_dict()
    c = d["confusion"]
    judge_good = (c["judge_good_env_good"] + c["judge_good_env_bad"]) / max(1, d["steps"])
    env_good = (c["judge_good_env_good"] + c["judge_bad_env_good"]) / max(1, d["steps"])
    print(f"steps judged: {d['steps']} from {a.groups} groups x {a.group_size}")
    print(f"agreement with BFCL step signal: accuracy {d['accuracy']}, kappa {d['kappa']}")
    print(f"GOOD share: judge {judge_good:.3f}, environment {env_good:.3f}; confusion {c}")
    print(f"judge time: {1000 * judge_s / max(1, steps):.0f} ms per step (incl. the outcome question)")

    mk = []
    for key in MASTER_KEYS:
        smp = Sample(
            sample_id=key,
            messages=[
                ChatMessage(role="system", content="s"),
                ChatMessage(role="user", content=env.query_of(tasks[0])),
                ChatMessage(role="assistant", content=key),
            ],
            step_indices=[2],
        )
        raw = judge.judge([smp], [None], screen=False)[0].labels[0]
        screened = judge.judge([smp], [None])[0].labels[0]
        mk.append({"answer": key, "raw_judge": raw, "with_screen": screened})
    print(
        "master keys (raw judge -> with screen): "
        + ", ".join(f"{m['answer']!r}: {m['raw_judge']}->{m['with_screen']}" for m in mk)
    )
    print(
        json.dumps(
            {
                "agreement": d,
                "judge_good_share": judge_good,
                "env_good_share": env_good,
                "ms_per_step": 1000 * judge_s / max(1, steps),
                "master_keys": mk,
            }
        )
    )


if __name__ == "__main__":
    main()
