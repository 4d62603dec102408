"""The bus against a real nats-server: dedup, durable consumers, ack / nak / term + dead letter, restarts."""

import asyncio
import uuid

import pytest
from nats.js.errors import NoStreamResponseError

from actors.actor import HOLD, EventActor
from actors.bus import Bus, Poison, Transient
from actors.events import DeadLetter, parse_event
from actors.task_events import Task
from deploy.nats import EmbeddedNats


def _prefix():
    return "t" + uuid.uuid4().hex[:8]


async def _bus(server, prefix):
    return await Bus(server.url, server.user, server.password, stream=prefix.upper(), prefix=prefix, producer="test").connect()


async def test_publish_is_deduplicated_by_event_id(nats_server):
    p = _prefix()
    bus = await _bus(nats_server, p)
    e = Task(task_id="t", env="bfcl", entry_id="x")
    a1, a2 = await bus.publish(e), await bus.publish(e)
    assert a1.seq == a2.seq and a2.duplicate
    info = await bus.stream_info()
    assert info.state.messages == 1
    await bus.close()


async def test_stored_events_are_read_on_from_a_sequence_in_stream_order(nats_server):
    """What `report` and the live page fold: stored events by sequence, in pieces, filtered by kind."""
    p = _prefix()
    bus = await _bus(nats_server, p)
    assert await bus.stored_since(0, 10) == ([], 0)  # an empty stream
    for i in range(5):
        await bus.publish(Task(task_id=f"t{i}", env="code", entry_id=f"e{i}"))
        await bus.publish(DeadLetter(subject="x", consumer="c", reason=f"r{i}"))
    first, seq = await bus.stored_since(0, 4, kinds=("task",))
    assert seq == 4 and [parse_event(d).task_id for _, d in first] == ["t0", "t1"]
    rest, seq = await bus.stored_since(seq, 100)
    assert seq == 10 and [s.rsplit(".", 1)[1] for s, _ in rest] == ["task", "dead_letter"] * 3
    assert await bus.stored_since(seq, 100) == ([], 10)
    await bus.close()


class Recorder(EventActor):
    name = "recorder"
    kinds = ("task",)
    nak_delay_s = 0.1

    def __init__(self, settings, bus):
        super().__init__(settings, bus)
        self.seen, self.fail_first = [], set()

    async def handle_task(self, ev, msg):
        self.seen.append(ev.entry_id)
        if ev.entry_id == "poison":
            raise Poison("bad entry")
        if ev.entry_id in self.fail_first:
            self.fail_first.discard(ev.entry_id)
            raise Transient("try again")
        if ev.entry_id == "hold":
            await msg.ack_sync()
            return HOLD


async def _drain(actor, rounds=30):
    for _ in range(rounds):
        await actor._once()


async def test_actor_loop_acks_naks_and_dead_letters(settings, nats_server):
    p = _prefix()
    settings.nats.max_deliver = 3
    bus = await _bus(nats_server, p)
    actor = Recorder(settings, bus)
    actor.fetch_timeout_s = 0.2
    actor._sub = await bus.pull("recorder", ["task"], ack_wait_s=5, max_deliver=3)
    actor.fail_first = {"flaky"}
    for entry in ("ok", "flaky", "poison", "hold"):
        await bus.publish(Task(task_id=entry, env="bfcl", entry_id=entry))
    await bus.js.publish(f"{p}.task", b"{not json", headers={"Nats-Msg-Id": "garbage"})
    await _drain(actor)
    assert actor.seen.count("ok") == 1 and actor.seen.count("flaky") == 2 and actor.seen.count("poison") == 1
    dl_sub = await bus.js.pull_subscribe(f"{p}.dead_letter", durable="dl", stream=p.upper())
    dls = [parse_event(m.data) for m in await dl_sub.fetch(10, timeout=2)]
    assert all(isinstance(d, DeadLetter) for d in dls)
    reasons = sorted(d.reason for d in dls)
    assert len(dls) == 2 and any("bad entry" in r for r in reasons) and any("invalid event" in r for r in reasons)
    info = await bus.consumer_info("recorder")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    # redelivery of an applied event is skipped (idempotent by event_id)
    again = Task(task_id="ok", env="bfcl", entry_id="ok")
    actor.applied.add(again.event_id)
    await bus.publish(again)
    await _drain(actor, 5)
    assert actor.seen.count("ok") == 1
    await bus.close()


