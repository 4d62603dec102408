"""The clients people already use, unchanged, against a running `up` (the CPU default): openai (sync and async),
langchain-openai, litellm and the OpenAI Agents SDK. Plain, streamed, tools and a tool round trip, structured output
(refused with a 400 the clients raise as BadRequestError), the error cases, and every interaction id a client got
is on the stream exactly once."""
import asyncio
import json
import os

import pytest

from test_e2e import _cli, system  # noqa: F401  (the same running system: its own `up` for this module)

pytestmark = pytest.mark.e2e
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: litellm's bundled model map
TOOLS = [{"type": "function", "function": {"name": "get-weather", "description": "Weather for a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]
ASK = [{"role": "user", "content": "Weather in Paris?"}]


def _ids_on_stream(state, ids: list[str]) -> None:
    for _ in range(30):
        ev = _cli(state, "events", "interaction", "--all", "--seconds", "4", timeout=120)
        if all(ev.stdout.count(i) == 1 for i in ids):
            return
    assert all(ev.stdout.count(i) == 1 for i in ids), ([i for i in ids if ev.stdout.count(i) != 1], ev.stdout[-1500:])


def test_openai_sync_and_async(system):  # noqa: F811
    import openai

    c = openai.OpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
    ids = [c.chat.completions.create(model=system["model"], messages=ASK, max_tokens=8).id]
    chunks = list(c.chat.completions.create(model=system["model"], messages=ASK, max_tokens=8, stream=True))
    ids.append(chunks[0].id)
    r = c.chat.completions.create(model=system["model"], messages=ASK, tools=TOOLS, tool_choice="required", max_tokens=32)
    ids.append(r.id)
    calls = r.choices[0].message.tool_calls or []
    for t in calls:  # a call reaches the client only when it can be run
        assert t.function.name == "get-weather" and isinstance(json.loads(t.function.arguments), dict)
    if calls:  # the round trip: the tool's result, then the model's answer
        follow = ASK + [r.choices[0].message.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": t.id, "content": "18 C, clear"} for t in calls]
        ids.append(c.chat.completions.create(model=system["model"], messages=follow, tools=TOOLS, max_tokens=16).id)
    with pytest.raises(openai.BadRequestError):  # structured output is refused, not ignored
        c.chat.completions.create(model=system["model"], messages=ASK, max_tokens=8,
                                  response_format={"type": "json_object"})
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=8)
    assert c.models.retrieve(system["model"]).id == system["model"]

    async def many():
        a = openai.AsyncOpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
        rs = await asyncio.gather(*[a.chat.completions.create(model=system["model"], max_tokens=6,
                                                               messages=[{"role": "user", "content": f"Say {i}"}])
                                    for i in range(4)])
        return [x.id for x in rs]
    _ids_on_stream(system["state"], ids + asyncio.run(many()))


def test_langchain_openai(system):  # noqa: F811
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=system["model"], base_url=system["endpoint"], api_key=system["key"], max_tokens=12,
                     max_retries=0, timeout=300)
    msg = llm.invoke("Say hi")
    assert isinstance(msg.content, str) and msg.response_metadata["model_name"] == system["model"]
    parts = list(llm.stream("Count to three"))
    assert parts and "".join(p.content for p in parts)
    tooled = llm.bind_tools(TOOLS, tool_choice="required").invoke("Weather in Paris?")
    assert all(t["name"] == "get-weather" and isinstance(t["args"], dict) for t in tooled.tool_calls)
    assert not getattr(tooled, "invalid_tool_calls", [])  # nothing a client cannot run
    _ids_on_stream(system["state"], [msg.response_metadata["id"], tooled.response_metadata["id"]])  # the interaction ids


def test_litellm(system):  # noqa: F811
    import litellm

    kw = {"model": f"openai/{system['model']}", "api_base": system["endpoint"], "api_key": system["key"],
          "max_tokens": 8, "num_retries": 0, "timeout": 300}
    r = litellm.completion(messages=ASK, **kw)
    assert r.choices[0].message.content is not None
    text = "".join(ch.choices[0].delta.content or "" for ch in litellm.completion(messages=ASK, stream=True, **kw))
    assert text
    with pytest.raises(litellm.BadRequestError):
        litellm.completion(messages=[], **kw)
    _ids_on_stream(system["state"], [r.id])


def test_openai_agents_sdk(system):  # noqa: F811
    import openai
    from agents import Agent, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)  # no network: the SDK would export traces to OpenAI

    def agent(tools=()):  # a client per run: each run_sync has its own event loop, and an async client keeps its first
        client = openai.AsyncOpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
        return Agent(name="kaizen", instructions="Answer briefly.", tools=list(tools),
                     model=OpenAIChatCompletionsModel(model=system["model"], openai_client=client))

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"18 C in {city}"

    plain = Runner.run_sync(agent(), "Say hi", max_turns=1)
    assert isinstance(plain.final_output, str) and plain.final_output

    async def streamed():
        run = Runner.run_streamed(agent(), "Count to three", max_turns=1)
        return [e async for e in run.stream_events()], run.final_output
    events, final = asyncio.run(streamed())
    assert events and isinstance(final, str)
    try:  # every call the model makes must run (an invalid one raises ModelBehaviorError, and fails this test)
        assert isinstance(Runner.run_sync(agent([get_weather]), "Weather in Paris?", max_turns=4).final_output, str)
    except MaxTurnsExceeded:  # a 135M model may keep calling the tool; each call ran
        pass
