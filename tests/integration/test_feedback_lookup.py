"""Feedback finds the interaction it rates from any replica: in the replica's outbox while it is pending, on the
stream by id once it was published, so a replica on another node, with an empty state dir, finds it too. While
the bus is down a pending interaction still takes feedback, and one that is not pending gets a 503, not a 404.
Real nats-server, the replica's real outbox and feedback code; no Ray, no model."""

import asyncio
import json
import time
import uuid

import pytest
from nats.js import api

from actors.bus import Bus
from actors.events import ChatMessage, Feedback, Interaction, RetrieveReply, parse_event
from config import telemetry
from deploy.nats import EmbeddedNats
from serve.feedback import LOOKUP_TIMEOUT_S, take_feedback
from serve.interactions import Turn
from serve.outbox import Outbox
from serve.schemas import ChatRequest


def _prefix():
    return "f" + uuid.uuid4().hex[:8]


async def _bus(server, prefix, ensure_stream=True):
    return await Bus(server.url, server.user, server.password, stream=prefix.upper(), prefix=prefix, producer="test").connect(
        ensure_stream=ensure_stream
    )


def answered(iid: str | None = None) -> Interaction:
    """The interaction a replica records for an answer (`Turn.interaction`, as `KaizenServer._record` makes it)."""
    iid = iid or f"chatcmpl-{uuid.uuid4().hex}"
    req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "2+2?"}]})
    turn = Turn(
        req=req, messages=[ChatMessage(role="user", content="2+2?")], tools=[], memory=RetrieveReply(), prompt="", iid=iid
    )
    return turn.interaction(ChatMessage(role="assistant", content="4"), "w-000003", False, "replica-a", "key", b"s" * 32)


class Replica:
    """What a serve replica holds for feedback: an outbox in its own state dir, and its bus as `_ensure_bus` gives
    it (a connection, or the error of a first connect that failed)."""

    def __init__(self, state, ensure_bus):
        self.outbox = Outbox(state / "serve" / "outbox.db")
        self.ensure_bus = ensure_bus

    async def feedback(self, interaction_id: str, score: float = 1.0, comment: str | None = None):
        body = {"interaction_id": interaction_id, "score": score, "comment": comment}
        r = await take_feedback(body, self.outbox, self.ensure_bus, telemetry.tracer("test"), telemetry.log())
        return r.status_code, json.loads(r.body)


async def _stored(bus, kind: str) -> list:
    msgs, _ = await bus.stored_since(0, 1000, kinds=(kind,))
    return [parse_event(data) for _, data in msgs]


async def test_a_replica_on_another_node_finds_a_published_interaction_and_feedback_is_idempotent(nats_server, tmp_path):
    p = _prefix()
    bus_a, bus_b = await _bus(nats_server, p), await _bus(nats_server, p, ensure_stream=False)
    a = Replica(tmp_path / "a", lambda: asyncio.sleep(0, bus_a))
    it = answered()
    a.outbox.put(it)
    assert await a.outbox.drain_once(bus_a) == 1 and a.outbox.size() == 0  # acked: now only the stream has it

    b = Replica(tmp_path / "b", lambda: asyncio.sleep(0, bus_b))  # another node: its state dir holds nothing
    assert not list((tmp_path / "b" / "serve").glob("interactions*"))
    status, body = await b.feedback(it.interaction_id, 0.5, "right")
    assert status == 202 and body["status"] == "accepted"
    again = await b.feedback(it.interaction_id, 0.5, "right")
    assert again == (202, body) and b.outbox.size() == 1  # identical feedback: one event
    assert await b.outbox.drain_once(bus_b) == 1
    assert await b.feedback(it.interaction_id, 0.5, "right") == (202, body)
    assert await b.outbox.drain_once(bus_b) == 1  # published again: JetStream's duplicate window drops it

    (fb,) = await _stored(bus_a, "feedback")
    assert isinstance(fb, Feedback) and fb.event_id == body["event_id"] and fb.interaction is None  # no second copy
    assert (fb.interaction_id, fb.score, fb.comment, fb.weights_version) == (it.interaction_id, 0.5, "right", "w-000003")
    assert await bus_a.interaction(fb.interaction_id) == it  # what the attributor and the navigator read

    for unknown in (f"chatcmpl-{uuid.uuid4().hex}", "nope", "a.b", "evo.>"):
        status, body = await b.feedback(unknown)
        assert status == 404 and body["error"]["type"] == "not_found_error"
        assert body["error"]["message"].startswith("unknown interaction_id")
    await bus_a.close()
    await bus_b.close()


async def test_while_the_bus_is_down_a_pending_interaction_takes_feedback_and_others_get_503(tmp_path):
    server = EmbeddedNats(tmp_path / "nats").start()
    p = _prefix()
    try:
        bus = await _bus(server, p)
        published = answered()
        await bus.publish(published)
        replica = Replica(tmp_path / "replica", lambda: asyncio.sleep(0, bus))
        server.proc.kill()
        server.proc.wait()
        for _ in range(100):
            if not bus.connected:
                break
            await asyncio.sleep(0.05)
        assert not bus.connected
        pending = answered()
        replica.outbox.put(pending)  # answered during the outage: waits in the outbox

        status, body = await replica.feedback(pending.interaction_id, -1.0)
        assert status == 202 and replica.outbox.size() == 2
        for iid in (published.interaction_id, f"chatcmpl-{uuid.uuid4().hex}"):  # on the stream, or never served
            t0 = time.monotonic()
            status, err = await replica.feedback(iid)
            assert status == 503 and "unreachable" in err["error"]["message"] and time.monotonic() - t0 < 1.0

        async def never_connects():  # a replica that started while the bus was down (`_ensure_bus`)
            return await asyncio.wait_for(Bus(server.url, server.user, server.password).connect(False), 3.0)

        starting = Replica(tmp_path / "starting", never_connects)
        t0 = time.monotonic()
        status, err = await starting.feedback(published.interaction_id)
        assert status == 503 and "unreachable" in err["error"]["message"]
        assert time.monotonic() - t0 < LOOKUP_TIMEOUT_S + 1

        assert server.revive() is not None
        for _ in range(100):
            if bus.connected:
                break
            await asyncio.sleep(0.1)
        assert await replica.outbox.drain_once(bus) == 2 and replica.outbox.size() == 0
        msgs, _ = await bus.stored_since(0, 100)
        assert [parse_event(d).kind for _, d in msgs] == ["interaction", "interaction", "feedback"]  # in order
        assert parse_event(msgs[-1][1]).event_id == body["event_id"]
        assert await bus.interaction(pending.interaction_id) == pending
        assert (await replica.feedback(published.interaction_id))[0] == 202  # the bus is back: found on the stream
        await bus.close()
    finally:
        server.stop()


