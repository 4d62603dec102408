"""The clients people already use, unchanged, against a running `up` (the CPU default): openai (sync and async),
langchain-openai, litellm and the OpenAI Agents SDK. Plain, streamed, tools and a tool round trip, structured output
(JSON of the schema; an unknown format is a 400 the clients raise as BadRequestError), the error cases, and every
interaction id a client got is on the stream exactly once. Last, a browser: headless Chromium opens the live page
(/page) on the same `up`."""

import asyncio
import json
import math
import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from pydantic import BaseModel, Field
from test_e2e import HTTP, _cli, system  # noqa: F401  (the same running system: its own `up` for this module)

pytestmark = pytest.mark.e2e
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # offline: litellm's bundled model map
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get-weather",
            "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
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
    assert calls and {t.function.name for t in calls} == {"get-weather"}  # a forced call is always the call
    for t in calls:  # its arguments as the model wrote them (JSON or not, as non-strict mode), never the markup after
        assert "</tool_call>" not in t.function.arguments and "<tool_call>" not in (r.choices[0].message.content or "")
    if calls:  # the round trip: the tool's result, then the model's answer
        follow = (
            ASK
            + [r.choices[0].message.model_dump(exclude_none=True)]
            + [{"role": "tool", "tool_call_id": t.id, "content": "18 C, clear"} for t in calls]
        )
        ids.append(c.chat.completions.create(model=system["model"], messages=follow, tools=TOOLS, max_tokens=16).id)
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "place", "schema": schema, "strict": True}}
    s = c.chat.completions.create(model=system["model"], messages=ASK, max_tokens=48, response_format=fmt)
    ids.append(s.id)  # structured output: JSON of the schema (the budget may cut it off, and then it says so)
    assert s.choices[0].finish_reason == "length" or isinstance(json.loads(s.choices[0].message.content)["city"], str)
    with pytest.raises(openai.BadRequestError):  # a schema the grammar compiler refuses is a 400 naming it
        c.chat.completions.create(model=system["model"], messages=ASK, max_tokens=8, response_format={"type": "yaml"})
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gpt-4o", messages=ASK, max_tokens=8)
    assert c.models.retrieve(system["model"]).id == system["model"]

    async def many():
        a = openai.AsyncOpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
        rs = await asyncio.gather(
            *[
                a.chat.completions.create(model=system["model"], max_tokens=6, messages=[{"role": "user", "content": f"Say {i}"}])
                for i in range(4)
            ]
        )
        return [x.id for x in rs]

    _ids_on_stream(system["state"], ids + asyncio.run(many()))


def test_langchain_openai(system):  # noqa: F811
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(
        model=system["model"], base_url=system["endpoint"], api_key=system["key"], max_tokens=12, max_retries=0, timeout=300
    )
    msg = llm.invoke("Say hi")
    assert isinstance(msg.content, str) and msg.response_metadata["model_name"] == system["model"]
    parts = list(llm.stream("Count to three"))
    assert parts and "".join(p.content for p in parts)
    roomy = llm.model_copy(update={"max_tokens": 48})
    tooled = roomy.bind_tools(TOOLS, tool_choice="required").invoke("Weather in Paris?")
    assert all(t["name"] == "get-weather" and isinstance(t["args"], dict) for t in tooled.tool_calls)
    # a forced call is always the call: arguments that are not JSON (non-strict mode, or cut off by the token limit)
    # reach langchain as the model wrote them, which files that call under invalid_tool_calls
    bad = getattr(tooled, "invalid_tool_calls", [])
    assert tooled.tool_calls or bad, tooled.response_metadata
    assert all(b["name"] == "get-weather" and "</tool_call>" not in (b["args"] or "") for b in bad), bad
    _ids_on_stream(system["state"], [msg.response_metadata["id"], tooled.response_metadata["id"]])  # the interaction ids


def test_litellm(system):  # noqa: F811
    import litellm

    kw = {
        "model": f"openai/{system['model']}",
        "api_base": system["endpoint"],
        "api_key": system["key"],
        "max_tokens": 8,
        "num_retries": 0,
        "timeout": 300,
    }
    r = litellm.completion(messages=ASK, **kw)
    assert r.choices[0].message.content is not None
    text = "".join(ch.choices[0].delta.content or "" for ch in litellm.completion(messages=ASK, stream=True, **kw))
    assert text
    with pytest.raises(litellm.BadRequestError):
        litellm.completion(messages=[], **kw)
    _ids_on_stream(system["state"], [r.id])


def test_openai_agents_sdk(system):  # noqa: F811
    import openai
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from agents.exceptions import MaxTurnsExceeded

    set_tracing_disabled(True)  # no network: the SDK would export traces to OpenAI

    def agent(tools=(), output_type=None):  # a client per run: each run_sync has its own event loop, and an async
        # client keeps its first
        client = openai.AsyncOpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
        return Agent(
            name="kaizen",
            instructions="Answer briefly.",
            tools=list(tools),
            output_type=output_type,
            model=OpenAIChatCompletionsModel(model=system["model"], openai_client=client),
        )

    class Place(BaseModel):
        city: str = Field(max_length=40)

    @function_tool
    def get_weather(city: str) -> str:
        """Weather for a city."""
        return f"18 C in {city}"

    plain = Runner.run_sync(agent(), "Say hi", max_turns=1)
    assert isinstance(plain.final_output, str) and plain.final_output
    # structured output (the SDK sends a strict json_schema and parses the answer with pydantic, raising on anything else)
    assert isinstance(
        Runner.run_sync(agent(output_type=Place), "Which city is the Eiffel Tower in?", max_turns=1).final_output, Place
    )

    async def streamed():
        run = Runner.run_streamed(agent(), "Count to three", max_turns=1)
        return [e async for e in run.stream_events()], run.final_output

    events, final = asyncio.run(streamed())
    assert events and isinstance(final, str)
    # the SDK marks function tools strict: a forced call is decoded under its schema, its check passes and the tool runs
    once = {"model_settings": ModelSettings(tool_choice="required"), "tool_use_behavior": "stop_on_first_tool"}
    forced = agent([get_weather]).clone(**once)
    assert Runner.run_sync(forced, "Weather in Paris?", max_turns=2).final_output.startswith("18 C in ")
    try:  # every call the model makes must run (an invalid one raises ModelBehaviorError, and fails this test)
        assert isinstance(Runner.run_sync(agent([get_weather]), "Weather in Paris?", max_turns=4).final_output, str)
    except MaxTurnsExceeded:  # a 135M model may keep calling the tool; each call ran
        pass


