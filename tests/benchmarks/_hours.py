"""What bench_learning_curve keeps of each hour beyond the lineage (what each learner step learned from, the
guard's checks and rollbacks, the live ratings), and the summary of several hours (`--repeats`)."""

import json
from datetime import datetime
from pathlib import Path


def _at(e) -> float:
    return datetime.fromisoformat(e.occurred_at).timestamp()


def learner_detail(events, learner) -> dict:
    """What each step learned from (origin of its new groups, reward, KL, grad norm, staleness) and what the
    live ratings were: the figures that can tell a gaining hour from a losing one."""
    keep = (
        "groups_env",
        "groups_synthetic",
        "groups_live",
        "groups_again",
        "samples",
        "mean_reward",
        "kl",
        "grad_norm",
        "loss",
        "staleness_max",
        "is_mean",
        "off_policy_samples",
        "guided_samples",
        "hindsight_samples",
        "seconds",
        "lr",
        "kl_drift",
    )
    steps = [
        {
            "step": e.step,
            "version": e.weights_version,
            **{k: float(f"{e.metrics[k]:.5g}") if k == "lr" else round(float(e.metrics[k]), 5) for k in keep if k in e.metrics},
        }
        for e in learner
    ]
    live = [e for e in events if e.kind == "judgement" and e.source == "live"]
    pos = sum(1 for e in live for o in e.outcomes if o > 0)
    n = sum(len(e.outcomes) for e in live)
    rollouts = [e for e in events if e.kind == "judgement" and e.source != "live"]
    t0 = min((_at(e) for e in events), default=0.0)
    guard = [
        {
            "minute": round((_at(e) - t0) / 60, 1),
            "version": e.version,
            "verdict": e.verdict,
            "delta": round(e.delta, 4),
            "p_value": round(e.p_value, 5),
            "entries": e.entries,
            "duration_s": round(e.duration_s),
        }
        for e in events
        if e.kind == "heldout_scored"
    ]
    rolled = [
        {"minute": round((_at(e) - t0) / 60, 1), "from": e.from_version, "to": e.to.version, "reason": e.reason[:300]}
        for e in events
        if e.kind == "weights_rolled_back"
    ]
    signals: dict[str, int] = {}
    for e in live:
        for sig in e.signals:
            signals[sig] = signals.get(sig, 0) + 1
    regrouped = [e for e in live if len(e.samples) > 1 and e.signals[1:2] == ["alternative"]]
    alts = [s for e in regrouped for s in e.samples[1:]]
    return {
        "steps": steps,
        "guard_checks": guard,
        "rollbacks": rolled,
        "next_turn_judgements": signals,
        "live_judgements": n,
        "live_positive_share": pos / n if n else None,
        "rollout_judgements": len(rollouts),
        "resampled_live_steps": {  # live steps re-sampled into groups, and how their alternatives were scored
            "groups": len(regrouped),
            "with_spread": sum(len(set(e.outcomes)) > 1 for e in regrouped),
            "alternatives": len(alts),
            "misfit": sum(s.error is not None for s in alts),
        },
        "trained_groups": {o: sum(st.get(f"groups_{o}", 0) for st in steps) for o in ("env", "synthetic", "live")},
    }


def summary_row(name: str, out: dict) -> dict:
    nv = out["newest_vs_base"].get("code", {})
    worst = min((d["code"]["delta"] for d in out["versus_base"].values() if "code" in d), default=None)
    below = [v for v, d in out["versus_base"].items() if "code" in d and d["code"]["delta"] < 0 and d["code"]["p_value"] < 0.05]
    return {
        "hour": name,
        "newest": out["newest_served"],
        "base_avg": nv.get("base_avg"),
        "avg": nv.get("avg"),
        "delta": nv.get("delta"),
        "p_value": nv.get("p_value"),
        "wins": nv.get("wins"),
        "losses": nv.get("losses"),
        "unseen_by_gate": out["newest_vs_base_unseen_by_gate"].get("code"),
        "scored_versions": {
            v: {k: d["code"][k] for k in ("delta", "p_value")} for v, d in out["versus_base"].items() if "code" in d
        },
        "worst_scored_delta": worst,
        "significantly_below_base": below,
        "cycle_p50_s": out["cycle_p50_s"],
        "learner_steps": out["learner_steps"],
        "served": sum(r["gate"].startswith(("canary", "live")) for r in out["lineage"]),
        "guard_checks": len(out["guard_checks"]),
        "guard_below": [c["version"] for c in out["guard_checks"] if c["verdict"] == "below"],
        "rollbacks": out["rollbacks"],
        "trained_groups": out["trained_groups"],
        "users": out["users"],
    }


