"""Self-questioning on the clients' own tools: kept tool sets, tasks written and verified, their episodes."""

import asyncio
import json
import random
from collections import Counter
from types import SimpleNamespace

import pytest
from live_doubles import tool

from actors.bus import Poison
from actors.events import ChatMessage, ToolCall
from actors.explorer import Explorer
from actors.task_events import Task
from config.settings import load_settings
from envs.client_tools import CLIENT_TOOLS, ClientToolsEnvironment
from policies.tasks.client_tasks import ClientTaskWriter, ToolSets, practisable, tools_of, user_request, verify

AREA = tool(
    "triangle_area", {"base": {"type": "number"}, "height": {"type": "integer"}}, ["base", "height"], "Area of a triangle."
)
WEATHER = tool("get_weather", {"city": {"type": "string"}}, ["city"], "Current weather in a city.")


class Scripted:
    """Generator double: fixed arguments per function, a fixed request text."""

    name = "scripted"

    def __init__(self, args: dict, query: str = ""):
        self.args, self.query, self.asked = args, query, []

    def call_arguments(self, messages, tool, after=()):
        self.asked.append((tool.function.name, messages[-1].content, *after))
        got = self.args.get(tool.function.name)
        return got.pop(0) if isinstance(got, list) else got  # a list: one value per call, in turn

    def chat(self, messages, tools=None, prefix=""):
        return self.query


class Index:
    def __init__(self, near=None):
        self.near, self.added = near, []

    def nearest(self, vec):
        return self.near

    def add(self, task_id, vec, query):
        self.added.append((task_id, query))


def _writer(sets, gen, index=None, parallel_share=0.0):
    embedder = SimpleNamespace(embed=lambda texts: [[1.0, 0.0] for _ in texts])
    q = SimpleNamespace(dedup_threshold=0.92, client_parallel_share=parallel_share)
    w = ClientTaskWriter(embedder, index or Index(), gen, Counter(), random.Random(0), q)
    return SimpleNamespace(write=lambda live, sigs: w.write(live, sigs, sets.snapshot()), pick=w.pick)  # as the questioner


def test_tool_sets_are_bounded_per_user_and_in_all_and_scrubbed():
    sets = ToolSets(size=3, per_user=2)
    noisy = tool("send_mail", {"to": {"type": "string", "description": "e.g. ann@example.com"}}, ["to"], "Mail ann@example.com")
    k0 = sets.add([noisy], "u1", "write to ann@example.com")
    assert "example.com" not in json.dumps(sets.state())  # descriptions and the example request are scrubbed
    sets.add([AREA], "u1")
    sets.add([WEATHER], "u1")  # a third set from u1: its oldest goes
    assert k0 not in sets.sets and len(sets.sets) == 2
    for i in range(3):  # other users: the least recently seen goes first
        sets.add([tool(f"f{i}", {"x": {"type": "integer"}}, ["x"])], f"v{i}")
    assert len(sets.sets) == 3 and [t.function.name for r in sets.sets.values() for t in tools_of(r)] == ["f0", "f1", "f2"]
    again = ToolSets(3, 2, json.loads(json.dumps(sets.state())))  # kept with the questioner's state
    assert list(again.sets) == list(sets.sets)
    assert list(ToolSets(2, 2, sets.state()).sets) == list(sets.sets)[1:]  # restored under smaller bounds
    assert sets.add([], "u1") is None
    # a set seen again is not new (nothing to save), moves last and is now the newer user's
    assert sets.add([tool("f0", {"x": {"type": "integer"}}, ["x"])], "w") is None
    assert [r["user"] for r in sets.sets.values()] == ["v1", "v2", "w"]


def test_every_string_of_a_schema_is_scrubbed_keys_kept():
    mail = {"type": "string", "enum": ["ann@example.com", "ops"], "default": "ann@example.com", "title": "ann@example.com"}
    deep = {"type": "object", "properties": {"cc": {"type": "string", "description": "say bob@example.org"}}}
    sets = ToolSets()
    key = sets.add([tool("send", {"to": mail, "opts": deep}, ["to"])], "u1")
    assert "@example" not in json.dumps(sets.state())
    params = tools_of(sets.sets[key])[0].function.parameters
    assert set(params["properties"]) == {"to", "opts"} and params["properties"]["to"]["enum"][1] == "ops"
    assert params["required"] == ["to"] and set(params["properties"]["opts"]["properties"]) == {"cc"}