async def test_a_stream_made_by_the_previous_release_gets_the_interaction_subjects(nats_server):
    """Its interactions were published on the bare `evo.interaction`, feedback with a copy of the interaction, and its
    durable consumers filter the bare subject. The new release migrates the stream and the filters: every
    interaction, old and new, still reaches the consumers, and old events still parse."""
    p = _prefix()
    old = await _bus(nats_server, p, ensure_stream=False)
    cfg = old.stream_config()
    cfg.subjects = [s for s in cfg.subjects if not s.endswith(".*")]  # the previous release's subjects
    await old.js.add_stream(cfg)
    before = answered()
    await old.js.publish(f"{p}.interaction", before.model_dump_json().encode())
    await old.js.publish(
        f"{p}.feedback", Feedback(interaction_id=before.interaction_id, score=1.0, interaction=before).model_dump_json().encode()
    )
    await old.js.add_consumer(
        p.upper(),
        api.ConsumerConfig(  # the durable as the previous release made it
            durable_name="attributor", ack_policy=api.AckPolicy.EXPLICIT, filter_subjects=[f"{p}.interaction", f"{p}.feedback"]
        ),
    )

    new = await _bus(nats_server, p)  # ensure_stream brings the stream to this release's subjects
    assert f"{p}.interaction.*" in (await new.stream_info()).config.subjects
    after = answered()
    await new.publish(after)
    sub = await new.pull("attributor", ["interaction", "feedback"])
    got = [parse_event(m.data) for m in await sub.fetch(3, timeout=5)]
    assert [e.kind for e in got] == ["interaction", "feedback", "interaction"]
    assert got[1].interaction == before and got[2] == after
    assert await new.interaction(after.interaction_id) == after
    assert [e.interaction_id for e in await _stored(new, "interaction")] == [before.interaction_id, after.interaction_id]
    await old.close()
    await new.close()


async def test_the_attributor_and_the_navigator_read_the_rated_interaction_by_id(settings, nats_server, tmp_path):
    """Feedback that names its interaction is judged and counted as one that carried a copy of it (earlier
    releases); one whose interaction is not on the stream is poison for the attributor. (Each is judged by an
    attributor of its own: one attributor trains one rating of an interaction, `test_rated_live.py`.)"""
    from actors.attributor import Attributor
    from actors.bus import Poison
    from actors.events import Judgement
    from actors.navigator import Navigator
    from policies.judge.judge import Agreement, Budget, make_judge

    p = _prefix()
    bus = await _bus(nats_server, p)
    it = answered().model_copy(update={"experience_ids": ["x1"]})
    await bus.publish(it)
    settings.judge.base_url = "http://127.0.0.1:9"  # never asked: its budget is spent, so the user's score decides
    a = Attributor(settings, bus=bus)
    a.judge, a.budget, a.agreement = make_judge(settings), Budget(0), Agreement()
    a.budget.tokens = 0.0
    a.stats = {"judged": 0, "fallback_budget": 0, "fallback_error": 0, "fallback_malformed": 0, "screened": 0}
    named = Feedback(interaction_id=it.interaction_id, score=-1.0)
    carried = Feedback(interaction_id=it.interaction_id, score=-1.0, interaction=it)
    await a.handle_feedback(named, None)
    other_release = settings.model_copy(deep=True)
    other_release.state_dir = str(tmp_path / "other")
    b = Attributor(other_release, bus=bus)
    b.judge, b.budget, b.agreement, b.stats = a.judge, a.budget, a.agreement, a.stats
    await b.handle_feedback(carried, None)
    one, other = await _stored(bus, "judgement")
    assert isinstance(one, Judgement) and one.source_event_ids == [named.event_id, it.event_id]
    same = ("samples", "outcomes", "step_labels", "judge", "user_hashes", "weights_version", "behaviour_versions")
    assert [getattr(one, f) for f in same] == [getattr(other, f) for f in same]
    assert one.weights_version == "w-000003" and one.step_labels == [["BAD"]] and one.samples[0].messages[-1].content == "4"
    with pytest.raises(Poison, match="not on the stream"):
        await a.handle_feedback(Feedback(interaction_id=f"chatcmpl-{uuid.uuid4().hex}", score=1.0), None)

    n = Navigator(settings, bus=bus)
    n.uses, n._dirty = {}, False
    await n.handle_feedback(named, None)
    await n.handle_feedback(carried.model_copy(update={"score": 1.0}), None)
    await n.handle_feedback(Feedback(interaction_id="gone", score=1.0), None)  # not on the stream: nothing to count
    assert n.uses == {"x1": [2, 1]}
    await bus.close()
