"""End to end, the HTTP edge of a running `up` (the system of test_e2e.py, its own `up` for this module): bad input
and bad keys are 4xx with OpenAI's error object, nothing listens beyond loopback, and tools and streaming work with
the `openai` client, every streamed interaction reaching the stream once."""

import json

import pytest
from test_e2e import HTTP, _cli, system  # noqa: F401  (the same running system: its own `up` for this module)

pytestmark = pytest.mark.e2e


def test_auth_and_bad_input_are_4xx(system):  # noqa: F811
    base, key = system["endpoint"], system["key"]
    h = {"Authorization": f"Bearer {key}"}
    assert {HTTP.get(base + "/models", headers=hd).status_code for hd in ({}, {"Authorization": "Bearer x"})} == {401}
    assert HTTP.post(base + "/chat/completions", headers=h, content=b"{nope").status_code == 400
    hi = [{"role": "user", "content": "hi"}]
    long = [{"role": "user", "content": "word " * 4000}]  # over serve.max_prompt_tokens (3072)
    ls = [{"type": "function", "function": {"name": "ls", "parameters": {"type": "object", "properties": {}}}}]
    for body, status, param, code in [
        ({"messages": []}, 400, "messages", None),
        ({"messages": long}, 400, "messages", "context_length_exceeded"),
        ({"messages": long, "tools": ls, "tool_choice": "required"}, 400, "messages", "context_length_exceeded"),
        ({"model": system["model"], "n": 2, "messages": hi}, 400, "n", None),
        ({"model": "gpt-4o", "messages": hi}, 404, "model", "model_not_found"),
    ]:
        err = HTTP.post(base + "/chat/completions", headers=h, json=body)
        assert (err.status_code, err.json()["error"]["param"], err.json()["error"]["code"]) == (status, param, code)
    assert HTTP.get(base + f"/models/{system['model']}", headers=h).json()["id"] == system["model"]
    assert HTTP.get(base + "/models/gpt-4o", headers=h).json()["error"]["code"] == "model_not_found"
    assert HTTP.get(base + "/nowhere", headers=h).json()["error"]["message"]  # unknown routes: the error object
    r = HTTP.post(
        base + "/chat/completions",
        headers=h,
        json={  # explicit nulls, a client's default budget, stop
            "model": system["model"],
            "messages": [{"role": "user", "content": "Count from 1 to 9"}],
            "temperature": None,
            "top_p": None,
            "n": None,
            "stream": None,
            "max_tokens": 4096,
            "stop": ["4"],
        },
        timeout=300,
    )  # 256 tokens: slow
    assert r.status_code == 200 and "4" not in (r.json()["choices"][0]["message"]["content"] or ""), r.text[:300]
    m = base.replace("/v1", "/metrics")  # Prometheus, behind the key
    assert HTTP.get(m).status_code == 401 and 'kaizen_request_seconds_count{stream="false"}' in HTTP.get(m, headers=h).text
    r = HTTP.post(base + "/chat/completions", headers=h, content=b"x" * 2_000_000)
    assert r.status_code == 413 and "larger" in r.json()["error"]["message"]
    assert HTTP.post(base + "/feedback", headers=h, json={"interaction_id": "nope", "score": 1}).status_code == 404
    assert HTTP.post(base + "/feedback", headers=h, json={"interaction_id": "x", "score": 7}).status_code == 400
    assert HTTP.get(base.replace("/v1", "/healthz")).status_code == 200
    deep = b'{"messages": [{"role": "user", "content": "hi"}], "x": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    for body in (
        deep,
        b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
        json.dumps({"messages": [{"role": "user", "content": "hi"}], "seed": 3}).encode(),
        json.dumps(
            {
                "messages": [{"role": "user", "content": "hi"}],
                "tools": [{"type": "function", "function": {"name": "ls", "parameters": {"properties": "bad"}}}],
            }
        ).encode(),
    ):
        r = HTTP.post(base + "/chat/completions", headers={**h, "Content-Type": "application/json"}, content=body)
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"], (body[:80], r.status_code, r.text[:300])