def write_summary(a, hours: list[dict]) -> None:
    ds = [h["delta"] for h in hours if h["delta"] is not None]
    served = [h["cycle_p50_s"].get("served_after_s") for h in hours if h["cycle_p50_s"].get("served_after_s")]
    summ = {
        "config": a.config,
        "minutes": a.minutes,
        "k": a.k,
        "per_category": a.per_category,
        "hours": hours,
        "delta_mean": sum(ds) / len(ds) if ds else None,
        "delta_min": min(ds, default=None),
        "p_max": max((h["p_value"] for h in hours if h["p_value"] is not None), default=None),
        "served_p50_median": sorted(served)[len(served) // 2] if served else None,
        "any_version_significantly_below_base": any(h["significantly_below_base"] for h in hours),
    }
    path = Path(f"{a.out}_summary.json")
    path.write_text(json.dumps(summ, indent=1))
    print(
        f"summary of {len(hours)} hour(s): "
        + ", ".join(f"{100 * h['delta']:+.1f} (p={h['p_value']:.4f})" for h in hours if h["delta"] is not None)
        + f"; mean {100 * (summ['delta_mean'] or 0):+.1f}, min {100 * (summ['delta_min'] or 0):+.1f} points; "
        f"written {path}",
        flush=True,
    )


def suite_args(a) -> tuple:
    """(--per-category, --categories) as heldout.suite takes them."""
    per = (
        int(a.per_category)
        if a.per_category.isdigit()
        else {k: int(v) for k, v in (x.split("=") for x in a.per_category.split(","))}
    )
    return per, {k: v.split(",") for k, v in (x.split("=") for x in a.categories.split(";") if x)}


def suite_envs(s, per) -> dict:
    """The environments the suite names (one the system does not train on, like bfcl_single, included)."""
    from envs.registry import make_env

    return {n: make_env(n, s.env) for n in (per if isinstance(per, dict) else s.env.names)}


def _caches(a, config: Path, state: Path):
    """(settings, envs, [held-out caches of the base]): the bench's suite at --k, and the guard's at guard.base_k."""
    from config.settings import load_settings
    from deploy import reports
    from policies.evaluation.heldout import HeldoutCache
    from policies.promotion.guard_decisions import guard_suite

    s = load_settings(config)
    s.state_dir = str(state)
    per, cats = suite_args(a)
    g, r = s.guard, s.rollout
    envs = {**suite_envs(s, per), **suite_envs(s, {n: g.per_category for n in g.suite})}
    caches = [reports.heldout_cache(s, envs, per, a.k, cats)]
    if g.enabled:
        caches.append(
            HeldoutCache(
                s.state / "evals" / "heldout.json",
                guard_suite(envs, g),
                k=g.base_k,
                temperature=r.temperature,
                max_new_tokens=r.max_new_tokens,
                call_prefix=r.call_prefix,
            )
        )
    return s, envs, caches


def seed_base(a, config: Path, state: Path) -> None:
    """The base's scores into a fresh state dir, where the guard and the report look: scored once on this machine
    (nothing else running) and kept in the checkout's `.kaizen/evals/heldout.json` with the converted model, as
    `up` keeps them in its state dir (a base does not change)."""
    from _common import ROOT
    from policies.engines.roles import make_engine
    from policies.weights.model_store import BASE_VERSION, ensure_base_model

    s, envs, kept = _caches(a, Path(a.config), ROOT / ".kaizen")
    engine = None
    for cache in kept:
        if cache.get(BASE_VERSION) is None:
            if engine is None:
                s.model.torch_threads = a.score_threads
                engine = make_engine(s, ensure_base_model(s.state, s.model.source, s.model.path, progress=False), role="eval")
            cache.evaluate(engine, envs, BASE_VERSION, batch=a.score_batch)
            print(
                f"base scored at k={cache.k}: " + json.dumps({e: round(x["avg"], 4) for e, x in cache.get(BASE_VERSION).items()}),
                flush=True,
            )
    _, _, fresh = _caches(a, config, state)
    for cache, have in zip(fresh, kept):
        cache.put(BASE_VERSION, envs, {env: x["per_entry"] for env, x in have.get(BASE_VERSION).items()})


def repeats(a, one_hour) -> None:
    """`--repeats N`: N fresh hours, one after the other, and one summary of them (every hour seeded with the
    same base scores)."""
    hours = []
    for r in range(1, a.repeats + 1):
        print(f"=== hour {r} of {a.repeats}", flush=True)
        out = one_hour(a, f"{a.out}_r{r}")
        hours.append(summary_row(f"{Path(a.out).name}_r{r}", out))
        write_summary(a, hours)


def _p50(xs: list[float]) -> float | None:
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else None


def host_forward_s(model_dir: Path, repeats: int = 5) -> float:
    """The host's speed, so that hours run on different machines can be told apart: the median seconds of one forward
    pass of the base model over 512 fixed tokens on one torch thread, as each actor here runs. Measured alone: before
    `up` starts and again after it is down, before scoring (LOG.md 2026-11-30: the gate's fixed work took 10.3 s p50
    in the two hours the preset was adopted on and 16.9-20.7 s in every preset hour since, at the same code)."""
    import statistics
    import time

    import torch
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        ids = (torch.arange(512) * 7919 % model.config.vocab_size).unsqueeze(0)
        times = []
        with torch.no_grad():
            model(ids[:, :64])  # warm-up
            for _ in range(repeats):
                t0 = time.perf_counter()
                model(ids)
                times.append(time.perf_counter() - t0)
        return round(statistics.median(times), 4)
    finally:
        torch.set_num_threads(threads)


def committed_hosts(results: Path | None = None) -> list[float]:
    """`host_forward_s` before `up` of every committed hour that has one (results/*.json), sorted."""
    results = results or Path(__file__).resolve().parent / "results"
    out = []
    for f in results.glob("*.json"):
        host = json.loads(f.read_text()).get("host_forward_s")
        if isinstance(host, dict) and isinstance(host.get("before_up"), (int, float)):
            out.append(float(host["before_up"]))
    return sorted(out)


def host_limit(limit: float | None, like: Path | None, slack: float = 1.25) -> float | None:
    """The tighter of `limit` and `slack` x the host of the hour in `like`, the one this hour is paired with (LOG.md
    2026-12-02: a 2.5 s limit let a 2.34 s host through, and the hour made 16 steps against its pair's 46)."""
    host = json.loads(like.read_text()).get("host_forward_s") if like else None
    if like and not (isinstance(host, dict) and isinstance(host.get("before_up"), (int, float))):
        raise SystemExit(f"--host-like {like}: it records no host_forward_s.before_up to pair with")
    return limit if not like else min(x for x in (limit, slack * float(host["before_up"])) if x is not None)


def check_host(seconds: float, limit: float | None, results: Path | None = None) -> None:
    """Say how this host compares with the committed hours' hosts; stop (SystemExit, nothing run yet) above `limit`."""
    seen = committed_hosts(results)
    span = f"{seen[0]:.2f}-{seen[-1]:.2f} s over {len(seen)} committed hours" if seen else "no committed hour to compare"
    print(f"host_forward_s {seconds:.2f} s ({span})", flush=True)
    if limit is not None and seconds > limit:
        raise SystemExit(
            f"host_forward_s {seconds:.2f} s is above the limit {limit:.2f} s (--max-host-forward-s, --host-like) ({span}): "
            "an hour here would make fewer learner steps than the hours it is to be compared with; run it on a faster host"
        )


def host_cpu() -> str:
    """The CPU's model name, its widest vector extension and its cores (from /proc/cpuinfo where there is one)."""
    import os

    p = Path("/proc/cpuinfo")
    lines = p.read_text().splitlines() if p.exists() else []
    name = next((x.split(":", 1)[1].strip() for x in lines if x.startswith("model name")), "unknown")
    flags = next((x.split(":", 1)[1].split() for x in lines if x.startswith("flags")), [])
    return f"{name} ({next((f for f in ('avx512f', 'avx2', 'avx') if f in flags), 'no avx')}, {os.cpu_count()} cores)"
