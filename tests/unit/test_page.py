"""The live page's side in a replica (serve/page.py): its files, the key on its data, the state it serves (the
report's document), and the event stream: SSE framing, a bounded queue per client, heartbeats, unsubscribe on
disconnect, 4xx for bad input. A stand-in bus holds stored events; no Ray, no NATS."""

import asyncio
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient
from test_evolution import _stored, history

from policies.evaluation.evolution import Evolution
from serve import page as P
from serve.wire import answer_errors


class _Sub:
    def __init__(self, nc, subject, cb):
        self.nc, self.subject, self.cb = nc, subject, cb

    async def unsubscribe(self):
        self.nc.subs.remove(self)


class _NC:
    def __init__(self):
        self.subs = []

    async def subscribe(self, subject, cb):
        self.subs.append(_Sub(self, subject, cb))
        return self.subs[-1]

    async def publish(self, subject, data: bytes):
        for s in list(self.subs):
            if s.subject == subject or (s.subject.endswith(".>") and subject.startswith(s.subject[:-1])):
                await s.cb(type("Msg", (), {"subject": subject, "data": data}))


class _Bus:
    """What the page uses of actors.bus.Bus: stored events by sequence, and the NATS connection."""

    def __init__(self, stored):
        self.stored, self.nc = stored, _NC()

    async def stored_since(self, seq, limit, kinds):
        return self.stored[seq : seq + limit], min(len(self.stored), seq + limit)


def _app(bus):
    app = FastAPI()
    app.include_router(P.router)
    answer_errors(app)
    page = P.Page("sekrit", "evo")

    async def ensure_bus():
        return bus

    @app.get("/page/state")
    async def state(request: Request):
        return await page.state(request, ensure_bus)

    @app.get("/page/events")
    async def events(request: Request):
        return await page.events(request, ensure_bus)

    return app, page


KEY = {"Authorization": "Bearer sekrit"}


def test_shell_is_public_data_needs_the_key_and_is_the_reports_document():
    stored = _stored(history())
    client = TestClient(_app(_Bus(stored))[0])
    shell = client.get("/page")
    assert shell.status_code == 200 and "uPlot.iife.min.js" in shell.text
    assert "script-src 'self'" in shell.headers["content-security-policy"]
    assert client.get("/page/static/uPlot.iife.min.js").text.startswith("/*! https://github.com/leeoniya/uPlot")
    for bad in ("../app.py", "page.py", "nope.js"):
        r = client.get(f"/page/static/{bad}")
        assert r.status_code == 404 and r.json()["error"]["message"], bad
    assert client.get("/page/state").status_code == 401
    assert client.get("/page/state", headers={"Authorization": "Bearer wrong"}).status_code == 401
    got = client.get("/page/state", headers=KEY).json()
    want = Evolution()
    want.feed(stored, len(stored))
    assert got == json.loads(json.dumps(want.view()))  # what `main.py report --json` prints from the same stream


def test_events_bad_input_is_a_4xx():
    client = TestClient(_app(_Bus([]))[0])
    assert client.get("/page/events").status_code == 401
    r = client.get("/page/events?kinds=weights_status,nope", headers=KEY)
    assert r.status_code == 400 and r.json()["error"]["param"] == "kinds" and "nope" in r.json()["error"]["message"]
    assert client.get("/page/events?kinds=", headers=KEY).status_code == 400


def test_frames():
    assert P.frame("weights_status", '{"a": 1}') == 'event: weights_status\ndata: {"a": 1}\n\n'
    assert P.frame("x", "one\r\ntwo\nthree") == "event: x\ndata: one\ndata: two\ndata: three\n\n"


