"""The live page of the evolution, served by each replica: a static shell, its data, and the live event stream.

- GET /page and GET /page/static/{name}: the shell (HTML, JS, CSS and the vendored uPlot, `serve/static/`). They
  hold no data, so they are public, like /healthz: a browser cannot send a header with a plain navigation. The
  page takes the API key from the URL fragment (`/page#key=...`; a fragment never leaves the browser in a
  request), keeps it in sessionStorage, removes it from the address bar, and sends it as `Authorization: Bearer`
  on every data request. A strict Content-Security-Policy keeps the shell to its own scripts and origin.
- GET /page/state (key): `policies.evaluation.evolution.Evolution.view()`, the document `main.py report --json` prints; the
  replica folds the stored stream once, then only what was stored since (`Bus.stored_since`), on each request.
- GET /page/events[?kinds=a,b] (key): server-sent events from `<prefix>.>` over plain NATS, each event's own
  JSON as `data:` with its kind as the SSE `event:` name. A client gets its own NATS subscription, dropped when
  it disconnects, and a bounded queue (QUEUE_EVENTS events, QUEUE_BYTES bytes): a slow client loses events (a
  `dropped` event says how many) and never holds the replica back or grows its memory. A comment every
  HEARTBEAT_S keeps proxies from closing an idle stream. A stream holds one of the replica's
  `max_ongoing_requests` for as long as it is open, so a replica takes at most MAX_STREAMS (429 beyond: users
  first). The page reads it with fetch() (EventSource cannot send the key).
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse

from actors.events import KINDS as EVENT_KINDS
from actors.events import kind_of, subjects_of
from policies.evaluation.evolution import Evolution, catch_up
from serve.net import authorized, unauthorized
from serve.wire import error

STATIC = Path(__file__).parent / "static"
FILES = {
    "page.html": "page.html",
    "page.js": "page.js",
    "page.css": "page.css",
    "uPlot.iife.min.js": "vendor/uplot/uPlot.iife.min.js",
    "uPlot.min.css": "vendor/uplot/uPlot.min.css",
}
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
QUEUE_EVENTS, QUEUE_BYTES, HEARTBEAT_S, MAX_STREAMS = 256, 1 << 20, 15.0, 4

router = APIRouter()


@router.get("/page")
async def shell():
    return asset("page.html")


@router.get("/page/static/{name}")
async def static(name: str):
    return asset(name)


def asset(name: str):
    """A file of the shell by its name (a fixed list: no paths from the request reach the file system)."""
    if name not in FILES:
        return error(404, f"no page file {name!r}; the page is at /page", "not_found_error")
    path = STATIC / FILES[name]
    return FileResponse(
        path,
        media_type=TYPES[path.suffix],
        headers={
            "Content-Security-Policy": CSP,
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
            "Cache-Control": "no-cache",
        },
    )


def kinds_param(raw: str | None) -> tuple[list[str] | None, JSONResponse | None]:
    """`?kinds=a,b` -> (the kinds, None), or (None, a 400 naming what is unknown); absent -> every kind."""
    if raw is None:
        return list(EVENT_KINDS), None
    kinds = list(dict.fromkeys(k.strip() for k in raw.split(",") if k.strip()))
    unknown = [k for k in kinds if k not in EVENT_KINDS]
    if unknown or not kinds:
        return None, error(
            400,
            f"unknown event kinds {unknown}; known: {', '.join(EVENT_KINDS)}"
            if unknown
            else "kinds is empty; leave it out for every kind",
            param="kinds",
        )
    return kinds, None


def frame(kind: str, data: str) -> str:
    """One SSE event; a payload with line breaks goes out as several `data:` lines (the client joins them)."""
    lines = data.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return f"event: {kind}\n" + "".join(f"data: {line}\n" for line in lines) + "\n"


class Feed:
    """One client's queue: `put` never blocks and drops what does not fit (counted); `next` waits for an event."""

    def __init__(self, max_events: int = QUEUE_EVENTS, max_bytes: int = QUEUE_BYTES):
        self.max_events, self.max_bytes = max_events, max_bytes
        self.items: deque[tuple[str, str]] = deque()
        self.bytes = self.dropped = 0
        self._ready = asyncio.Event()

    def put(self, kind: str, data: str) -> None:
        if len(self.items) >= self.max_events or self.bytes + len(data) > self.max_bytes:
            self.dropped += 1
            return
        self.items.append((kind, data))
        self.bytes += len(data)
        self._ready.set()

    async def next(self, timeout: float) -> tuple[str, str] | None:
        """The oldest queued event, or None after `timeout` seconds without one."""
        if not self.items:
            self._ready.clear()
            try:
                await asyncio.wait_for(self._ready.wait(), timeout)
            except TimeoutError:
                return None
        kind, data = self.items.popleft()
        self.bytes -= len(data)
        return kind, data


