"""Held-out evaluation reports: avg@k / best@k per environment and category, as a table and a chart."""

from __future__ import annotations

from pathlib import Path

from policies.rollout import evaluate

Row = tuple[str, str, int, float, float]  # env, category, tasks, avg, best


def heldout(
    engine, envs: dict, *, k: int, per_category: int, max_new_tokens: int, temperature: float, call_prefix: bool, progress=None
) -> tuple[list[Row], dict]:
    """Evaluate each environment's held-out split (optionally the first `per_category` entries of each category)."""
    rows: list[Row] = []
    result: dict = {}
    for name, env in envs.items():
        entries = env.entries("heldout")
        if per_category:
            by_cat: dict[str, list[str]] = {}
            for e in entries:
                by_cat.setdefault(env.category_of(e), []).append(e)
            entries = [e for cat in sorted(by_cat) for e in by_cat[cat][:per_category]]
        res = evaluate(
            engine,
            env,
            entries,
            k=k,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            call_prefix=call_prefix,
            progress=(lambda i, n, eid, sc, name=name: progress(name, i, n, eid, sc)) if progress else None,
        )
        cats: dict[str, list[list[float]]] = {}
        for eid, scores in res["entries"].items():
            cats.setdefault(env.category_of(eid), []).append(scores)
        env_rows = [
            (name, cat, len(ls), sum(sum(x) / len(x) for x in ls) / len(ls), sum(max(x) for x in ls) / len(ls))
            for cat, ls in sorted(cats.items())
        ]
        env_rows.append((name, "all", len(res["entries"]), res["avg"], res["best"]))
        rows += env_rows
        result[name] = {
            "avg": res["avg"],
            "best": res["best"],
            "entries": res["entries"],
            "categories": {r[1]: {"n": r[2], "avg": r[3], "best": r[4]} for r in env_rows},
        }
    return rows, result


def table(rows: list[Row], version: str, k: int) -> str:
    lines = [f"\nweights {version}, k={k}", f"{'env':<6} {'category':<13} {'tasks':>5} {f'avg@{k}':>8} {f'best@{k}':>8}"]
    lines += [f"{n:<6} {c:<13} {t:>5} {100 * a:>7.1f}% {100 * b:>7.1f}%" for n, c, t, a, b in rows]
    return "\n".join(lines)


def chart(rows: list[Row], version: str, k: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = range(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(rows)), 4))
    ax.bar([i - 0.2 for i in x], [100 * r[3] for r in rows], width=0.4, label=f"avg@{k}")
    ax.bar([i + 0.2 for i in x], [100 * r[4] for r in rows], width=0.4, label=f"best@{k}")
    ax.set_xticks(list(x), [f"{r[0]}/{r[1]}" for r in rows], rotation=30, ha="right")
    ax.set_ylabel("% of held-out tasks")
    ax.set_ylim(0, 100)
    ax.set_title(f"Held-out evaluation, weights {version}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
