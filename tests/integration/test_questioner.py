"""The questioner's synthetic-task lifecycle on a real nats-server, Milvus Lite and embedder."""

import json
import uuid

from actors.bus import Bus
from actors.events import Judgement, Sample, parse_event
from actors.task_events import TaskStatus


class Scripted:
    """Generator double (the policy's place): fixed arguments per function, a fixed request text."""

    name = "scripted"

    def __init__(self, query):
        self.query = query

    def call_arguments(self, messages, tool):
        return {"mkdir": '{"dir_name": "reports"}'}.get(tool.function.name)

    def chat(self, messages, tools=None, prefix=""):
        return self.query


async def _events(bus, kinds):
    sub = await bus.pull("probe-" + uuid.uuid4().hex[:6], kinds)
    out = []
    while True:
        try:
            msgs = await sub.fetch(50, timeout=1.0)
        except TimeoutError:
            return out
        for m in msgs:
            out.append(parse_event(m.data))
            await m.ack()


async def _questioner(settings, nats_server, share: float):
    """A questioner on its own stream, BFCL `base` only, no model load (the test hands in the generator);
    a bus on the same stream; and the train entries that start in the GorillaFileSystem."""
    from actors.questioner import Questioner
    from envs.bfcl import load_category

    p = "q" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.env.names = ["bfcl"]
    settings.env.bfcl_categories = ["base"]
    settings.questioner.synthetic_share = share
    settings.questioner.explore_steps = 40  # enough steps for mkdir to come up among ~20 functions
    settings.questioner.generator_base_url = "http://127.0.0.1:9/v1"  # replaced by the test; no model load
    q = Questioner(settings)
    await q.start()
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    entries, _ = load_category("base")
    fs = [e for e in q.envs["bfcl"].entries("train") if entries[e]["involved_classes"] == ["GorillaFileSystem"]]
    return q, bus, fs


async def test_synthetic_task_lifecycle(settings, nats_server):
    q, bus, fs = await _questioner(settings, nats_server, share=1.0)
    try:
        q.writer.pick_base = lambda env_name, live: fs[0]
        q.writer.gen = Scripted("Please create a directory named reports for me.")
        task_id = await q.synthesize()
        assert task_id and q.book.get(task_id).status == "verified"
        await q.issue_synthetic(task_id)
        # the same request from another start state is a semantic duplicate
        q.writer.pick_base = lambda env_name, live: fs[1]
        q.writer.gen = Scripted("Please create a directory named reports for me!")
        assert await q.synthesize() is None

        def judged(outcomes):
            samples = [Sample(sample_id=str(i), messages=[], outcome=o) for i, o in enumerate(outcomes)]
            return Judgement(
                group_id="g",
                source="rollout",
                task_id=task_id,
                samples=samples,
                outcomes=outcomes,
                step_labels=[[] for _ in outcomes],
                origin="synthetic",
            )

        await q.handle_judgement(judged([1.0, 0.0, 1.0, 0.0]), None)  # consistency 0.5: in band
        assert q.book.get(task_id).status == "active" and q.book.get(task_id).due
        await q.issue_synthetic(task_id)
        await q.handle_judgement(judged([1.0, 1.0, 1.0, 1.0]), None)  # too easy now
        assert q.book.get(task_id).status == "retired"

        evs = await _events(bus, ["task_status", "task"])
        st = [(e.task_id, e.status) for e in evs if isinstance(e, TaskStatus)]
        assert st[:3] == [(task_id, "proposed"), (task_id, "verified"), (task_id, "active")]
        proposed = next(e for e in evs if isinstance(e, TaskStatus) and e.status == "proposed")
        assert any(x.startswith("mkdir(dir_name='reports') -> ok") for x in proposed.exploration)
        assert (settings.state / "questioner" / "explorations.jsonl").read_text().count("\n") == 2
        dup = [e for e in evs if isinstance(e, TaskStatus) and e.task_id != task_id]
        assert [e.status for e in dup] == ["proposed", "rejected"] and "duplicate of " + task_id in dup[1].reason
        assert st[-1] == (task_id, "retired") and "too easy" in [e for e in evs if isinstance(e, TaskStatus)][-1].reason
        tasks = [e for e in evs if e.kind == "task"]
        assert len(tasks) == 2 and all(
            t.origin == "synthetic" and t.reference == ["mkdir(dir_name='reports')"] and t.base_entry_id == fs[0] for t in tasks
        )
    finally:
        await q.shutdown()
        await bus.close()


