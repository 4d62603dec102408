"""What a right answer to a held-out `bfcl_single` entry takes in new tokens, against a generation budget.

The held-out scoring (bench_learning_curve, bench_live_traffic, the gate and the guard) writes each answer after the
forced call opening (`<tool_call>[{"name": "f", "arguments": `) with at most `rollout.max_new_tokens` new tokens (64
in the CPU presets). A `parallel` entry's reference is several calls: when they take more tokens than the budget, no
sample can be right and the entry scores 0 for every version. This prints, per category, the new tokens the first
reference answer of BFCL's ground truth takes (after the forced opening, in the served model's tokenizer), and how
many entries no budget in `--budgets` can hold, for all held-out entries and for the first `--per-category` of
each (the benches' `--per-category bfcl_single=N`). Writes JSON. No model runs; seconds.

    .venv/bin/python tests/benchmarks/reference_tokens.py [--per-category 16] [--budgets 64,96,128,160,192]
"""

import argparse
import json
import statistics
from pathlib import Path

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)


def main() -> None:
    from transformers import AutoTokenizer

    from actors.events import ToolSpec
    from envs.bfcl_single import SingleTurnEnvironment, load, reference_calls, to_tool_spec
    from policies.chat import call_opening
    from policies.weights.model_store import ensure_base_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-category", type=int, default=16)
    ap.add_argument("--budgets", default="64,96,128,160,192")
    ap.add_argument("--state-dir", default=str(ROOT / ".kaizen"), help="where the base model is (converted once)")
    ap.add_argument("--out", default=str(ROOT / "tests" / "benchmarks" / "results" / "reference_tokens_cpu.json"))
    a = ap.parse_args()
    budgets = [int(b) for b in a.budgets.split(",")]
    tok = AutoTokenizer.from_pretrained(str(ensure_base_model(Path(a.state_dir), progress=False)))
    env = SingleTurnEnvironment()
    by_cat: dict[str, list[int]] = {}
    for e in env.entries("heldout"):
        calls = reference_calls(e)
        first = next(t for t in load(env.category_of(e))[0][e]["function"] if t["name"] == calls[0].name)
        opening = call_opening(ToolSpec.model_validate(to_tool_spec(first).model_dump()), grammar=True)
        block = json.dumps([{"name": c.name, "arguments": json.loads(c.arguments)} for c in calls])
        whole = tok.encode(f"<tool_call>{block}</tool_call>", add_special_tokens=False)
        by_cat.setdefault(env.category_of(e), []).append(len(whole) - len(tok.encode(opening, add_special_tokens=False)))
    out = {"tokenizer": Path(tok.name_or_path).name, "per_category": a.per_category, "budgets": budgets, "categories": {}}
    for cat, need in sorted(by_cat.items()):
        row = {
            "entries": len(need),
            "median": statistics.median(need),
            "max": max(need),
            "over": {str(b): sum(n > b for n in need) for b in budgets},
            "first_n_over": {str(b): sum(n > b for n in need[: a.per_category]) for b in budgets},
        }
        out["categories"][cat] = row
        print(
            f"{cat:<14} {row['entries']:>3} held-out entries, new tokens median {row['median']:.0f}, max {row['max']}; "
            + ", ".join(
                f"> {b}: {row['over'][str(b)]} ({row['first_n_over'][str(b)]} of the first {a.per_category})" for b in budgets
            )
        )
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