def test_a_per_user_key_reaches_chat_and_the_models_but_not_the_operators_routes(system):  # noqa: F811
    base = system["endpoint"]
    alice = {"Authorization": "Bearer " + (system["state"] / "user_keys").read_text().split()[1]}  # serve.user_keys_file
    assert HTTP.get(base + "/models", headers=alice).json()["data"][0]["id"] == system["model"]
    ids = []
    for user in ("u1", "u2"):  # a new `user` on each request: still the key's one user
        body = {"model": system["model"], "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4, "user": user}
        r = HTTP.post(base + "/chat/completions", headers=alice, json=body, timeout=300)
        assert r.status_code == 200, r.text[:300]
        ids.append(r.json()["id"])
    assert HTTP.get(base.replace("/v1", "/metrics"), headers=alice).status_code == 401  # the deployment's key alone
    assert HTTP.get(base.replace("/v1", "/page/state"), headers=alice).status_code == 401
    for _ in range(30):  # both on the stream as one user (`events` shows a user hash's first 8 characters)
        out = _cli(system["state"], "events", "interaction", "--all", "--seconds", "4", timeout=120).stdout
        lines = [ln for ln in out.splitlines() if any(i in ln for i in ids)]
        if len(lines) == 2:
            break
    assert len(lines) == 2 and len({ln.split(" user=")[1].split()[0] for ln in lines}) == 1, out[-2000:]


def test_nothing_listens_beyond_loopback(system):  # noqa: F811
    from deploy.procs import descendants, exposed, listeners

    procs = descendants(system["pid"])
    names = {x["name"] for x in listeners(procs)}
    assert {"nats-server", "gcs_server", "raylet"} <= names and any("ServeRepli" in n for n in names)
    assert exposed(procs) == []


def test_tools_and_streaming(system):  # noqa: F811
    import openai

    c = openai.OpenAI(base_url=system["endpoint"], api_key=system["key"], max_retries=0, timeout=300)
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            },
        }
    ]
    r = c.chat.completions.create(
        model=system["model"], messages=[{"role": "user", "content": "Weather in Paris?"}], tools=tools, max_tokens=32
    )
    assert r.id.startswith("chatcmpl-") and r.system_fingerprint.startswith("w-")
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    chunks = list(
        c.chat.completions.create(
            model=system["model"], messages=[{"role": "user", "content": "Say hi"}], stream=True, max_tokens=12
        )
    )
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text and chunks[-1].choices[0].finish_reason in ("stop", "length")
    counted = list(
        c.chat.completions.create(
            model=system["model"],
            messages=[{"role": "user", "content": "Say hi"}],
            stream=True,
            max_tokens=6,
            stream_options={"include_usage": True},
        )
    )
    assert counted[-1].choices == [] and counted[-1].usage.completion_tokens > 0  # what LangChain counts tokens by
    # the sync SDK closes the connection at [DONE]: every streamed interaction still reaches the stream, once
    streamed = [chunks[0].id] + [
        list(
            c.chat.completions.create(model=system["model"], messages=[{"role": "user", "content": q}], stream=True, max_tokens=8)
        )[0].id
        for q in ("Say yes", "Say no", "Count to three", "Name a colour")
    ]
    for _ in range(30):
        ev = _cli(system["state"], "events", "interaction", "--all", "--seconds", "4", timeout=120)
        if all(ev.stdout.count(i) == 1 for i in streamed):
            break
    assert all(ev.stdout.count(i) == 1 for i in streamed), (streamed, ev.stdout[-2000:])
    for choice in ({"type": "function", "function": {"name": "get_weather"}}, "required"):  # a forced call is always
        ch = c.chat.completions.create(
            model=system["model"],
            messages=[{"role": "user", "content": "Weather in Paris?"}],
            tools=tools,
            max_tokens=48,
            tool_choice=choice,
        ).choices[0]  # a call, never its markup as text (arguments that do not parse go out raw, as non-strict mode's)
        assert [t.function.name for t in ch.message.tool_calls or []][:1] == ["get_weather"]
        assert ch.finish_reason in ("tool_calls", "length") and "<tool_call>" not in (ch.message.content or "")
    with pytest.raises(openai.BadRequestError, match="not among the request's tools"):
        c.chat.completions.create(
            model=system["model"],
            messages=[{"role": "user", "content": "hi"}],
            tools=tools,
            max_tokens=4,
            tool_choice={"type": "function", "function": {"name": "rm_rf"}},
        )
