"""A streamed chat answer (server-sent events, as the OpenAI API sends them) that is recorded exactly once.

Clients close the connection at `[DONE]`, which cancels whatever the response generator had left to do: the
interaction is recorded before the last frames (shielded from that cancellation), and a client that hangs up
mid-stream still leaves its interaction, recorded when the answer is done. A generation that fails mid-stream
sends an error event, then `[DONE]`. Stop sequences cut the text (`serve.wire.StopStream`), and
`stream_options.include_usage` adds the usage chunk before `[DONE]`. With tools, text streams as it is generated up
to where a call opens; calls go out whole once vetted (a call a client cannot run streams on as text).
"""

from __future__ import annotations

import asyncio
import json
import time

from policies.chat import CALL_OPEN
from serve.wire import StopStream, usage


async def stream_chat(server, turn):
    """The SSE frames of one streamed answer; `server` is the Serve replica (its pool, recorder and log)."""
    loop = asyncio.get_running_loop()
    q: asyncio.Queue = asyncio.Queue()
    req, iid, name = turn.req, turn.iid, server.s.model.name
    plain = not turn.tools
    # text streams as it is generated, up to a stop sequence, and with tools up to where a call opens: a call is
    # parsed and vetted whole (policies.chat.trusted_calls), then sent; a forced call streams nothing before
    stops = StopStream((req.stop or []) + ([] if plain else [CALL_OPEN]))
    sent = []

    def on_text(piece: str):
        if not turn.forced:
            loop.call_soon_threadsafe(q.put_nowait, piece)

    engine = turn.engine
    task = asyncio.create_task(server._in_pool(engine.generate, [turn.prompt], turn.max_new, req.temperature, req.top_p, on_text))
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
