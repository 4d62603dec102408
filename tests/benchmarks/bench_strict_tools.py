"""Strict functions under `tool_choice` auto: what the grammar changes in the answers a client gets (CPU default model).

A client that marks its functions `strict` (the OpenAI Agents SDK does by default) and lets the model choose between
words and a call is answered either from free decoding, its calls vetted after the fact (a strict call that does not
match its parameters goes out as the model's text, `policies/vetting.py`), or from decoding under the grammar
`policies.grammar.response_grammar` builds for it: free text, or text and then one call block of declared functions,
each strict one's arguments matching its parameters. Both ways on the same BFCL v4 entries (`simple_python`,
`multiple` and `parallel` from bfcl-eval's data, every function marked strict, the request and its tools as
`envs.bfcl_single` renders them): per entry, one greedy answer and `--k` at the rollout temperature, each parsed and
vetted as serve's `Turn.answer` does. Reported per way: the share of answers that are calls a client can run, and the
share BFCL's own AST checker accepts; the accepted shares paired per entry (grammar minus free). No timing is
reported: the figures are counts, the same beside other work.

    .venv/bin/python tests/benchmarks/bench_strict_tools.py [--per-category 16] [--k 3] [--categories simple_python]
        [--out FILE]
"""

import argparse
import json
import random
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-category", type=int, default=16)
    ap.add_argument("--k", type=int, default=3, help="answers at the rollout temperature per entry and way")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--categories", default="", help="comma-separated BFCL single-turn categories (default: all)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "strict_tools_cpu.json"))
    a = ap.parse_args()

    from actors.events import ChatMessage
    from config.settings import load_settings
    from envs.bfcl_single import CATEGORIES, SingleTurnEnvironment, check
    from policies.chat import parse_assistant, render
    from policies.engines.roles import make_engine
    from policies.grammar import response_grammar
    from policies.stats import paired_test
    from policies.vetting import trusted_calls
    from policies.weights.model_store import ensure_base_model

    s = load_settings(ROOT / "config" / "cpu.yaml")
    s.state_dir, s.model.torch_threads = str(ROOT / ".kaizen"), a.threads
    engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="eval")
    env, rng = SingleTurnEnvironment(), random.Random(a.seed)
    cats = a.categories.split(",") if a.categories else CATEGORIES
    train = env.entries("train")
    ids = [e for c in cats for e in rng.sample([x for x in train if env.category_of(x) == c], a.per_category)]
    ways = ("free", "grammar")

    def answers(prompt: str, tools, grammar: str | None) -> list[ChatMessage]:
        """Serve's answers to an unforced request: generated, parsed and vetted as `Turn.answer` does."""
        gens = engine.generate([prompt], 96, grammar=grammar)  # greedy
        gens += engine.generate([prompt] * a.k, 96, temperature=s.rollout.temperature, grammar=grammar)
        return [trusted_calls(parse_assistant(g.text), tools, g.text, g.finish_reason == "length") for g in gens]

    rows, refused = [], []
    for eid in ids:
        ep = env.episode(eid)
        tools = [t.model_copy(update={"function": t.function.model_copy(update={"strict": True})}) for t in ep.tools]
        try:
            grammar = response_grammar(None, tools)
        except ValueError as exc:  # serve answers such a request with a 400 naming `tools`
            refused.append({"entry": eid, "why": str(exc)[:200]})
            continue
        msgs = [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=ep.question)]
        prompt, row = render(msgs, tools), {"entry": eid, "category": env.category_of(eid)}
        for way in ways:
            got = answers(prompt, tools, grammar if way == "grammar" else None)
            row[way] = {
                "calls": sum(bool(m.tool_calls) for m in got) / len(got),
                "accepted": sum(bool(m.tool_calls) and check(eid, m.tool_calls)[0] for m in got) / len(got),
                "greedy": (got[0].tool_calls and [c.model_dump() for c in got[0].tool_calls]) or got[0].content[:200],
            }
        rows.append(row)
        print(eid, {w: (row[w]["calls"], row[w]["accepted"]) for w in ways}, flush=True)

    def mean(key, way, rs=rows):
        return round(sum(r[way][key] for r in rs) / len(rs), 4) if rs else None

    summary = {w: {"calls": mean("calls", w), "accepted": mean("accepted", w)} for w in ways}
    per_cat = {
        c: {w: {"calls": mean("calls", w, rs), "accepted": mean("accepted", w, rs)} for w in ways}
        for c in cats
        if (rs := [r for r in rows if r["category"] == c])
    }
    test = paired_test([r["free"]["accepted"] for r in rows], [r["grammar"]["accepted"] for r in rows]) if rows else None
    out = {
        "entries": len(rows),
        "k": a.k,
        "answers_per_entry": a.k + 1,
        "temperature": s.rollout.temperature,
        "summary": summary,
        "categories": per_cat,
        "accepted_grammar_vs_free": test,
        "refused": refused,
        "rows": rows,
    }
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"\n{len(rows)} entries ({len(refused)} refused by the grammar compiler), {a.k + 1} answers each")
    for w in ways:
        print(f"{w:8s} calls a client can run {summary[w]['calls']:.3f}, accepted by BFCL's checker {summary[w]['accepted']:.3f}")
    if test:
        p, wins, losses = test["p_value"], test["wins"], test["losses"]
        print(f"accepted, grammar - free: {test['mean_diff']:+.4f} (p = {p:.4g}, +{wins}/-{losses})")


if __name__ == "__main__":
    main()
