"""Scoring a live step that no user rated: which way does the next turn point the policy? (CPU default model)

A live step with a signal (the tool reported an error, the user said "that is not what I asked") has no rating and
no environment that could check an alternative: the client's tools cannot be run here. Three candidate scorers,
measured on the same wrong steps:

1. **Hindsight shift** (OpenClaw-RL's on-policy distillation): the policy, shown the next turn as a hint, is the
   teacher of the step it wrote without it (the hint as `policies/learning/hindsight.py` builds it for the learner); token
   t gets log pi(a_t | context + hint) - log pi(a_t | context). It points the right way on an entry when it
   raises an accepted answer more than the wrong one: shift(accepted) - shift(wrong) > 0, summed over each
   answer's tokens.
2. **Hindsight rewrite**: the policy, shown the hint, writes the step again (k samples); accepted by BFCL's checker
   how often, against k plain re-samples of the same context.
3. **The judge** (`policies/judge/judge.py`, the served policy by choice scoring, as in `up`): labels the accepted and
   the wrong answer; right when it calls the accepted one GOOD and the wrong one BAD.
4. **Hindsight ranking of re-samples**: the k plain re-samples of the step, ranked by their hindsight shift (1.,
   summed over each one's tokens); on the steps whose re-samples the checker splits, the share of (accepted,
   rejected) pairs it orders right (0.5 = chance), and how often its top re-sample is an accepted one.
5. **Fit to the declared tools** (`envs/tool_fit.py`: the request's own function schemas, no user, no answer key):
   the same k re-samples, each fitting or not; how often a fitting re-sample is accepted against one that does not
   fit, and on how many steps the check splits the re-samples (a group with a spread to learn from).

The steps are what bench_live_traffic's users meet: BFCL v4 `simple_python`, `multiple`, `parallel` train entries,
a call forced as serve forces `tool_choice: required`, the base's greedy answer, kept where BFCL's AST checker
rejects it; the hint is what that benchmark's user sends next (the tool's error with the checker's reason, then
"That is not what I asked." and the request). Prints the figures and writes JSON.

    .venv/bin/python tests/benchmarks/bench_hindsight.py [--per-category 30] [--k 4] [--categories simple_python]
        [--no-rewrites] [--out FILE]
"""