def test_only_functions_the_checker_can_judge_are_practised():
    assert practisable(AREA) and practisable(WEATHER)
    assert not practisable(tool("no_args", {"x": {"type": "integer"}}, []))  # nothing to get right
    assert not practisable(tool("a.b", {"x": {"type": "integer"}}, ["x"]))  # not a plain name
    assert not practisable(tool("f", {"x-y": {"type": "integer"}}, ["x-y"]))
    assert not practisable(tool("f", {"x": {"anyOf": [{"type": "integer"}]}}, ["x"]))
    assert not practisable(tool("convert", {"from": {"type": "string"}}, ["from"]))  # f(from=...) does not parse


def test_a_set_that_declares_one_name_twice_is_not_practised_and_the_writer_reads_a_snapshot():
    sets = ToolSets()
    sets.add([WEATHER, tool("get_weather", {"town": {"type": "string"}}, ["town"])], "u1")
    w = _writer(sets, Scripted({"get_weather": '{"city": "Paris"}'}))
    assert w.write([], set()) == {"outcome": "empty", "base": None}
    snap = sets.snapshot()
    sets.add([AREA], "u2")  # the loop adds a set while the writer works on its copy
    assert w.pick(snap) is None and w.pick(sets.snapshot())[1].function.name == "triangle_area"


def test_a_task_is_written_about_a_declared_function_and_verified():
    sets = ToolSets()
    sets.add([AREA, WEATHER], "u1", "How big is a triangle of base 3 and height 4?")
    gen = Scripted({"triangle_area": '{"base": 10, "height": 5}', "get_weather": '{"city": "Paris"}'}, "")
    w = _writer(sets, gen)
    first, second = w.write([], set()), w.write([], set())
    assert {first["outcome"], second["outcome"]} == {"verified"}
    assert {r["task"].reference[0] for r in (first, second)} == {"triangle_area(base=10, height=5)", "get_weather(city='Paris')"}
    assert gen.asked[0][1] == "How big is a triangle of base 3 and height 4?"  # shown the live request for values
    rec = first["task"]
    assert rec.env == CLIENT_TOOLS and rec.synthesizer == "template" and len(rec.tools) == 2
    # the generator wrote nothing grounded, so a request as users write one, which mentions every value
    area = next(r["task"] for r in (first, second) if r["task"].reference[0].startswith("triangle"))
    assert "base 10" in area.query and "height 5" in area.query and "triangle_area" not in area.query
    # the episode: the reference is right, a wrong value is not, no call is worst
    env = ClientToolsEnvironment()
    spec = {"query": area.query, "reference": area.reference, "tools": area.tools}
    outcomes = []
    for args in ({"base": 10.0, "height": 5}, {"base": 10, "height": 6}, None):
        ep = env.episode(area.entry, spec)
        assert ep.next_user_message() == area.query
        calls = [ToolCall(id="c", name="triangle_area", arguments=json.dumps(args))] if args else []
        r = ep.step(ChatMessage(role="assistant", tool_calls=calls))
        outcomes.append((ep.outcome(), r.signal))
        assert ep.next_user_message() is None
    assert outcomes == [(1.0, 1.0), (0.0, -0.5), (0.0, -1.0)]
    from policies.rollout import reference_sample

    ref = reference_sample(env, area.entry, spec)
    assert ref.off_policy and ref.outcome == 1.0 and ref.messages[1].content == area.query