CHROMIUM = Path("/usr/bin/chromium")  # Debian's (scripts/setup.sh installs it where it can); never `playwright install`
HEADLESS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOWN = """[[...document.querySelectorAll('#rows tbody tr[data-version]')].map(tr => [...tr.cells].map(c => c.textContent)),
            Object.fromEntries(Object.entries(kaizenPage.curves).map(([env, u]) => [env, u.data]))]"""
LOADED = "!!(window.kaizenPage && kaizenPage.state) && document.getElementById('stream').textContent === 'live'"


def _until(page, js: str, timeout: float) -> float:
    """Seconds until `js` is true (page.wait_for_function would eval a string, which the page's CSP forbids)."""
    t0 = time.monotonic()
    while not page.evaluate(js):
        assert time.monotonic() - t0 < timeout, f"not within {timeout}s: {js}"
        time.sleep(0.1)
    return time.monotonic() - t0


def _report(state) -> dict:
    r = _cli(state, "report", "--json", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _expected(doc: dict):
    """What the page must show of `report --json`: the lineage rows (newest first), and each curve as uPlot's data."""
    rows = [
        [
            r["version"],
            r["parent"],
            str(r["step"]),
            r["status"],
            r["gate"],
            r["canary"],
            "–" if r["served_after_s"] is None else f"{math.floor(r['served_after_s'] + 0.5)} s",
        ]  # Math.round
        for r in reversed(doc["rows"])
    ]
    return rows, {
        env: [c["step"], *[[None if x is None else 100 * x for x in c[k]] for k in ("avg", "lo", "hi", "base")]]
        for env, c in doc["curve"].items()
    }


@pytest.mark.skipif(not CHROMIUM.exists(), reason="no /usr/bin/chromium (Debian: apt-get install chromium)")
def test_the_live_page_in_a_browser(system):  # noqa: F811
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright (the dev extra) is not installed")
    from actors.events import HeldoutScored
    from config.settings import load_settings
    from deploy.stream_view import connect

    base, key = system["endpoint"].removesuffix("/v1"), {"Authorization": f"Bearer {system['key']}"}
    assert HTTP.get(base + "/page").status_code == 200 and HTTP.get(base + "/page/state").status_code == 401
    assert HTTP.get(base + "/page/events?kinds=nope", headers=key).json()["error"]["param"] == "kinds"
    out = Path(tempfile.gettempdir()) / "kaizen-artifacts"
    out.mkdir(exist_ok=True)
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=HEADLESS)
        try:
            page = browser.new_page(viewport={"width": 390, "height": 844})  # a phone
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{base}/page#key={system['key']}")
            _until(page, LOADED, 180)
            assert "key=" not in page.url and page.evaluate("document.documentElement.scrollWidth") <= 390
            # a newly published event: in the page's live list within seconds, and its document follows it
            rows = _report(system["state"])["rows"]
            scored = HeldoutScored(
                version=rows[-1]["version"] if rows else "w-999999",
                env="code",
                entries=1,
                suite_entries=40,
                k=4,
                avg=0.25,
                base_avg=0.0,
                delta=0.25,
                p_value=1.0,
                wins=1,
                losses=0,
                verdict="not_below",
                duration_s=1.0,
                reason="browser test marker",
            )

            async def publish():
                s = load_settings(None)
                s.state_dir = str(system["state"])
                bus = await connect(s, system)
                await bus.publish(scored)
                await bus.close()

            with ThreadPoolExecutor(1) as pool:  # Playwright's sync API runs an event loop in this thread
                pool.submit(asyncio.run, publish()).result(timeout=60)
            seen_s = _until(page, f"!!document.querySelector('#events li[data-id=\"{scored.event_id}\"]')", 10)
            _until(page, f"!!kaizenPage.state.heldout['{scored.version}']", 20)
            print(f"a published event was on the page after {seen_s:.2f}s")
            # the lineage rows and the curve are `main.py report --json`'s (read again until the system holds still)
            for _ in range(5):
                before = _expected(_report(system["state"]))
                page.reload()
                _until(page, LOADED, 60)
                shown = page.evaluate(SHOWN)
                if _expected(_report(system["state"])) == before:
                    break
            assert shown[0] == before[0]
            assert shown[1].keys() == before[1].keys() and "code" in shown[1]
            for env, series in before[1].items():
                assert [pytest.approx(s, nan_ok=True) for s in series] == shown[1][env], env
            page.screenshot(path=str(out / "page-390.png"), full_page=True)
            wide = browser.new_page(viewport={"width": 1100, "height": 900})
            wide.goto(f"{base}/page#key={system['key']}")
            _until(wide, LOADED, 60)
            wide.screenshot(path=str(out / "page.png"), full_page=True)
            print(f"screenshots: {out / 'page-390.png'} (phone), {out / 'page.png'}")
            assert not errors, errors
        finally:
            browser.close()
