"""The guard on a real nats-server with the real SmolLM2 and code held-out tasks: the broadcaster's background
thread scores the base, then the canary it is handed, and publishes `evo.heldout_scored`; full-suite scores land
in the held-out cache that `main.py report` reads."""

import asyncio
import time
import uuid

import torch
from test_broadcaster import _wait  # noqa: E402  (tests/integration is on sys.path)

from actors.bus import Bus
from actors.events import WeightsPublished, WeightsRef


async def test_the_canary_is_scored_against_the_base_in_the_background(settings, nats_server, model_dir):
    from safetensors.torch import load_file

    from actors.broadcaster import Broadcaster
    from policies.evaluation.heldout import HeldoutCache
    from policies.weights.model_store import WeightsStore

    p = "g" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.model.source, settings.model.path = "hf-folder", str(model_dir)
    settings.env.names = ["code"]
    settings.gate.heldout_tasks, settings.gate.nll_entries = 1, 2
    g = settings.guard
    g.enabled, g.suite, g.per_category, g.k, g.base_k, g.chunk_entries, g.early_fraction = (
        True,
        {"code": ["add"]},
        2,
        2,
        4,
        1,
        1.0,
    )
    g.alpha = 0.001  # the same weights twice: a false alarm at most 0.1% of the time
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    store = WeightsStore(settings.state)
    same = {k: v.to(torch.bfloat16) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    path, sha = store.save(same, "w-000001", {"parent": "w-000000", "step": 1})
    actor = Broadcaster(settings)
    task = asyncio.create_task(actor.run())
    try:
        t0 = time.monotonic()
        await bus.publish(
            WeightsPublished(weights=WeightsRef(version="w-000001", path=str(path), sha256=sha, parent="w-000000", step=1))
        )
        ev = await _wait(bus, p, "heldout_scored", lambda e: e.version == "w-000001", timeout=900)
        # the base's own weights again: scored on both entries (early_fraction 1), not below the base
        assert ev.env == "code" and ev.entries == ev.suite_entries == 2 and ev.k == 2 and "x4" in ev.reason
        assert ev.verdict == "not_below" and ev.reason.startswith("code ")
        assert 0.0 <= ev.avg <= 1.0 and 0.0 <= ev.base_avg <= 1.0 and ev.duration_s > 0
        assert actor.book.checks["w-000001"] == "not_below"
        cache = {
            k: HeldoutCache(
                settings.state / "evals" / "heldout.json",
                actor.guard.suite,
                k=k,
                temperature=settings.rollout.temperature,
                call_prefix=settings.rollout.call_prefix,
                max_new_tokens=settings.rollout.max_new_tokens,
            )
            for k in (2, 4)
        }
        assert cache[4].get("w-000000") is not None and cache[2].get("w-000000") is None  # the base at base_k
        assert len(cache[2].get("w-000001")["code"]["per_entry"]) == 2
        print(f"guard: base + one check of 2 entries x2 in {time.monotonic() - t0:.0f}s")
    finally:
        actor.stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()
