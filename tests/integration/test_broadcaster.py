"""The broadcaster on a real nats-server with the real SmolLM2 and BFCL held-out tasks:
- a candidate with noise added to its weights is rejected by the gate (reference likelihood);
- an unchanged candidate passes, serves as a canary, and goes live on equal feedback;
- a bad version forced live by an operator is rolled back automatically when users' feedback drops;
every state change is an `evo.weights_status` event and the LIVE pointer follows."""

import asyncio
import time
import uuid

import pytest
import torch

from actors.bus import Bus
from actors.events import ChatMessage, Feedback, Interaction, WeightsPublished, WeightsRef, parse_event


def _feedback(version: str, score: float) -> Feedback:
    iid = f"chatcmpl-{uuid.uuid4().hex}"
    it = Interaction(
        interaction_id=iid,
        user_hash="u",
        messages=[ChatMessage(role="user", content="hi")],
        response=ChatMessage(role="assistant", content="hello"),
        weights_version=version,
    )
    return Feedback(interaction_id=iid, score=score, interaction=it)


async def _wait(bus, prefix, kind, pred, timeout=600):
    """The first event of `kind` on the stream (from its start) that satisfies `pred`."""
    from nats.js import api

    sub = await bus.js.subscribe(
        f"{prefix}.{kind}", ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    )
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                ev = parse_event((await sub.next_msg(timeout=1.0)).data)
            except (TimeoutError, asyncio.TimeoutError):
                continue
            if pred(ev):
                return ev
    finally:
        await sub.unsubscribe()
    pytest.fail(f"no {kind} event as expected")


def _wait_status(bus, prefix, version, statuses):
    return _wait(bus, prefix, "weights_status", lambda e: e.version == version and e.status in statuses)


async def test_gate_canary_and_rollback(settings, nats_server, model_dir):
    from actors.broadcaster import Broadcaster
    from policies.weights.model_store import WeightsStore

    p = "b" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.model.source, settings.model.path = "hf-folder", str(model_dir)
    settings.env.names = ["bfcl"]
    g = settings.gate
    g.heldout_tasks, g.nll_entries, g.canary_share, g.canary_min_feedback, g.watch_feedback = 1, 6, 0.5, 3, 4
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    store = WeightsStore(settings.state)
    from safetensors.torch import load_file

    base = {k: v.to(torch.bfloat16) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    torch.manual_seed(0)
    noisy = {
        k: (v.float() + 0.05 * v.float().std() * torch.randn_like(v.float())).to(torch.bfloat16) if v.ndim == 2 else v
        for k, v in base.items()
    }

    def publish(version, sd, parent="w-000000", force=False):
        path, sha = store.save(sd, version, {"parent": parent, "step": int(version[2:])})
        return bus.publish(
            WeightsPublished(
                weights=WeightsRef(version=version, path=str(path), sha256=sha, parent=parent, step=int(version[2:])), force=force
            )
        )

    actor = Broadcaster(settings)
    task = asyncio.create_task(actor.run())
    try:
        # 1) noise added: rejected by the reference likelihood
        await publish("w-000001", noisy)
        ev = await _wait_status(bus, p, "w-000001", {"rejected", "canary"})
        assert ev.status == "rejected" and "reference NLL" in ev.reason, ev.reason
        assert ev.metrics["candidate_nll"] > ev.metrics["live_nll"] + g.nll_tolerance
        await _wait(bus, p, "weights_rejected", lambda e: e.weights.version == "w-000001")
        assert store.live().version == "w-000000"

        # 2) an unchanged candidate: canary on half the traffic, then live on equal feedback
        await publish("w-000002", base)
        ev = await _wait_status(bus, p, "w-000002", {"canary", "rejected"})
        assert ev.status == "canary", ev.reason
        live = store.live()
        assert live.version == "w-000000" and live.canary.version == "w-000002"
        assert live.canary.share == 0.5
        await _wait(bus, p, "weights_promoted", lambda e: e.stage == "canary" and e.weights.version == "w-000002")
        for _ in range(3):
            await bus.publish(_feedback("w-000002", 1.0))
            await bus.publish(_feedback("w-000000", 1.0))
        await _wait_status(bus, p, "w-000002", {"live"})
        assert store.live().version == "w-000002" and store.live().canary is None
        await _wait(bus, p, "weights_promoted", lambda e: e.stage == "live" and e.weights.version == "w-000002")
        for _ in range(4):  # w-000002 serves well while live
            await bus.publish(_feedback("w-000002", 1.0))

        # 3) the rejected noisy version forced live by an operator; users dislike it: rolled back to w-000002
        await bus.publish(WeightsPublished(weights=WeightsRef(**actor._ref("w-000001").model_dump()), force=True, reason="test"))
        await _wait_status(bus, p, "w-000001", {"live"})
        assert store.live().version == "w-000001"
        for _ in range(4):
            await bus.publish(_feedback("w-000001", -1.0))
        ev = await _wait_status(bus, p, "w-000001", {"rolled_back"})
        assert "live feedback dropped" in ev.reason
        await _wait(bus, p, "weights_rolled_back", lambda e: e.from_version == "w-000001" and e.to.version == "w-000002")
        assert store.live().version == "w-000002"
        assert actor.book.counts == {"promoted": 2, "rejected": 1, "rolled_back": 1}
    finally:
        actor.stop.set()
        await asyncio.wait_for(task, 60)
        await bus.close()