def test_a_grounded_request_from_the_generator_is_kept_and_others_are_rejected_or_skipped():
    sets = ToolSets()
    sets.add([WEATHER], "u1", "weather?")
    w = _writer(sets, Scripted({"get_weather": '{"city": "Paris"}'}, "What is the weather in Paris right now?"))
    rec = w.write(["what's it like in Rome"], set())
    assert rec["outcome"] == "verified" and rec["task"].synthesizer == "scripted"
    assert w.write([], {rec["task"].sig})["outcome"] == "empty"  # the very same task again
    near = _writer(sets, Scripted({"get_weather": '{"city": "Oslo"}'}), Index(near=("syn:x", 0.97)))
    assert near.write([], set())["reason"].startswith("duplicate of syn:x")
    # arguments that do not fit the schema are rejected with the reason; none written: nothing to propose
    bad = _writer(sets, Scripted({"get_weather": '{"city": 3}'})).write([], set())
    assert bad["outcome"] == "rejected" and "does not fit the declared schema" in bad["reason"]
    assert _writer(sets, Scripted({})).write([], set())["outcome"] == "empty"
    assert _writer(ToolSets(), Scripted({})).write([], set()) == {"outcome": "empty", "base": None}
    # several calls in one answer: one function, different values, at most three
    assert verify(["get_weather(city='Paris')", "get_weather(city='Rome')"], [WEATHER])[0] is True
    for ref in (
        ["get_weather(city='Paris')", "get_weather(city='Paris')"],
        ["get_weather(city='Paris')", "triangle_area(base=1, height=2)"],
        [f"get_weather(city='c{i}')" for i in range(4)],
        [],
    ):
        assert verify(ref, [WEATHER, AREA])[0] is False, ref


def test_the_explorer_takes_a_task_on_the_clients_tools_only_with_its_tools_and_a_reference(tmp_path):
    s = load_settings(None)
    s.state_dir = str(tmp_path)
    ex = Explorer(s, bus=object())
    ex.envs = {CLIENT_TOOLS: ClientToolsEnvironment()}
    base = dict(task_id="t", env=CLIENT_TOOLS, entry_id="syn-1", origin="synthetic", query="q", base_entry_id="tools-1")
    for bad in (
        Task(**base, reference=["get_weather(city='Paris')"]),  # no tools
        Task(**base, reference=[], tools=[WEATHER]),
        Task(**{**base, "origin": "env"}, reference=["get_weather(city='Paris')"], tools=[WEATHER]),
    ):
        with pytest.raises(Poison, match="lacks its tools or its reference calls"):
            asyncio.run(ex.handle_task(bad, None))
    for ref, why in (("__import__('os')", "not one of the declared functions"), ("get_weather(city=3)", "does not fit")):
        with pytest.raises(Poison, match=f"unusable reference: .*{why}"):
            asyncio.run(ex.handle_task(Task(**base, reference=[ref], tools=[WEATHER]), None))


def test_a_request_as_users_write_one_says_what_the_function_does_and_every_value_and_does_not_name_it():
    from policies.tasks.synthesis import grounded

    rng = random.Random(1)
    ref = ["triangle_area(base=10, height=5)"]
    got = {user_request(ref, [AREA, WEATHER], rng) for _ in range(30)}
    assert got == {
        "Area of a triangle, with base 10 and height 5.",
        "Area of a triangle. Use base 10 and height 5.",
        "Area of a triangle for base 10 and height 5.",
    }
    assert all(grounded(q, ref, [AREA]) for q in got)
    odd = tool("find_stops", {"route_ids": {"type": "array"}, "opts": {"type": "object"}, "late": {"type": "boolean"}}, [])
    ref = ["find_stops(route_ids=['A 1', 'B'], opts={'max_walk': 2.5}, late=True)"]
    q = user_request(ref, [odd], random.Random(0))  # no description: the function's name in words, not the name
    assert q.startswith("Find stops") and "route ids A 1 and B" in q and "opts max_walk 2.5" in q and "late true" in q
    assert "find_stops" not in q and grounded(q, ref, [odd])
    assert 'route ids ["a; b"]' in user_request(["find_stops(route_ids=['a; b'])"], [odd], random.Random(0))
    # JSON where bare words could be read two ways: a separator inside a string, nested or empty containers
    ref = ["find_stops(route_ids=['New York, NY', 'Boston'], opts={'walk': [1, 2]}, late=False)"]
    q = user_request(ref, [odd], random.Random(0))
    assert 'route ids ["New York, NY", "Boston"]' in q and 'opts {"walk": [1, 2]}' in q and grounded(q, ref, [odd])
    # the first sentence however it ends; a description nothing of which `grounded` can match: the plain description
    asked = tool("f", {"x": {"type": "integer"}}, ["x"], "Is it prime?\nReturns a bool.")
    prime = user_request(["f(x=7)"], [asked], random.Random(0))
    assert prime.startswith("Is it prime") and "?" not in prime and "Returns" not in prime
    short = tool("ip", {"host": {"type": "string"}}, ["host"], "Get IP.")
    assert user_request(["ip(host='a.b')"], [short], random.Random(0)) == 'Please get IP using ip with host "a.b".'


