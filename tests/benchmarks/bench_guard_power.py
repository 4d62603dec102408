"""How often would the guard catch a version as far below the base as one an hour served? Its check, replayed.

The guard (policies/promotion/guard.py) scores a served version `guard.k` times an entry against the base sampled
`guard.base_k` times once, and rolls it back at `below` (`look`: the stratified exact test at `guard.alpha`, with a
futility stop once `guard.early_fraction` of the suite shows no loss). How likely that verdict is for a given true
loss is its power, and a version it misses reaches users. This replays the guard's check `--runs` times with the
guard's own decision function (`policies.promotion.guard_decisions.look`, chunk by chunk as the guard looks), taking
each entry's true success rate to be what an hour's final scoring measured (avg@16, `scores` and `base` of a
bench_live_traffic / bench_learning_curve result file; an estimate itself, so the figures are the power against a
version like that one), and prints, for each scored version and each k in `--k`, the share of runs that end
`below`. The base against itself gives the false-alarm rate.

    .venv/bin/python tests/benchmarks/bench_guard_power.py HOUR.json [--k 4,8,16] [--base-k 16] [--runs N] [--config F] [--out F]
"""

import argparse
import json
import random
from pathlib import Path

from _common import ROOT  # noqa: F401  (puts the repository on sys.path)
from config.settings import load_settings  # noqa: E402
from policies.promotion.guard_decisions import Check, look  # noqa: E402


def detection_rate(rates: list[float], base_rates: list[float], k: int, g, runs: int, seed: int = 0) -> float:
    """The share of `runs` replayed checks that end `below`: per run, the base drawn `g.base_k` times an entry and the
    version `k` times at the given true rates, looked at every `g.chunk_entries` entries as the guard does."""
    rng = random.Random(seed)

    def draw(p: float, n: int) -> float:
        return sum(rng.random() < p for _ in range(n)) / n

    below = 0
    for _ in range(runs):
        base = [draw(p, g.base_k) for p in base_rates]
        version = [draw(p, k) for p in rates]
        check = Check("v", "env", [], [], len(rates), k, g.base_k)
        verdict = ""
        for end in range(g.chunk_entries, len(rates) + g.chunk_entries, g.chunk_entries):
            check.per_entry, check.base = version[:end], base[:end]
            if verdict := look(check, g.early_fraction, g.alpha):
                break
        below += verdict == "below"
    return below / runs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("result", help="an hour's result file (its `base` and `scores` per entry)")
    ap.add_argument("--k", default="", help="samples per entry of a checked version, comma-separated (default: guard.k, x2, x4)")
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--config", default="", help="settings whose guard section to replay (default: the defaults)")
    ap.add_argument("--base-k", type=int, default=0, help="the base's samples per entry (default: guard.base_k)")
    ap.add_argument("--out", default="", help="also write the figures here as JSON")
    a = ap.parse_args()
    g = load_settings(a.config or None, **({"guard.base_k": a.base_k} if a.base_k else {})).guard
    ks = [int(x) for x in a.k.split(",")] if a.k else [g.k, 2 * g.k, 4 * g.k]
    d = json.loads(Path(a.result).read_text())
    print(
        f"{Path(a.result).stem}: the guard's check replayed {a.runs} times (base_k {g.base_k}, chunks of "
        f"{g.chunk_entries}, futility stop at {g.early_fraction}, alpha {g.alpha}); share of runs ending `below`"
    )
    out = {"result": Path(a.result).name, "runs": a.runs, "base_k": g.base_k, "alpha": g.alpha, "versions": {}}
    for env, b in (d.get("base") or {}).items():
        base = b["per_entry"]
        versions = {"base": base} | {v: s[env]["per_entry"] for v, s in (d.get("scores") or {}).items() if env in s}
        for v, rates in versions.items():
            delta = 100 * (sum(rates) - sum(base)) / len(base)
            power = {k: detection_rate(rates, base, k, g, a.runs, seed=k) for k in ks}
            out["versions"].setdefault(env, {})[v] = {"delta": delta, "below_share": power}
            print(
                f"  {env} {v} ({delta:+.1f} points at the hour's scoring): "
                + ", ".join(f"k={k} {p:.2f}" for k, p in power.items())
            )
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