def test_a_slow_client_loses_events_and_never_grows():
    feed = P.Feed(max_events=3, max_bytes=10)
    for i in range(5):
        feed.put("k", str(i))
    assert len(feed.items) == 3 and feed.dropped == 2
    feed.put("k", "x" * 9)  # over the byte budget
    assert feed.dropped == 3 and feed.bytes == 3

    async def drain():
        return [await feed.next(1.0) for _ in range(3)] + [await feed.next(0.01)]

    assert asyncio.run(drain()) == [("k", "0"), ("k", "1"), ("k", "2"), None] and feed.bytes == 0


def test_stream_frames_heartbeats_drops_and_unsubscribes_on_disconnect():
    async def run():
        feed, calls = P.Feed(max_events=2), []

        async def start():
            calls.append("start")

        async def stop():
            calls.append("stop")

        gen = P.sse(feed, start, stop, heartbeat_s=0.05)
        assert await gen.__anext__() == ": kaizen events\n\n" and calls == ["start"]
        assert await gen.__anext__() == ": keep-alive\n\n"  # idle
        for i in range(3):
            feed.put("learner_step", json.dumps({"step": i}))
        got = [await gen.__anext__() for _ in range(3)]
        assert got[0].startswith("event: dropped\n") and json.loads(got[0].split("data: ")[1]) == {"dropped": 1, "total": 1}
        assert got[1:] == [P.frame("learner_step", '{"step": 0}'), P.frame("learner_step", '{"step": 1}')]
        await gen.aclose()  # the client went away
        assert calls == ["start", "stop"]

    asyncio.run(run())


def test_a_page_gets_its_own_subscription_until_it_disconnects_and_at_most_max_streams():
    async def run():
        bus = _Bus([])
        _, page = _app(bus)
        req = Request(
            {
                "type": "http",
                "method": "GET",
                "path": "/page/events",
                "query_string": b"",
                "headers": [(b"authorization", b"Bearer sekrit")],
            }
        )

        async def ensure_bus():
            return bus

        resp = await page.events(req, ensure_bus)
        body = resp.body_iterator
        assert await body.__anext__() == ": kaizen events\n\n" and [s.subject for s in bus.nc.subs] == ["evo.>"]
        await bus.nc.publish("evo.heldout_scored", b'{"event_id": "e1", "version": "w-000001"}')
        assert await body.__anext__() == 'event: heldout_scored\ndata: {"event_id": "e1", "version": "w-000001"}\n\n'
        await bus.nc.publish("evo.interaction.chatcmpl-1", b'{"event_id": "e2"}')  # named by its kind, not its id
        assert await body.__anext__() == 'event: interaction\ndata: {"event_id": "e2"}\n\n'
        page.streams = P.MAX_STREAMS
        busy = await page.events(req, ensure_bus)
        assert busy.status_code == 429 and busy.headers["retry-after"] == "10"
        await body.aclose()
        assert bus.nc.subs == [] and page.streams == P.MAX_STREAMS - 1
        body = (await page.events(req, ensure_bus)).body_iterator  # a disconnect while it waits cancels the wait
        await body.__anext__()
        waiting = asyncio.ensure_future(body.__anext__())
        await asyncio.sleep(0.01)
        assert len(bus.nc.subs) == 1
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert bus.nc.subs == [] and page.streams == P.MAX_STREAMS - 1

    asyncio.run(run())


def test_kinds_narrow_the_subscription():
    async def run():
        bus = _Bus([])
        _, page = _app(bus)
        req = Request(
            {
                "type": "http",
                "method": "GET",
                "path": "/page/events",
                "query_string": b"kinds=weights_status,heldout_scored,interaction",
                "headers": [(b"authorization", b"Bearer sekrit")],
            }
        )

        async def ensure_bus():
            return bus

        body = (await page.events(req, ensure_bus)).body_iterator
        await body.__anext__()
        assert [s.subject for s in bus.nc.subs] == [
            "evo.weights_status",
            "evo.heldout_scored",
            "evo.interaction",
            "evo.interaction.*",
        ]  # an interaction has a subject of its own
        await body.aclose()

    asyncio.run(run())
