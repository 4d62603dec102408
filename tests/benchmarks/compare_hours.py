"""What separates gaining hours from losing ones: one row of figures per bench_learning_curve (or
bench_live_traffic) result file, and how each figure ranks with the hour's gain (Spearman's rho over the hours given).

Figures every result file has: the gain of the newest served version on the held-out suite (points, paired p; code,
else the first suite scored, e.g. bfcl_single), learner steps, rollout groups the learner saw, the scripted user's
counts, versions served / rejected / rolled back, the gate's reference NLL at the first and the last decision (its
drift), and the gate's p50 (`gate_p50_s`: a fixed amount of work per candidate, so it also tells a slow or busy
host). Files written since `host_forward_s` give the host's own speed (seconds a forward pass, measured alone before
scoring), which has missed a host slow under the hour's load (1.05 s on a host whose guard took twice the seconds per
entry of a 1.55 s one); so `guard_s_per_entry` (the guard's seconds over the entries it scored, all hour, beside the
loop) gives the loop's own speed, and `score_ms_per_sample` (the final scoring's seconds per sample drawn) the host's.
Files written since `learner_detail` also give, per hour: the share of learner steps with no environment
group (live ratings only), the live ratings' positive share, the mean KL to the base over the last ten steps and the
mean grad norm; and, from the first ten learner steps, the summed step size (`lr_sum10`, units of 1e-5) and the
smoothed drift after them (`drift_at10`).

The guard's checks give every served version's delta against the base as the hour goes (on the first entries of the
suite: its futility stop often ends a check at half of them); their means per quarter of the hour (`guard_q1`..
`guard_q4`, points) and over all checks after minute 15 (`guard_after15`) show when an hour's level is set, with far
less scoring noise than the one newest-served figure (one version at avg@k on the suite: about 2 points of standard
error at k = 4 on 48 entries). `--against guard_after15` ranks the figures with that level instead of the gain.

`--pair A B` sets two hours side by side on the same held-out entries: B's newest served version against A's, per
entry (avg@k), with the same paired test as against the base (`policies.stats.paired_test`), so that two settings
run on the same seed are compared directly and not only through their gains over the base. Given more than once
(`--pair A1 B1 --pair A2 B2`), it also pools the pairs into one paired test, each pair's entries a unit of their own
(`pooled`): two settings over several seeds. With `--gains`, each newest version's gain over its own hour's base
is compared instead of its score: the base's avg@16 on the same 48 entries and sampling seeds was 16.8% in every
hour on AMD avx512f hosts, 16.1% on Intel avx512f ones and 18.1% on AMD AVX2 ones (the sampling's floating point),
a shift that a plain pair across those hosts carries into its delta.

`--versions FILE A B` sets two versions of one hour side by side (B against A, paired on the entries the hour
scored; `base` names the base): whether a long hour still climbed after a given version. In `--pair`, `FILE@VERSION`
is that hour with VERSION standing for its newest.

    .venv/bin/python tests/benchmarks/compare_hours.py tests/benchmarks/results/learning_curve_cpu_avx2_60*.json
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from policies.stats import paired_test  # noqa: E402

NLL = re.compile(r"reference NLL ([\d.]+) vs ([\d.]+)")


def figures(path: Path) -> dict:
    d = json.loads(path.read_text())
    nvb = d.get("newest_vs_base", {})
    code = nvb.get("code") or next((v for v in nvb.values() if isinstance(v, dict) and "delta" in v), {})
    rows = d.get("lineage", [])
    nll = [float(m.group(1)) for r in rows if (m := NLL.search(r.get("gate") or ""))]
    u = d.get("users", {})
    steps = d.get("steps") or []
    live_only = [s for s in steps if s.get("groups_env", 0) + s.get("groups_synthetic", 0) == 0]
    tail = steps[-10:]
    out = {
        "hour": path.stem.replace("learning_curve_", "").replace("live_traffic_", ""),
        "gain": 100 * code["delta"] if code else None,
        "p": code.get("p_value"),
        "steps": d.get("learner_steps"),
        "rollout_groups": d.get("rollout_groups"),
        "served": sum((r.get("gate") or "").startswith(("canary", "live")) for r in rows),
        "rejected": sum((r.get("gate") or "").startswith("rejected") for r in rows),
        "rolled_back": sum("rolled back" in (r.get("canary") or "") for r in rows),
        "user_tool_right": u["tool_right"] / u["requests"] if u.get("requests") and "tool_right" in u else None,
        "user_right": u["right"] / u["requests"] if u.get("requests") else None,
        "nll_drift": nll[-1] - nll[0] if len(nll) > 1 else None,
        "served_p50_s": (d.get("cycle_p50_s") or {}).get("served_after_s"),
        "gate_p50_s": (d.get("cycle_p50_s") or {}).get("gate_s"),
        "host_forward_s": (d.get("host_forward_s") or {}).get("before_scoring"),
        "guard_s_per_entry": guard_speed(d.get("guard_checks") or []),
        "score_ms_per_sample": scoring_speed(d),
    }
    if steps:
        out.update(
            live_only_steps=len(live_only) / len(steps),
            live_positive=d.get("live_positive_share"),
            kl_last10=sum(s.get("kl", 0) for s in tail) / len(tail),
            grad_norm=sum(s.get("grad_norm", 0) for s in steps) / len(steps),
            lr_sum10=1e5 * sum(s.get("lr") or 0 for s in steps[:10]) if any("lr" in s for s in steps) else None,
            drift_at10=steps[:10][-1].get("kl_drift"),
        )
    out.update(guard_level(d.get("guard_checks") or [], d.get("minutes") or 60))
    return out


def guard_speed(checks: list[dict]) -> float | None:
    """Seconds of the guard's checks per entry they scored (None without checks that say both)."""
    timed = [c for c in checks if c.get("duration_s") and c.get("entries")]
    return sum(c["duration_s"] for c in timed) / sum(c["entries"] for c in timed) if timed else None


