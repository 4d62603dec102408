"""Held-out evaluation from the command line: `eval` (one version, avg@k / best@k per environment and
category) and `report` (the lineage of weights versions with held-out scores against the base, and the curve;
`report --json` prints the document the live page shows, built by the same code).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

from config.settings import Settings
from deploy.launch import say
from deploy.stream_view import connect


def heldout_cache(s: Settings, envs: dict, per_category, k: int, categories: dict | None = None):
    from policies.evaluation.heldout import HeldoutCache, suite

    return HeldoutCache(
        s.state / "evals" / "heldout.json",
        suite(envs, per_category, categories),
        k=k,
        temperature=s.rollout.temperature,
        max_new_tokens=s.rollout.max_new_tokens,
        call_prefix=s.rollout.call_prefix,
    )


async def evolution(s: Settings, run: dict) -> dict:
    """The document the live page shows (GET /page/state), folded from everything the stream holds by the same
    code as a replica folds it (`policies/evaluation/evolution.py`)."""
    from policies.evaluation.evolution import Evolution, catch_up

    bus = await connect(s, run)
    try:
        return (await catch_up(Evolution(), bus.stored_since)).view()
    finally:
        await bus.close()


def evaluated(s: Settings, rows: list[dict], args) -> tuple[dict, dict | None]:
    """This command's own held-out scores: version -> env -> paired test against the base, and the base's (None
    before any `--eval`); `--eval` scores the base and every served version not yet in the cache first."""
    from envs.registry import make_envs
    from policies.weights.model_store import BASE_VERSION, WeightsStore

    envs = make_envs(s.env)
    cache = heldout_cache(s, envs, args.per_category, args.k)
    served = [r["version"] for r in rows if r["gate"].startswith(("canary", "live"))]
    if args.eval:
        from policies.engines.roles import make_engine
        from policies.weights.model_store import ensure_base_model

        store = WeightsStore(s.state)
        base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
        engine = make_engine(s, base, role="eval")
        for v in [BASE_VERSION] + served:
            path = store.file(v, base)
            if cache.get(v) is None and path is not None and path.exists():
                say(f"evaluating {v} on the held-out suite (k={args.k})")
                engine.load_weights(path, v)
                cache.evaluate(engine, envs, v)
    return {r["version"]: cache.versus(BASE_VERSION, r["version"]) for r in rows}, cache.get(BASE_VERSION)


def report(s: Settings, run: dict, args) -> int:
    """The lineage of weights versions with the guard's checks against the base (the live page's document; `--json`
    prints it whole, and only it on stdout), and this command's own scores (`--eval`) with their curve as PNG
    (under "evaluated" in the JSON)."""
    from policies.evaluation import lineage

    doc = asyncio.run(evolution(s, run))
    rows = doc["rows"]
    with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
        held, base_scores = evaluated(s, rows, args)
    if base_scores:
        doc["evaluated"] = {"heldout": held, "base": base_scores}
    out = s.state / "evals" / "lineage"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(lineage.table(rows, doc["heldout"], doc["base"]))
    if not doc["base"]:
        print("(no check by the guard yet: it scores served versions against the base in the background)")
    if not base_scores:
        print("(`main.py report --eval` scores the base and every served version on this command's own suite)")
        return 0
    print(f"\n`report --eval`: {args.k} samples, {args.per_category} entries of each category")
    print(lineage.table(rows, held, base_scores))
    lineage.curve(rows, held, base_scores, out.with_suffix(".png"))
    print(f"written {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0


def evaluate(s: Settings, args) -> int:
    """Held-out evaluation: avg@k / best@k per environment and category (AgentEvolver's table)."""
    from envs.registry import make_envs
    from policies.engines.roles import make_engine
    from policies.evaluation import report
    from policies.weights.model_store import BASE_VERSION, WeightsStore, ensure_base_model

    store = WeightsStore(s.state)
    base = ensure_base_model(s.state, s.model.source, s.model.path, progress=True)
    engine = make_engine(s, base, role="eval")
    version = args.version or store.live().version
    if version != BASE_VERSION:
        man = store.manifest(version)
        if man is None:
            sys.exit(f"unknown weights version {version!r} (see {store.dir})")
        engine.load_weights(man["path"], version)
    envs = make_envs(s.env)
    if args.env:
        if args.env not in envs:
            sys.exit(f"unknown environment {args.env!r}; configured: {', '.join(envs)}")
        envs = {args.env: envs[args.env]}

    def progress(name, i, n, eid, scores):
        print(f"  [{name} {i}/{n}] {eid}: {[round(x, 2) for x in scores]}", file=sys.stderr, flush=True)

    rows, result = report.heldout(
        engine,
        envs,
        k=args.k,
        per_category=args.n,
        max_new_tokens=s.rollout.max_new_tokens,
        temperature=0.0 if args.k == 1 else s.rollout.temperature,
        call_prefix=s.rollout.call_prefix,
        progress=progress,
    )
    print(report.table(rows, version, args.k))
    out = s.state / "evals" / f"{version}-k{args.k}"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"version": version, "k": args.k, "envs": result}, indent=1))
    report.chart(rows, version, args.k, out.with_suffix(".png"))
    print(f"written {out.with_suffix('.json')} and {out.with_suffix('.png')}")
    return 0
