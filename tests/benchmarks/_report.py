"""What bench_learning_curve makes of an hour: the base and every served version (or `--max-versions` of them)
scored on the fixed held-out suite, each against the base, also without the entries the gate looks at; the JSON and
the PNG curve; the lineage table and the summary it prints."""

import json
import time
from pathlib import Path

from _hours import _p50, host_cpu, host_forward_s, learner_detail, suite_args, suite_envs


def report(a, s, state: Path, events, learner, stats, wall_s, out_path: str, host: dict | None = None) -> dict:
    from deploy import reports as cli
    from policies.engines.roles import make_engine
    from policies.evaluation import lineage
    from policies.promotion.gate import gate_entries
    from policies.weights.model_store import BASE_VERSION, WeightsStore, ensure_base_model

    rows = lineage.lineage(events)
    served = [r for r in rows if r["gate"].startswith(("canary", "live"))]
    if a.max_versions and len(served) > a.max_versions:
        step = (len(served) - 1) / (a.max_versions - 1) if a.max_versions > 1 else 0
        served = [served[round(i * step)] for i in range(a.max_versions - 1)] + [served[-1]]
    per, cats = suite_args(a)
    envs = suite_envs(s, per)
    cache = cli.heldout_cache(s, envs, per, a.k, cats)
    store = WeightsStore(s.state)
    base = ensure_base_model(s.state, s.model.source, s.model.path, progress=False)
    s.model.torch_threads = a.score_threads
    host = {**(host or {}), "before_scoring": host_forward_s(base), "cpu": host_cpu()}  # (`host_forward_s`)
    engine = make_engine(s, base, role="eval")
    t0 = time.monotonic()
    for v in [BASE_VERSION] + [r["version"] for r in served]:
        if cache.get(v) is None:  # scored before on this suite (a rescore): the cache holds it
            engine.load_weights(store.file(v, base), v)
            cache.evaluate(engine, envs, v, batch=a.score_batch)
        print(
            f"scored {v} in {time.monotonic() - t0:.0f}s: "
            + json.dumps({e: round(x["avg"], 3) for e, x in cache.get(v).items()}),
            flush=True,
        )
    held = {r["version"]: cache.versus(BASE_VERSION, r["version"]) for r in served}
    seen = gate_entries(envs, s.gate)  # the gate chose what was served by these: the same test without them
    unseen = {r["version"]: cache.versus(BASE_VERSION, r["version"], exclude=seen) for r in served}
    base_scores = cache.get(BASE_VERSION)
    print(lineage.table(rows, held, base_scores))
    shares = learner[-1].metrics if learner else {}
    newest = served[-1]["version"] if served else None
    stages = {
        key: _p50([r[key] for r in rows if r[key] is not None])
        for key in ("step_s", "published_after_s", "gate_s", "served_after_s")
    }
    out = {
        "minutes": a.minutes,
        "k": a.k,
        "per_category": a.per_category,
        "categories": cats,
        "suite": cache.entries,
        "cycle_p50_s": stages,
        "wall_s": round(wall_s) if wall_s else None,
        "users": stats,
        "learner_steps": len(learner),
        "informative_own_share": shares.get("informative_own_share"),
        "informative_share": shares.get("informative_share"),
        "rollout_groups": shares.get("rollout_groups"),
        # groups dropped as stale up to the last step, all and the users' (rated or next-turn) live steps among them
        "dropped_stale": {"groups": shares.get("dropped_stale_groups"), "live": shares.get("dropped_stale_live")},
        "lineage": rows,
        "base": base_scores,
        "scores": {v: cache.get(v) for v in held},
        "versus_base": held,
        "newest_served": newest,
        "newest_vs_base": held.get(newest, {}),
        "gate_entries": sorted(seen),
        "versus_base_unseen_by_gate": unseen,
        "newest_vs_base_unseen_by_gate": unseen.get(newest, {}),
        "state_dir": str(state),
        "score_s": round(time.monotonic() - t0),
        "host_forward_s": host,
        **learner_detail(events, learner),
    }
    out_file = Path(out_path).with_suffix(".json")
    out_file.parent.mkdir(parents=True, exist_ok=True)
    out_file.write_text(json.dumps(out, indent=1))
    if base_scores:
        lineage.curve(served, held, base_scores, Path(out_path).with_suffix(".png"))
    if not a.keep_weights:  # an hour writes ~50 versions; the scored ones (and the stream) stay for a rescore
        scored = {v for v in cache.versions}
        for f in (state / "weights").glob("w-*.safetensors"):
            if f.name.split(".")[0] not in scored:
                f.unlink(missing_ok=True)
        for f in (state / "learner").glob("ckpt-*.pt"):  # 1.6 GB each on the CPU model; a rescore needs none
            f.unlink(missing_ok=True)
    print(
        f"cycle p50: published {stages['published_after_s']} s, served {stages['served_after_s']} s after the "
        f"oldest judged group a version learned from; learner step {stages['step_s']} s, gate (published -> "
        f"decided) {stages['gate_s']} s"
    )
    for c in out["guard_checks"]:
        print(
            f"  guard at {c['minute']:5.1f} min: {c['version']} {c['verdict']} ({100 * c['delta']:+.1f} points, "
            f"p={c['p_value']:.4f}, {c['entries']} entries, {c['duration_s']} s)"
        )
    for r in out["rollbacks"]:
        print(f"  rollback at {r['minute']:5.1f} min: {r['from']} -> {r['to']}: {r['reason'][:160]}")
    print(
        f"learner steps {len(learner)}; served versions {len(served)}; informative groups own "
        f"{shares.get('informative_own_share')}, with references {shares.get('informative_share')}"
    )
    for env, d in out["newest_vs_base"].items():
        print(
            f"newest served {newest} vs base on {env}: {100 * d['base_avg']:.1f}% -> {100 * d['avg']:.1f}% "
            f"({100 * d['delta']:+.1f} points, paired p={d['p_value']:.4f}, +{d['wins']}/-{d['losses']})"
        )
    for d in out["newest_vs_base_unseen_by_gate"].values():
        print(
            f"  without the {len(seen)} entries the gate looks at ({d['n']} left): {100 * d['base_avg']:.1f}% -> "
            f"{100 * d['avg']:.1f}% ({100 * d['delta']:+.1f} points, p={d['p_value']:.4f}, "
            f"+{d['wins']}/-{d['losses']})"
        )
    print(f"written {out_file} and .png", flush=True)
    return out