def scoring_speed(d: dict) -> float | None:
    """Milliseconds of the final scoring per sample drawn (None where the file does not say all three)."""
    samples = len(d.get("scores") or {}) * sum(map(len, (d.get("suite") or {}).values())) * (d.get("k") or 0)
    return 1000 * d["score_s"] / samples if d.get("score_s") and samples else None


def guard_level(checks: list[dict], minutes: float = 60) -> dict:
    """The guard's deltas against the base (points), averaged per quarter of the run and after minute 15."""
    if not checks:
        return {}

    def mean(cs):
        return 100 * sum(c["delta"] for c in cs) / len(cs) if cs else None

    q = minutes / 4
    out = {f"guard_q{i + 1}": mean([c for c in checks if i * q <= c["minute"] < (i + 1) * q]) for i in range(4)}
    out["guard_after15"] = mean([c for c in checks if c["minute"] >= 15])
    return out


def hour(spec: str) -> dict:
    """A result file, or `FILE@VERSION`: that hour with VERSION (one it scored) standing for its newest served."""
    f, _, v = spec.partition("@")
    d = json.loads(Path(f).read_text())
    if v and v not in (d.get("scores") or {}):
        raise SystemExit(f"{f} did not score {v}: it scored {', '.join(d.get('scores') or {}) or 'nothing'}")
    return {**d, "newest_served": v} if v else d


def newest_per_entry(d: dict) -> dict[str, dict[str, float]]:
    """env -> {entry id: avg@k} of an hour's newest served version, from its result file's suite and scores."""
    scores = (d.get("scores") or {}).get(d.get("newest_served") or "", {})
    return {env: dict(zip(d["suite"][env], s["per_entry"])) for env, s in scores.items() if env in (d.get("suite") or {})}


