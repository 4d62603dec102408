"""A streamed answer is recorded exactly once: before its last frames (clients close the connection at [DONE],
which cancels the rest of the response), and after the answer is done when the client hangs up mid-stream; a
generation that fails mid-stream sends an error event, then [DONE], and records nothing."""

import asyncio
import json
import threading
import time
from types import SimpleNamespace

from actors.events import ChatMessage
from policies.engines.generation import Generation
from serve.streaming import stream_chat


class _Engine:
    version = "w-000007"

    def __init__(self, fail=False, gate=None):
        self.fail, self.gate = fail, gate

    def generate(self, prompts, max_new, temperature, top_p, stream_cb, stops=(), grammar=None):
        for piece in ("Hel", "lo"):
            stream_cb(piece)
            if self.gate is not None:
                self.gate.wait(5)  # the client goes away while the answer is still being written
        if self.fail:
            raise RuntimeError("engine died")
        return [Generation("Hello", 3, 2, "stop", "w-000007")]


class _Server:
    def __init__(self):
        self.s = SimpleNamespace(model=SimpleNamespace(name="m"))
        self.recorded = []
        self.log = SimpleNamespace(exception=lambda *a, **k: None)

    async def _in_pool(self, fn, *args):
        return await asyncio.to_thread(fn, *args)

    async def _record(self, turn, answer, version, straddled=False):
        self.recorded.append((turn.iid, answer.content, version))


def _turn(engine):
    return SimpleNamespace(
        req=SimpleNamespace(temperature=0.0, top_p=1.0, stop=[], include_usage=False),
        iid="chatcmpl-1",
        tools=[],
        forced="",
        engine=engine,
        prompt="p",
        max_new=8,
        n_prompt=3,
        answer=lambda gen: ChatMessage(role="assistant", content=gen.text),
        finish=lambda answer, gen: "stop",
        generate=lambda stream_cb=None: engine.generate(["p"], 8, 0.0, 1.0, stream_cb),
    )


def test_recorded_before_the_last_frames_so_a_client_that_leaves_at_done_loses_nothing():
    async def go():
        server = _Server()
        frames = []
        agen = stream_chat(server, _turn(_Engine()))
        async for f in agen:
            frames.append(f)
            if f.startswith("data: [DONE]"):
                break
        assert server.recorded == [("chatcmpl-1", "Hello", "w-000007")]  # before the client saw [DONE]
        await agen.aclose()  # the client closes the connection at [DONE]
        await asyncio.sleep(0.1)
        assert len(server.recorded) == 1
        text = "".join(json.loads(f[6:])["choices"][0]["delta"].get("content") or "" for f in frames[:-1])
        assert text == "Hello" and json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "stop"

    asyncio.run(go())


def test_a_client_that_hangs_up_mid_stream_still_leaves_its_interaction():
    async def go():
        server, gate = _Server(), threading.Event()
        agen = stream_chat(server, _turn(_Engine(gate=gate)))
        assert json.loads((await agen.__anext__())[6:])["choices"][0]["delta"]["role"] == "assistant"
        await agen.aclose()  # gone after the first frame, while the answer is still being generated
        assert server.recorded == []
        gate.set()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if server.recorded:
                break
        assert server.recorded == [("chatcmpl-1", "Hello", "w-000007")]

    asyncio.run(go())


def test_a_generation_error_mid_stream_is_an_error_event_then_done():
    async def go():
        server = _Server()
        frames = [f async for f in stream_chat(server, _turn(_Engine(fail=True)))]
        assert json.loads(frames[-2][6:])["error"]["type"] == "server_error" and frames[-1] == "data: [DONE]\n\n"
        await asyncio.sleep(0.1)
        assert server.recorded == []

    t0 = time.monotonic()
    asyncio.run(go())
    assert time.monotonic() - t0 < 10


def test_a_hang_up_while_the_record_is_being_written_records_it_once():
    async def go():
        server, slow = _Server(), asyncio.Event()
        inner = server._record

        async def record(*a, **k):
            await slow.wait()  # the disk is slow: the client goes away meanwhile
            await inner(*a, **k)

        server._record = record
        agen = stream_chat(server, _turn(_Engine()))
        task = asyncio.ensure_future(agen.__anext__())
        frames = 0
        while True:  # read until the generator sits in the record
            f = await task
            frames += 1
            if '"content": "lo"' in f or frames > 5:
                break
            task = asyncio.ensure_future(agen.__anext__())
        nxt = asyncio.ensure_future(agen.__anext__())
        await asyncio.sleep(0.2)
        nxt.cancel()  # the connection closes while the record is pending
        await asyncio.sleep(0.05)
        slow.set()
        await asyncio.sleep(0.3)
        assert server.recorded == [("chatcmpl-1", "Hello", "w-000007")]

    asyncio.run(go())


TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


class _Pieces(_Engine):
    def __init__(self, pieces):
        super().__init__()
        self.pieces = pieces

    def generate(self, prompts, max_new, temperature, top_p, stream_cb, stops=(), grammar=None):
        for piece in self.pieces:
            stream_cb(piece)
        return [Generation("".join(self.pieces), 3, len(self.pieces), "stop", "w-000007")]


def _tool_stream(pieces, forced=""):
    from actors.events import RetrieveReply, ToolSpec
    from serve.interactions import Turn
    from serve.schemas import ChatRequest

    req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "weather?"}], "tools": [TOOL], "stream": True})
    turn = Turn(
        req=req,
        messages=[],
        tools=[ToolSpec.model_validate(TOOL)],
        memory=RetrieveReply(),
        prompt="p",
        forced=forced,
        iid="chatcmpl-2",
        engine=_Pieces(pieces),
        max_new=8,
        n_prompt=3,
    )

    async def go():
        return [json.loads(f[6:]) for f in [f async for f in stream_chat(_Server(), turn)] if f != "data: [DONE]\n\n"]

    frames = asyncio.run(go())
    deltas = [f["choices"][0]["delta"] for f in frames]
    return (
        [d.get("content") for d in deltas[1:-1]],
        [c for d in deltas for c in d.get("tool_calls", [])],
        frames[-1]["choices"][0]["finish_reason"],
    )


def test_with_tools_text_streams_as_generated_and_a_call_goes_out_whole_once_vetted():
    call = '<tool_call>[{"name": "get_weather", "arguments": {"city": "Paris"}}]</tool_call>'
    texts, calls, finish = _tool_stream(["Let me ", "check. <tool", call[5:]])
    assert texts[0] and "Let me check.".startswith(texts[0])  # sent as generated, before the call opened
    assert "<tool" not in "".join(t or "" for t in texts)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ] and finish == "tool_calls"
    assert "".join(t or "" for t in texts).strip() == "Let me check."


def test_with_tools_a_call_that_cannot_run_streams_on_as_the_models_text():
    bad = '<tool_call>[{"name": "rm_rf", "arguments": {}}]</tool_call>'
    texts, calls, finish = _tool_stream(["Sure ", bad])
    assert calls == [] and finish == "stop" and "".join(t or "" for t in texts) == "Sure " + bad
    texts, calls, finish = _tool_stream(
        ['{"city": "Oslo"}}]</tool_call>'], forced='<tool_call>[{"name": "get_weather", "arguments": '
    )
    assert texts == [None] and json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}  # forced: nothing early