async def sse(feed: Feed, start, stop, heartbeat_s: float = HEARTBEAT_S):
    """The frames of one stream: events as they come, `dropped` after losses, a comment when idle. `start()` (the
    client's subscription) runs as the stream opens, `stop()` however it ends, a disconnect included."""
    try:
        await start()
        yield ": kaizen events\n\n"
        reported = 0
        while True:
            item = await feed.next(heartbeat_s)
            if feed.dropped > reported:
                yield frame("dropped", json.dumps({"dropped": feed.dropped - reported, "total": feed.dropped}))
                reported = feed.dropped
            yield ": keep-alive\n\n" if item is None else frame(*item)
    finally:
        await stop()


class Page:
    """A replica's side of the page: the folded stream (caught up on each request) and the open streams."""

    def __init__(self, key: str, prefix: str, log=None):
        self.key, self.prefix, self.log = key, prefix, log
        self.evolution = Evolution()
        self._lock = asyncio.Lock()
        self.streams = 0

    async def state(self, request: Request, ensure_bus):
        """GET /page/state: the document, after folding what the stream stored since the last request."""
        if not authorized(request, self.key):
            return unauthorized()
        try:
            bus = await ensure_bus()
            async with self._lock:  # one reader at a time; the fold runs in a thread, so view under the same lock
                await catch_up(self.evolution, bus.stored_since)
                return JSONResponse(await asyncio.to_thread(self.evolution.view))
        except Exception as exc:  # the bus is down or the stream unreadable: the page says so and retries
            if self.log is not None:
                self.log.warning("page.state_unavailable", error=repr(exc)[:200])
            return error(503, f"the event stream cannot be read now: {exc!r}"[:300], "server_error")

    async def events(self, request: Request, ensure_bus):
        """GET /page/events[?kinds=a,b]: this client's stream (see the module docstring)."""
        if not authorized(request, self.key):
            return unauthorized()
        kinds, err = kinds_param(request.query_params.get("kinds"))
        if err:
            return err
        if self.streams >= MAX_STREAMS:
            busy = error(
                429,
                f"this replica already streams to {MAX_STREAMS} pages; close one or retry later",
                "rate_limit_error",
                code="too_many_streams",
            )
            busy.headers["Retry-After"] = "10"
            return busy
        try:
            nc = (await ensure_bus()).nc
        except Exception as exc:
            return error(503, f"the event stream cannot be read now: {exc!r}"[:300], "server_error")
        feed, subs = Feed(), []

        async def on_msg(msg):  # the SSE event is named by the kind (an interaction's subject also holds its id)
            feed.put(kind_of(msg.subject, self.prefix) or msg.subject, msg.data.decode("utf-8", "replace"))

        async def start():
            self.streams += 1
            every = set(kinds) == set(EVENT_KINDS)
            for subject in [f"{self.prefix}.>"] if every else [s for k in kinds for s in subjects_of(k, self.prefix)]:
                subs.append(await nc.subscribe(subject, cb=on_msg))

        async def stop():
            self.streams -= 1
            for sub in subs:
                try:
                    await sub.unsubscribe()
                except Exception:  # the connection is gone already: nothing left to unsubscribe from
                    pass

        return StreamingResponse(
            sse(feed, start, stop),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