def gains_per_entry(d: dict) -> dict[str, dict[str, float]]:
    """env -> {entry id: the newest served version's avg@k minus the base's}, both from the hour's own scoring."""
    suite = d.get("suite") or {}
    base = {env: dict(zip(suite[env], b["per_entry"])) for env, b in (d.get("base") or {}).items() if env in suite}
    return {
        env: {e: x - base[env][e] for e, x in got.items() if e in base[env]}
        for env, got in newest_per_entry(d).items()
        if env in base
    }


def _shared(a: dict, b: dict, gains: bool = False) -> dict[str, tuple[list[float], list[float]]]:
    """env -> (a's, b's) newest served avg@k on the entries both scored, in a's order; with `gains`, each over its
    own hour's base on that entry."""
    pa, pb = (gains_per_entry(a), gains_per_entry(b)) if gains else (newest_per_entry(a), newest_per_entry(b))
    out = {}
    for env in sorted(set(pa) & set(pb)):
        shared = [e for e in pa[env] if e in pb[env]]
        if shared:
            out[env] = ([pa[env][e] for e in shared], [pb[env][e] for e in shared])
    return out


def _compared(x: list[float], y: list[float]) -> dict:
    t = paired_test(x, y)
    return {
        "a": 100 * sum(x) / len(x),
        "b": 100 * sum(y) / len(y),
        "delta": 100 * t["mean_diff"],
        "p_value": t["p_value"],
        "wins": t["wins"],
        "losses": t["losses"],
        "n": len(x),
    }


def head_to_head(a: dict, b: dict, gains: bool = False) -> dict[str, dict]:
    """env -> b's newest served version against a's on the entries both scored: {"a", "b", "delta", "p_value",
    "wins", "losses", "n"} (points for the averages and the delta; wins are entries where b scored higher). With
    `gains`, each version's gain over its own hour's base instead ("a" and "b" are then the gains): two hours on
    hosts whose bases score differently on the same entries (the sampling's floating point) are compared without
    that shift."""
    return {env: _compared(x, y) for env, (x, y) in _shared(a, b, gains).items()}


def within(d: dict, va: str, vb: str) -> dict[str, dict]:
    """env -> version vb of one hour against its version va on the entries the hour scored both (e.g. its newest
    against the one served at minute 60; "base" names the base): the figures as `head_to_head`'s, "a" and "b" the
    two versions' avg@k."""
    scores = {**(d.get("scores") or {}), "base": d.get("base") or {}}
    sa, sb = scores.get(va, {}), scores.get(vb, {})
    return {
        env: _compared(sa[env]["per_entry"], sb[env]["per_entry"])
        for env in sorted(set(sa) & set(sb) & set(d.get("suite") or {}))
        if sa[env]["per_entry"] and len(sa[env]["per_entry"]) == len(sb[env]["per_entry"])
    }


def pooled(pairs: list[tuple[dict, dict]], gains: bool = False) -> dict[str, dict]:
    """Several (a, b) hour pairs (e.g. two settings on the same seeds) as one paired test: every shared entry of
    every pair is one unit (so the same entry on two seeds counts twice); the figures as `head_to_head`'s."""
    xs: dict[str, list[float]] = {}
    ys: dict[str, list[float]] = {}
    for a, b in pairs:
        for env, (x, y) in _shared(a, b, gains).items():
            xs.setdefault(env, []).extend(x)
            ys.setdefault(env, []).extend(y)
    return {env: _compared(xs[env], ys[env]) for env in sorted(xs)}