async def test_dataset_tasks_flow_while_a_synthesis_explores(settings, nats_server):
    import asyncio
    import threading

    q, bus, fs = await _questioner(settings, nats_server, share=0.5)
    go = threading.Event()

    class Slow(Scripted):  # explores only once the test lets it: the synthesis is still running meanwhile
        def call_arguments(self, messages, tool):
            go.wait(60)
            return super().call_arguments(messages, tool)

    class Follower:  # the live policy's place: counts the weight loads
        loads = 0

        def sync(self):
            Follower.loads += 1
            return "w-000001"

    try:
        q.writer.pick_base = lambda env_name, live: fs[0]
        q.writer.gen = Slow("Please create a directory named reports for me.")
        q.engine, q.policy = object(), Follower()
        await q.tick()
        assert q.synthesizing()
        await q.tick()  # not a second synthesis; another dataset task
        await q.handle_weights_promoted(None, None)
        assert Follower.loads == 0  # weights never change under a running exploration
        evs = await _events(bus, ["task"])
        assert [e.origin for e in evs] == ["env", "env"] and q.synthesizing()
        go.set()
        await asyncio.wait_for(q._synth_job, 120)
        await q.tick()  # follows the promotion, then issues the verified task
        assert Follower.loads == 1 and q.weights_version == "w-000001"
        evs = await _events(bus, ["task"])
        assert evs[-1].origin == "synthetic" and evs[-1].reference == ["mkdir(dir_name='reports')"]
    finally:
        go.set()
        await q.shutdown()
        await bus.close()


async def test_tasks_on_the_clients_tools_from_live_requests_only(settings, nats_server):
    """`synth_envs: [client_tools]` with `synthetic_share: 1`: the tools a live request declared become a verified
    task that carries them, and no dataset task is issued."""
    from actors.events import ChatMessage, Interaction, ToolSpec

    settings.questioner.synth_envs = ["client_tools"]
    q, bus, _ = await _questioner(settings, nats_server, share=1.0)
    weather = ToolSpec.model_validate(
        {
            "function": {
                "name": "get_weather",
                "description": "Current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
            }
        }
    )

    class Weather(Scripted):
        def call_arguments(self, messages, tool):
            return '{"city": "Paris"}' if tool.function.name == "get_weather" else None

    try:
        assert q.writer is None and q.client_writer is not None
        q.client_writer.gen = Weather("What is the weather in Paris today?")
        await q.tick()
        assert not q.synthesizing()  # no tool set kept yet: nothing to write about, and no dataset task either
        request = ChatMessage(role="user", content="Is it raining in Lyon?")
        answer = ChatMessage(role="assistant", content="Let me check.")
        await q.handle_interaction(
            Interaction(interaction_id="i1", user_hash="u1", messages=[request], tools=[weather], response=answer), None
        )
        kept = json.loads((settings.state / "actors" / "questioner.json").read_text())["toolsets"]  # saved on arrival
        assert [[t["function"]["name"] for t in r["tools"]] for r in kept.values()] == [["get_weather"]]
        await q.tick()
        assert q.synthesizing()
        task_id = await q._synth_job
        assert task_id and q.book.get(task_id).status == "verified"
        await q.tick()
        evs = await _events(bus, ["task"])
        assert [(e.origin, e.env) for e in evs] == [("synthetic", "client_tools")]
        assert evs[0].reference == ["get_weather(city='Paris')"] and evs[0].tools == [weather]
        assert evs[0].query == "What is the weather in Paris today?"
    finally:
        await q.shutdown()
        await bus.close()
