"""Where a promotion gate's time goes, per part, on this machine (the real 135M policy, one torch thread as
in `up`, the held-out suite the broadcaster builds from the preset).

A gate scores one candidate: the reference-action likelihood (`gate.nll_entries` reference actions of each
environment) and greedy held-out episodes (`gate.heldout_tasks` entries of each environment; a second look,
when the candidate falls short there, scores up to `gate.second_look_tasks`: timed separately). The
likelihood is timed two ways side by side, alternating, on the same pairs: one full forward per pair with
logits over the whole sequence (how it was scored before), and the current scoring (prompts that start alike
run once through a shared KV cache, logits for the continuation only). It also checks that both give the
same NLL. Nothing else runs meanwhile: inside `up` the gate shares the cores with users, the learner and
exploration, so a gate there takes longer (bench_learning_curve reports it as a stage).

    .venv/bin/python tests/benchmarks/bench_gate.py [--config config/cpu.yaml] [--repeats 3]
"""

import argparse
import json
import statistics
import time
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from config.settings import load_settings  # noqa: E402
from envs.registry import make_envs  # noqa: E402
from policies.engines.roles import make_engine  # noqa: E402
from policies.promotion.gate import gate_heldout, reference_nll, reference_pairs  # noqa: E402
from policies.rollout import evaluate  # noqa: E402
from policies.weights.model_store import ensure_base_model  # noqa: E402


def plain_nll(engine, pairs) -> float:
    """The reference NLL with one full forward per pair (logits at every position): the baseline."""
    torch, lp_sum, n_sum = engine.torch, 0.0, 0
    with torch.inference_mode():
        for prompt, cont in pairs:
            p = engine.tok(prompt, add_special_tokens=False)["input_ids"]
            c = engine.tok(cont, add_special_tokens=False)["input_ids"]
            logits = engine.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1].float()
            lp_sum += float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c).unsqueeze(-1)).sum())
            n_sum += len(c)
    return -lp_sum / max(1, n_sum)


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", default=str(ROOT / "config" / "cpu.yaml"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "gate_cpu.json"))
    a = ap.parse_args()
    s = load_settings(a.config)
    engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="gate")
    envs = make_envs(s.env)
    pairs = reference_pairs(envs, s.gate.nll_entries)
    heldout = gate_heldout(envs, s.gate)
    tokens = sum(engine.count_tokens(p) + engine.count_tokens(c) for p, c in pairs)
    plain, shared, nlls = [], [], set()
    for _ in range(a.repeats):
        t, x = timed(lambda: plain_nll(engine, pairs))
        plain.append(t)
        t, y = timed(lambda: reference_nll(engine, pairs))
        shared.append(t)
        nlls.add((round(x, 4), round(y, 4)))
    episodes, per_episode = {}, {}
    for name, entries in heldout.items():  # the first look, then what a second look adds
        for look, ids in (("first", entries[: s.gate.heldout_tasks]), ("second", entries[s.gate.heldout_tasks :])):
            if ids:
                t = statistics.median(
                    timed(
                        lambda: evaluate(
                            engine,
                            envs[name],
                            ids,
                            k=1,
                            max_new_tokens=s.rollout.max_new_tokens,
                            call_prefix=s.rollout.call_prefix,
                        )
                    )[0]
                    for _ in range(a.repeats)
                )
                episodes[f"{name}_{look}"], per_episode[name] = round(t, 2), round(t / len(ids), 2)
    out = {
        "pairs": len(pairs),
        "pair_tokens": tokens,
        "heldout": heldout,
        "repeats": a.repeats,
        "nll_plain_s": round(statistics.median(plain), 2),
        "nll_shared_prefix_s": round(statistics.median(shared), 2),
        "nll_speedup": round(statistics.median(plain) / statistics.median(shared), 2),
        "nll_plain_vs_shared": sorted(nlls),
        "episodes_s": episodes,
        "per_episode_s": per_episode,
    }
    out["first_look_gate_s"] = round(out["nll_shared_prefix_s"] + sum(v for k, v in episodes.items() if k.endswith("_first")), 1)
    print(json.dumps(out, indent=1))
    Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