def spearman(xs: list[float], ys: list[float]) -> float | None:
    pairs = [(x, y) for x, y in zip(xs, ys) if x is not None and y is not None]
    if len(pairs) < 3:
        return None

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks([p[0] for p in pairs]), ranks([p[1] for p in pairs])
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sx, sy = sum((a - mx) ** 2 for a in rx) ** 0.5, sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (sx * sy) if sx and sy else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="*")
    ap.add_argument(
        "--pair", nargs=2, action="append", metavar=("A", "B"), help="B's newest served against A's (or FILE@VERSION's)"
    )
    ap.add_argument(
        "--json", default="", help="also write what it printed here as JSON (the pairs and their pool, the rows and correlations)"
    )
    ap.add_argument(
        "--gains",
        action="store_true",
        help="with --pair: each newest version's gain over its own hour's base, not its score (hosts whose bases differ)",
    )
    ap.add_argument("--versions", nargs=3, action="append", metavar=("FILE", "A", "B"), help="one hour's version B against its A")
    ap.add_argument("--against", default="gain", help="the figure the others are ranked with (gain, guard_after15)")
    a = ap.parse_args()
    doc: dict = {}
    for f, va, vb in a.versions or []:
        got = within(json.loads(Path(f).read_text()), va, vb)
        doc.setdefault("versions", []).append({"hour": Path(f).stem, "a": va, "b": vb, **got})
        for env, r in got.items():
            print(
                f"{env}: {Path(f).stem} {vb} {r['b']:.1f}% vs {va} {r['a']:.1f}%: {r['delta']:+.1f} points, "
                f"p = {r['p_value']:.3g}, +{r['wins']}/-{r['losses']} on {r['n']} entries"
            )
    if a.pair:
        hours = [tuple(hour(f) for f in pair) for pair in a.pair]
        unit = " points over its base" if a.gains else "%"
        doc["pairs"] = []
        for (fa, fb), (ha, hb) in zip(a.pair, hours):
            got = head_to_head(ha, hb, a.gains)
            fa, fb = (Path(f.partition("@")[0]).stem for f in (fa, fb))
            versions = {"a_version": ha.get("newest_served"), "b_version": hb.get("newest_served")}
            doc["pairs"].append({"a": fa, "b": fb, **versions, "gains": a.gains, **got})
            for env, r in got.items():
                print(
                    f"{env}: {fb} {hb.get('newest_served')} {r['b']:.1f}{unit} vs {fa} "
                    f"{ha.get('newest_served')} {r['a']:.1f}{unit}: {r['delta']:+.1f} points, p = {r['p_value']:.3g}, "
                    f"+{r['wins']}/-{r['losses']} on {r['n']} entries"
                )
        if len(hours) > 1:
            doc["pooled"] = pooled(hours, a.gains)
            for env, r in doc["pooled"].items():
                print(
                    f"{env}: the {len(hours)} pairs pooled, B {r['b']:.1f}{unit} vs A {r['a']:.1f}{unit}: "
                    f"{r['delta']:+.1f} points, p = {r['p_value']:.3g}, +{r['wins']}/-{r['losses']} on {r['n']} entry pairs"
                )
    if not a.files:
        if a.json:
            Path(a.json).write_text(json.dumps(doc, indent=1))
        return
    rows = [figures(Path(f)) for f in a.files]
    keys = [k for k in rows[0] if k != "hour"] + sorted({k for r in rows for k in r} - set(rows[0]))
    print(f"{'hour':<28}" + "".join(f"{k[:14]:>15}" for k in keys))
    for r in rows:
        print(
            f"{r['hour'][:28]:<28}"
            + "".join(f"{r.get(k):>15.3f}" if isinstance(r.get(k), float) else f"{str(r.get(k, '-')):>15}" for k in keys)
        )
    rho = {k: spearman([r.get(k) for r in rows], [r.get(a.against) for r in rows]) for k in keys if k not in (a.against, "p")}
    print(f"Spearman rho with {a.against}: " + ", ".join(f"{k} {v:+.2f}" for k, v in rho.items() if v is not None))
    if a.json:
        Path(a.json).write_text(json.dumps({**doc, "rows": rows, "against": a.against, "spearman": rho}, indent=1))


if __name__ == "__main__":
    main()