def test_a_share_of_tasks_asks_for_the_function_twice_in_one_answer_and_both_calls_are_checked():
    sets = ToolSets()
    sets.add([AREA], "u1", "How big is a triangle of base 3 and height 4?")
    gen = Scripted({"triangle_area": ['{"base": 10, "height": 5}', '{"base": 7, "height": 2}']})
    rec = _writer(sets, gen, parallel_share=1.0).write([], set())
    assert rec["outcome"] == "verified", rec
    task = rec["task"]
    assert task.reference == ["triangle_area(base=10, height=5)", "triangle_area(base=7, height=2)"]
    request = "How big is a triangle of base 3 and height 4?"  # each set shown the live request; the second, the first
    assert gen.asked == [("triangle_area", request), ("triangle_area", request, '{"base": 10, "height": 5}')]
    assert task.query in (
        "Area of a triangle, once with base 10 and height 5, and once with base 7 and height 2.",
        "Area of a triangle for each of these: base 10 and height 5; base 7 and height 2.",
    )
    env, spec = ClientToolsEnvironment(), {"query": task.query, "reference": task.reference, "tools": task.tools}
    first, second = (
        ToolCall(id=i, name="triangle_area", arguments=a)
        for i, a in (("a", '{"base": 10, "height": 5}'), ("b", '{"base": 7.0, "height": 2}'))
    )
    outcomes = []
    for calls in ([second, first], [first], [first, first]):  # both in any order; one left out; one twice
        ep = env.episode(task.entry, spec)
        ep.next_user_message()
        outcomes.append(ep.step(ChatMessage(role="assistant", tool_calls=calls)).signal)
    assert outcomes == [1.0, -0.5, -0.5]
    # the same values twice, or values BFCL's checker takes for the same call: a task of one call
    same = Scripted({"triangle_area": ['{"base": 10, "height": 5}', '{"base": 10, "height": 5}']})
    assert _writer(sets, same, parallel_share=1.0).write([], set())["task"].reference == ["triangle_area(base=10, height=5)"]
    weather = ToolSets()
    weather.add([WEATHER], "u1", "weather?")
    cased = Scripted({"get_weather": ['{"city": "Paris"}', '{"city": "paris"}']})
    assert _writer(weather, cased, parallel_share=1.0).write([], set())["task"].reference == ["get_weather(city='Paris')"]
    assert verify(["get_weather(city='Paris')", "get_weather(city='paris')"], [WEATHER]) == (
        False,
        "two of the reference's calls are the same call to BFCL's checker",
    )
    # two calls: the request is always written as users write one, never the generator's sentence, which may mention
    # every value and still ask for one call ("1" is inside "10")
    prime = tool("is_prime", {"n": {"type": "integer"}}, ["n"], "Is a number prime.")
    ps = ToolSets()
    ps.add([prime], "u1", "is 7 prime?")
    two = Scripted({"is_prime": ['{"n": 10}', '{"n": 1}']}, "Is 10 a prime number?")
    rec = _writer(ps, two, parallel_share=1.0).write([], set())["task"]
    assert rec.reference == ["is_prime(n=1)", "is_prime(n=10)"] and rec.synthesizer == "template"  # one order
    assert rec.query in (
        "Is a number prime, once with n 1, and once with n 10.",
        "Is a number prime for each of these: n 1; n 10.",
    )
    # share 0 (the default) draws nothing, so tasks are as before
    once = Scripted({"triangle_area": ['{"base": 10, "height": 5}', '{"base": 7, "height": 2}']})
    assert len(_writer(sets, once).write([], set())["task"].reference) == 1 and len(once.asked) == 1
