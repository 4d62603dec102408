"""A streamed chat answer (server-sent events, as the OpenAI API sends them) that is recorded exactly once.

Clients close the connection at `[DONE]`, which cancels whatever the response generator had left to do: the
interaction is recorded before the last frames (shielded from that cancellation), and a client that hangs up
mid-stream still leaves its interaction, recorded when the answer is done. A generation that fails mid-stream
sends an error event, then `[DONE]`. Stop sequences cut the text (`serve.wire.StopStream`), and
`stream_options.include_usage` adds the usage chunk before `[DONE]`. With tools, text streams as it is generated up
to where a call opens; calls go out whole once vetted (a call a client cannot run streams on as text). An answer that
may still become a bare Python-style call (`get_weather(city="Paris")`, no tags: `BareCallHold`) is held back until
it cannot, so a call is never streamed as text and then sent as a call too.
"""

from __future__ import annotations

import ast
import asyncio
import json
import re
import time
import unicodedata

from fastapi.responses import StreamingResponse

from envs.tool_calls import MAX_CALL_CHARS, CallError, parse_python_call
from policies.chat import CALL_OPEN
from serve.wire import StopStream, usage

# proxies (nginx, and what follows its convention) buffer a response unless told not to: a stream must flow as written
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(server, turn) -> StreamingResponse:
    return StreamingResponse(stream_chat(server, turn), media_type="text/event-stream", headers=SSE_HEADERS)


async def stream_chat(server, turn):
    """The SSE frames of one streamed answer; `server` is the Serve replica (its pool, recorder and log)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    req, iid, name = turn.req, turn.iid, server.s.model.name
    plain = not turn.tools
    # text streams as it is generated, up to a stop sequence, and with tools up to where a call opens: a call is
    # parsed and vetted whole (policies.chat.trusted_calls), then sent; a forced call streams nothing before
    stops = StopStream((req.stop or []) + ([] if plain else [CALL_OPEN]))
    hold = BareCallHold([t.function.name for t in turn.tools])
    sent = []

    def on_text(piece: str):
        if not turn.forced:
            loop.call_soon_threadsafe(q.put_nowait, piece)

    engine = turn.engine
    task = asyncio.create_task(server._in_pool(turn.generate, on_text))
    version = engine.version  # the fingerprint of the first chunk; the record uses what really answered
    created = int(time.time())

    def frame(choices: list, **extra) -> str:
        body = {
            "id": iid,
            "object": "chat.completion.chunk",
            "created": created,
            "model": name,
            "system_fingerprint": version,
            "choices": choices,
            **extra,
        }
        return "data: " + json.dumps(body) + "\n\n"

    def chunk(delta: dict, finish=None) -> str:
        return frame([{"index": 0, "delta": delta, "finish_reason": finish}])

    # The interaction is recorded before the last frames, and when the client hangs up mid-stream it still is,
    # once the answer is done: clients close the connection at [DONE], which cancels whatever this generator
    # had left to do (the openai SDK lost 2 of 5 streamed interactions that way).
    recorded = False
    try:
        yield chunk({"role": "assistant", "content": ""})
        while not task.done() or not q.empty():
            try:
                piece = stops.feed(await asyncio.wait_for(q.get(), timeout=0.05))
                piece = piece if plain else hold.feed(piece)
                if piece:
                    sent.append(piece)
                    yield chunk({"content": piece})
            except asyncio.TimeoutError:
                continue
        if plain and (rest := stops.rest()):
            yield chunk({"content": rest})
        try:
            gen = task.result()[0]
        except Exception as exc:  # the answer failed mid-stream: an error event, then [DONE]; nothing to record
            recorded = True
            server.log.exception("stream.failed", interaction_id=iid)
            yield (
                "data: "
                + json.dumps(
                    {
                        "error": {
                            "message": f"generation failed: {type(exc).__name__}",
                            "type": "server_error",
                            "param": None,
                            "code": None,
                        }
                    }
                )
                + "\n\n"
            )
            yield "data: [DONE]\n\n"
            return
        answer = turn.answer(gen)
        record = asyncio.ensure_future(server._record(turn, answer, gen.version or version, gen.straddled))
        recorded = True  # from here on the record is under way: a hang-up now must not record it again
        await asyncio.shield(record)
        if not plain:
            delta = {"content": _unsent(answer.content or "", "".join(sent)) or None}
            if answer.tool_calls:
                delta["tool_calls"] = [
                    {"index": i, "id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for i, c in enumerate(answer.tool_calls)
                ]
            yield chunk(delta)
        yield chunk({}, turn.finish(answer, gen))
        if req.include_usage:  # stream_options.include_usage: one more chunk, with no choices
            yield frame([], usage=usage(turn.n_prompt, gen))
        yield "data: [DONE]\n\n"
    finally:
        if not recorded:  # hung up mid-stream: the answer is still being generated; record it when it is done
            asyncio.ensure_future(_record_when_done(server, task, turn, version))


def _unsent(content: str, sent: str) -> str:
    """What of the answer's text the client has not had yet (the text streamed before a call opened is the start of
    the answer's text, but for the whitespace the parsed answer strips)."""
    for head in (sent, sent.lstrip(), sent.strip()):
        if content.startswith(head):
            return content[len(head) :]
    return "" if sent else content