import argparse
import json
import random
import time
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def ranking(oks: list[bool], shifts: list[float]) -> dict | None:
    """How a step's re-samples ranked by hindsight shift meet the checker: the share of (accepted, rejected) pairs in
    the right order (ties half) and whether the top one is accepted; None when the checker does not split them."""
    acc = [x for x, ok in zip(shifts, oks) if ok]
    rej = [x for x, ok in zip(shifts, oks) if not ok]
    if not acc or not rej:
        return None
    pairs = sum((x > y) + 0.5 * (x == y) for x in acc for y in rej) / (len(acc) * len(rej))
    return {"pairs_right": pairs, "top_accepted": oks[shifts.index(max(shifts))]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-category", type=int, default=30)
    ap.add_argument("--k", type=int, default=4, help="rewrites and plain re-samples per wrong step")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--categories", default="", help="comma-separated BFCL single-turn categories (default: all)")
    ap.add_argument("--no-rewrites", action="store_true", help="skip the hinted rewrites and the judge (scorers 2, 3)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "hindsight_cpu.json"))
    a = ap.parse_args()

    from actors.events import ChatMessage, Sample
    from config.settings import load_settings
    from envs.bfcl_single import CATEGORIES, SingleTurnEnvironment, check, reference_calls
    from envs.tool_fit import misfit
    from policies.chat import CALL_PREFIX, assistant_text, call_opening, parse_forced, render
    from policies.engines.roles import make_engine
    from policies.judge.judge import PolicyJudge
    from policies.learning.hindsight import next_turn, teacher_messages
    from policies.stats import paired_test
    from policies.weights.model_store import ensure_base_model

    s = load_settings(ROOT / "config" / "cpu.yaml")
    s.state_dir, s.model.torch_threads = str(ROOT / ".kaizen"), a.threads
    engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="eval")
    env = SingleTurnEnvironment()
    rng = random.Random(a.seed)
    train = env.entries("train")
    cats = a.categories.split(",") if a.categories else CATEGORIES
    ids = [e for c in cats for e in rng.sample([x for x in train if env.category_of(x) == c], a.per_category)]
    t0 = time.monotonic()

    def answers(msgs, tools, temperature, n):
        """What serve answers a client forcing a call: a declared name by constrained decoding, then the rest."""
        prompt, names = render(msgs, tools), [t.function.name + '"' for t in tools]
        picked = [engine.choose(prompt + CALL_PREFIX, names, temperature) for _ in range(n)]
        forced = [call_opening(tools[names.index(name)]) for name in picked]
        gens = engine.generate([prompt + f for f in forced], 96, temperature=temperature)
        return [parse_forced(f, g.text) for f, g in zip(forced, gens)]

    rows = []
    for eid in ids:
        ep = env.episode(eid)
        ctx = [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=ep.question)]
        (wrong,) = answers(ctx, ep.tools, 0.0, 1)
        ok, why = check(eid, wrong.tool_calls) if wrong.tool_calls else (False, "no function call")
        right = ChatMessage(role="assistant", tool_calls=reference_calls(eid))
        if ok or not check(eid, right.tool_calls)[0]:
            rows.append({"entry": eid, "greedy_right": ok})
            continue
        error = f"Error: {why or 'the call does not match the request'}"  # what bench_live_traffic's user sends
        after = [ChatMessage(role="tool", tool_call_id=t.id, content=error) for t in wrong.tool_calls]
        after.append(ChatMessage(role="user", content=f"That is not what I asked. {ep.question}"))
        hinted = teacher_messages([*ctx, wrong], 2, next_turn(after))[:2]
        plain_p, hint_p = render(ctx, ep.tools), render(hinted, ep.tools)
        texts = [assistant_text(wrong) + "<|im_end|>", assistant_text(right) + "<|im_end|>"]
        lp = engine.sequence_logprobs([(p, t) for p in (plain_p, hint_p) for t in texts])
        shift_w, shift_r = lp[2][0] - lp[0][0], lp[3][0] - lp[1][0]
        per_tok = (lp[3][0] - lp[1][0]) / lp[1][1] - (lp[2][0] - lp[0][0]) / lp[0][1]
        plain = answers(ctx, ep.tools, s.rollout.temperature, a.k)
        rew = [] if a.no_rewrites else answers(hinted, ep.tools, s.rollout.temperature, a.k)
        acc = [sum(check(eid, m.tool_calls)[0] for m in ms if m.tool_calls) / a.k for ms in (plain, rew)]
        oks = [bool(m.tool_calls) and check(eid, m.tool_calls)[0] for m in plain]
        fits = [bool(m.tool_calls) and misfit(m.tool_calls, ep.tools) is None for m in plain]
        lp2 = engine.sequence_logprobs([(p, assistant_text(m) + "<|im_end|>") for m in plain for p in (plain_p, hint_p)])
        shifts = [lp2[2 * i + 1][0] - lp2[2 * i][0] for i in range(len(plain))]
        samples = [
            Sample(sample_id=f"{eid}:{i}", messages=[*ctx, m], tools=ep.tools, step_indices=[2], step_signals=[0.0], outcome=0.0)
            for i, m in enumerate((wrong, right))
        ]
        verdicts = [None, None] if a.no_rewrites else PolicyJudge(engine).judge(samples, [None, None])
        labels = [v.labels[0] if v else None for v in verdicts]
        rows.append(
            {
                "entry": eid,
                "greedy_right": False,
                "why": why[:200],
                "shift_wrong": round(shift_w, 4),
                "shift_right": round(shift_r, 4),
                "shift_margin": round(shift_r - shift_w, 4),
                "shift_margin_per_token": round(per_tok, 4),
                "plain_acc": acc[0],
                "rewrite_acc": acc[1],
                "judge_wrong": labels[0],
                "judge_right": labels[1],
                "resample_ok": oks,
                "resample_shift": [round(x, 4) for x in shifts],
                "ranking": ranking(oks, shifts),
                "wrong_misfit": misfit(wrong.tool_calls, ep.tools) if wrong.tool_calls else "no function call",
                "resample_fit": fits,
            }
        )
        print(
            f"{eid:28s} margin {shift_r - shift_w:+7.2f}  plain {acc[0]:.2f} rewrite {acc[1]:.2f}  judge {labels[1]}/{labels[0]}",
            flush=True,
        )

    wrong = [r for r in rows if not r["greedy_right"] and "shift_margin" in r]
    n = len(wrong)
    margins = [r["shift_margin"] for r in wrong]
    tok = [r["shift_margin_per_token"] for r in wrong]
    test = paired_test([0.0] * n, margins) if n else {}
    rewrite = paired_test([r["plain_acc"] for r in wrong], [r["rewrite_acc"] for r in wrong]) if n and not a.no_rewrites else {}
    judged = [r for r in wrong if r["judge_right"] and r["judge_wrong"]]
    split = [r for r in wrong if r["ranking"] is not None]
    aucs = [r["ranking"]["pairs_right"] for r in split]
    pairs = [(f, ok) for r in wrong for f, ok in zip(r["resample_fit"], r["resample_ok"])]
    fit_n, misfit_n = sum(f for f, _ in pairs), sum(not f for f, _ in pairs)
    out = {
        "entries": len(rows),
        "greedy_right": sum(r["greedy_right"] for r in rows),
        "wrong_steps": n,
        "k": a.k,
        "temperature": s.rollout.temperature,
        "seconds": round(time.monotonic() - t0),
        "hindsight_shift": {
            "points_right": sum(m > 0 for m in margins),
            "points_wrong": sum(m < 0 for m in margins),
            "mean_margin": sum(margins) / n if n else None,
            "p_value": test.get("p_value"),
            "points_right_per_token": sum(m > 0 for m in tok),
        },
        "rewrite": {
            "plain_acc": sum(r["plain_acc"] for r in wrong) / n if n else None,
            "rewrite_acc": sum(r["rewrite_acc"] for r in wrong) / n if n and not a.no_rewrites else None,
            **rewrite,
        },
        "judge": {
            "n": len(judged),
            "both_right": sum(r["judge_right"] == "GOOD" and r["judge_wrong"] == "BAD" for r in judged),
            "good_when_right": sum(r["judge_right"] == "GOOD" for r in judged),
            "good_when_wrong": sum(r["judge_wrong"] == "GOOD" for r in judged),
        },
        "resample_ranking": {
            "steps_split": len(split),
            "mean_pairs_right": sum(aucs) / len(aucs) if aucs else None,
            "p_value": paired_test([0.5] * len(aucs), aucs).get("p_value") if aucs else None,
            "top_accepted": sum(r["ranking"]["top_accepted"] for r in split),
            "top_accepted_by_chance": sum(sum(r["resample_ok"]) / len(r["resample_ok"]) for r in split),
        },
        "schema_fit": {
            "wrong_served_misfit": sum(r["wrong_misfit"] is not None for r in wrong),
            "resamples": len(pairs),
            "fit": fit_n,
            "accepted_when_fit": sum(ok for f, ok in pairs if f) / fit_n if fit_n else None,
            "accepted_when_misfit": sum(ok for f, ok in pairs if not f) / misfit_n if misfit_n else None,
            "accepted_misfit": sum(ok for f, ok in pairs if not f),
            "steps_split": sum(0 < sum(r["resample_fit"]) < len(r["resample_fit"]) for r in wrong),
        },
        "rows": rows,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    h, rw, j = out["hindsight_shift"], out["rewrite"], out["judge"]
    print(f"\n{len(rows)} entries, base greedy right on {out['greedy_right']}; {n} wrong steps scored")
    print(
        f"hindsight shift: points right on {h['points_right']}, wrong on {h['points_wrong']} (mean margin "
        f"{h['mean_margin']}, sign-flip p={h['p_value']}); per token right on {h['points_right_per_token']}"
    )
    print(f"rewrite with the hint: {rw['rewrite_acc']} accepted vs {rw['plain_acc']} plain (p={rw.get('p_value')})")
    rr = out["resample_ranking"]
    print(
        f"re-samples ranked by hindsight shift: {rr['steps_split']} steps split by the checker, pairs ordered right "
        f"{rr['mean_pairs_right']} (p={rr['p_value']}), top accepted {rr['top_accepted']} vs "
        f"{rr['top_accepted_by_chance']} by chance"
    )
    sf = out["schema_fit"]
    print(
        f"fit to the declared tools: served wrong calls that misfit {sf['wrong_served_misfit']}/{n}; re-samples that fit "
        f"{sf['fit']}/{sf['resamples']}, accepted when fit {sf['accepted_when_fit']} vs misfit {sf['accepted_when_misfit']}; "
        f"steps split {sf['steps_split']}"
    )
    print(
        f"judge: accepted GOOD {j['good_when_right']}/{j['n']}, wrong GOOD {j['good_when_wrong']}/{j['n']}, both "
        f"right {j['both_right']}/{j['n']}"
    )


if __name__ == "__main__":
    main()