async def test_durable_consumer_survives_server_restart(tmp_path):
    server = EmbeddedNats(tmp_path / "s").start()
    p = _prefix()
    try:
        bus = await _bus(server, p)
        for i in range(10):
            await bus.publish(Task(task_id=str(i), env="bfcl", entry_id=str(i)))
        sub = await bus.pull("c", ["task"])
        first = await sub.fetch(5, timeout=2)
        for m in first:
            await m.ack_sync()
        await bus.close()
        server.proc.kill()  # kill -9 of the server: acked state must survive
        server.proc.wait()
        server.start()
        bus = await _bus(server, p)
        sub = await bus.pull("c", ["task"])
        rest = await sub.fetch(10, timeout=3)
        got = sorted(int(parse_event(m.data).entry_id) for m in rest)
        # nothing unacked is lost; an acked one may come back: nats-server writes consumer state to disk
        # asynchronously, and after a kill -9 the ack floor can fall back (nats-server #8036). Delivery is at
        # least once; handlers are idempotent by event id (AppliedIds), so a comeback has no effect.
        assert {5, 6, 7, 8, 9} <= set(got) and set(got) <= set(range(10)), got
        await bus.close()
    finally:
        server.stop()


async def test_request_reply_round_trip_and_remote_error(nats_server):
    from actors.events import RetrievedExperience, RetrieveReply, RetrieveRequest

    p = _prefix()
    bus = await _bus(nats_server, p)

    async def handler(req: RetrieveRequest):
        if req.query == "boom":
            raise ValueError("kaput")
        return RetrieveReply(experiences=[RetrievedExperience(experience_id="e", text=req.query, score=1.0)])

    await bus.serve_rpc("retrieve", RetrieveRequest, handler)
    r = await bus.request("retrieve", RetrieveRequest(query="hi"), RetrieveReply)
    assert r.experiences[0].text == "hi"
    with pytest.raises(RuntimeError, match="kaput"):
        await bus.request("retrieve", RetrieveRequest(query="boom"), RetrieveReply)
    await bus.close()


async def test_trace_context_rides_in_headers(settings, nats_server):
    from config import telemetry

    telemetry.setup("test")
    p = _prefix()
    bus = await _bus(nats_server, p)
    actor = Recorder(settings, bus)
    actor.name = "tracer"
    actor.fetch_timeout_s = 0.2
    actor._sub = await bus.pull("tracer", ["task"])
    with telemetry.tracer().start_as_current_span("http.request") as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
        ev = Task(task_id="x", env="bfcl", entry_id="traced")
        await bus.publish(ev)
    assert ev.trace_id == trace_id
    await _drain(actor, 3)
    handled = [s for s in telemetry.memory_spans().get_finished_spans() if s.name == "tracer.handle_task"]
    assert handled and format(handled[-1].context.trace_id, "032x") == trace_id
    await bus.close()