async def _record_when_done(server, task, turn, version: str) -> None:
    try:
        gen = (await task)[0]
    except Exception:  # no answer, nothing to learn from
        return
    await server._record(turn, turn.answer(gen), gen.version or version, gen.straddled)


_HEAD = re.compile(r"[\s(]*(?:([^\W\d]\w*)[\s)]*(\(.*)?)?", re.S)  # (name)(...) is a call of name too


class BareCallHold:
    """Streamed text held back while the answer may still be a bare call: `policies.chat.parse_assistant` answers
    text whose every line is a call `name(key=literal, ...)` (`_python_calls(strict=True)`) as those calls, and Serve
    sends one whose names are declared (`trusted_calls`). `feed` returns what can be sent; once the answer cannot be
    such a call everything flows. It errs on holding: a held answer that is text goes out in the last frames."""

    def __init__(self, names: list[str]):
        self.names, self.held, self.free = set(names), "", not names

    def feed(self, piece: str) -> str:
        if self.free:
            return piece
        self.held += piece  # all of the answer so far: nothing was sent before it was free
        if could_call(self.held, self.names):
            return ""
        out, self.held, self.free = self.held, "", True
        return out


def could_call(text: str, names: set[str]) -> bool:
    """Whether `text`, the start of an answer, may still go on to be calls of `names` as `parse_assistant` reads a bare
    call: every finished line one (with no positional arguments), the last line the start of one."""
    lines = text.replace("<|im_end|>", "").splitlines(keepends=True)
    if not lines or lines[-1].splitlines() != [lines[-1]]:  # it ends with a line break: a new line has not begun
        lines.append("")
    *whole, last = lines
    for line in (s.strip().strip("[]") for s in whole if s.strip()):
        try:
            p = parse_python_call(line)
        except CallError:
            return False
        if p.args or p.name not in names:
            return False
    last = unicodedata.normalize("NFKC", last.strip().strip("[]"))  # Python reads identifiers NFKC-normalized
    if not last:
        return True
    m = _HEAD.fullmatch(last)
    if not m or len(last) > MAX_CALL_CHARS:
        return False
    if m.group(2) is None:  # a name so far: one a declared name starts with may still be followed by "("
        return any(n.startswith(m.group(1) or "") for n in names)
    if m.group(1) not in names:
        return False
    try:
        ast.parse(last, mode="eval")
    except SyntaxError:
        return True  # the call's arguments may not be finished yet
    except (ValueError, RecursionError, MemoryError):
        return False
    try:
        p = parse_python_call(last)
    except CallError:
        return False
    return not p.args and p.name in names