async def test_outbox_keeps_events_through_a_server_kill_and_drains_once(tmp_path):
    """kill -9 of nats-server while events are produced: the outbox keeps them, `revive` restarts the
    server on the same port and store, the connected client reconnects and the outbox drains: every
    event on the stream exactly once, including ones published twice around the outage."""
    import structlog

    from actors.events import Feedback
    from serve.outbox import Outbox

    server = EmbeddedNats(tmp_path / "s").start()
    p = _prefix()
    box = Outbox(tmp_path / "outbox.db")
    try:
        bus = await _bus(server, p)
        events = [Feedback(interaction_id=f"i{i}", score=1.0) for i in range(6)]
        for e in events[:2]:
            box.put(e, {})
        assert await box.drain_once(bus) == 2 and box.size() == 0
        box.put(events[1], {})  # published again (a retry after a lost ack): JetStream drops it
        server.proc.kill()
        server.proc.wait()
        for e in events[2:]:
            box.put(e, {})
        assert await box.drain_once(bus, timeout_s=0.5) == 0 and box.size() == 5  # down: nothing lost
        assert server.revive() is not None and server.alive() and server.restarts == 1
        task = asyncio.create_task(box.run(lambda: asyncio.sleep(0, bus), structlog.get_logger(), every_s=0.2))
        for _ in range(100):
            if box.size() == 0:
                break
            await asyncio.sleep(0.1)
        task.cancel()
        assert box.size() == 0
        info = await bus.stream_info()
        assert info.state.messages == 6
        sub = await bus.js.subscribe(f"{p}.>", ordered_consumer=True)
        got = [parse_event((await sub.next_msg(timeout=2)).data).event_id for _ in range(6)]
        assert sorted(got) == sorted(e.event_id for e in events)
        await bus.close()
    finally:
        server.stop()


async def test_stream_takes_only_known_kinds_and_keeps_its_limits(nats_server):
    from actors.events import KINDS, subjects_of

    p = _prefix()
    bus = await Bus(
        nats_server.url,
        nats_server.user,
        nats_server.password,
        stream=p.upper(),
        prefix=p,
        producer="test",
        max_age_s=3600,
        max_bytes=64 * 1024,
    ).connect()
    for bogus in (f"{p}.bogus_kind", f"{p}.a.b.c", f"{p}.interaction.a.b", f"{p}.task.x"):
        with pytest.raises(NoStreamResponseError):  # no stream listens there: nothing is stored
            await bus.js.publish(bogus, b"{}", timeout=1)
    big = "x" * 4000
    for i in range(40):  # ~160 KB into a 64 KB stream: the oldest go
        await bus.publish(Task(task_id=str(i), env="bfcl", entry_id=str(i), query=big))
    info = await bus.stream_info()
    assert sorted(info.config.subjects) == sorted(s for k in KINDS for s in subjects_of(k, p))
    assert f"{p}.interaction.*" in info.config.subjects  # one subject per interaction (`Bus.interaction`)
    assert info.config.max_age == pytest.approx(3600) and info.config.max_bytes == 64 * 1024
    assert info.state.bytes <= 64 * 1024 and info.state.first_seq > 1 and info.state.last_seq == 40
    sub = await bus.js.subscribe(f"{p}.>", ordered_consumer=True)  # `main.py events` still follows everything
    assert parse_event((await sub.next_msg(timeout=2)).data).kind == "task"
    looser = await Bus(
        nats_server.url,
        nats_server.user,
        nats_server.password,
        stream=p.upper(),
        prefix=p,
        producer="test",
        max_age_s=7200,
        max_bytes=-1,
    ).connect()  # a new setting updates it
    info = await looser.stream_info()
    assert info.config.max_age == pytest.approx(7200) and info.config.max_bytes == -1
    await bus.close()
    await looser.close()


async def test_a_durable_consumer_that_reads_more_kinds_keeps_its_place(nats_server):
    """A release whose actor reads one more kind (the attributor reading interactions) updates the durable's filter;
    what it had acked stays acked."""
    from actors.events import Feedback

    p = _prefix()
    bus = await _bus(nats_server, p)
    await bus.publish(Task(task_id="t1", env="bfcl", entry_id="a"))
    sub = await bus.pull("reader", ["task"])
    (m,) = await sub.fetch(1, timeout=5)
    await m.ack_sync()
    await bus.publish(Feedback(interaction_id="i", score=1.0))
    await bus.publish(Task(task_id="t2", env="bfcl", entry_id="b"))
    sub = await bus.pull("reader", ["task", "feedback"])
    info = await bus.consumer_info("reader")
    assert set(info.config.filter_subjects) == {f"{p}.task", f"{p}.feedback"}
    got = [parse_event(x.data) for x in await sub.fetch(5, timeout=5)]
    assert [e.kind for e in got] == ["feedback", "task"] and got[1].entry_id == "b"
    await bus.close()
