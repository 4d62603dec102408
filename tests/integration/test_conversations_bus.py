"""Conversations through a restart, on a real nats-server: the attributor holds a conversation's interactions
unacked; killed mid-conversation, the next one gets them back from the stream, stitches the rest on, and judges
each unrated step with a signal exactly once."""

import asyncio
import uuid

from actors.actor import EventActor
from actors.bus import Bus
from actors.events import ChatMessage, Interaction, Judgement, ToolCall, parse_event


def _conversation(user="u1"):
    m1 = [ChatMessage(role="user", content="What is the weather in Paris tomorrow?")]
    r1 = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Paris"}')])
    m2 = m1 + [r1, ChatMessage(role="tool", content="Error: unknown city", tool_call_id="c1")]
    r2 = ChatMessage(role="assistant", content="I could not find it.")
    m3 = m2 + [r2, ChatMessage(role="user", content="No, that is wrong. Paris, France.")]
    r3 = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c2", name="get_weather", arguments='{"city": "Paris, France"}')])
    out = []
    for i, (m, r) in enumerate([(m1, r1), (m2, r2), (m3, r3)]):
        ev = Interaction(interaction_id=f"chatcmpl-{uuid.uuid4().hex}", user_hash=user, messages=m, response=r)
        ev.weights_version = f"w-00000{i + 1}"
        out.append(ev)
    return out


async def _judgements(bus, prefix):
    from nats.js import api

    sub = await bus.js.subscribe(
        f"{prefix}.judgement", ordered_consumer=True, config=api.ConsumerConfig(deliver_policy=api.DeliverPolicy.ALL)
    )
    got = []
    try:
        while True:
            got.append(parse_event((await sub.next_msg(timeout=2.0)).data))
    except (TimeoutError, asyncio.TimeoutError):
        return got
    finally:
        await sub.unsubscribe()


async def test_open_conversations_survive_an_attributor_restart_and_are_judged_once(settings, nats_server):
    from actors.attributor import Attributor

    p = "c" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.judge.base_url = "http://127.0.0.1:9"  # never called: unrated steps are judged by their signals
    settings.conversations.idle_s = 10.0  # longer than a redelivery, as in production (120 s vs 60 s)
    settings.nats.ack_wait_s = 4.0  # what the first attributor held comes back 4 s after it is gone
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    its = _conversation()

    async def run_until(actor, cond, timeout=60.0):
        task = asyncio.create_task(actor.run())
        try:
            for _ in range(int(timeout * 10)):
                await asyncio.sleep(0.1)
                if cond(actor):
                    return
            raise AssertionError("the attributor did not get there")
        finally:
            actor.stop.set()
            await asyncio.wait_for(task, 30)

    first = Attributor(settings)
    for it in its[:2]:
        await bus.publish(it)
    await run_until(first, lambda a: a.book is not None and sum(len(c.steps) for c in a.book.open.values()) == 2)
    assert not await _judgements(bus, p)  # still open: nothing judged, nothing acked
    await bus.publish(its[2])
    second = Attributor(settings)  # the first one is gone; its held interactions come back from the stream
    await run_until(second, lambda a: sum(getattr(a, "signalled", {}).values()) == 3 and not a.held, timeout=90)
    judged = [j for j in await _judgements(bus, p) if isinstance(j, Judgement)]
    # the last request's tool call was never answered before the conversation went idle
    assert sorted(j.signals[0] for j in judged) == ["abandoned_call", "correction", "tool_error"]
    assert {j.samples[0].sample_id: j.weights_version for j in judged} == {
        its[0].interaction_id: "w-000001",
        its[1].interaction_id: "w-000002",
        its[2].interaction_id: "w-000003",
    }
    third = Attributor(settings)  # everything was acked: a later start judges nothing again
    await run_until(third, lambda a: a.book is not None, timeout=30)
    await asyncio.sleep(12)
    assert len([j for j in await _judgements(bus, p) if isinstance(j, Judgement)]) == 3
    info = await bus.consumer_info("attributor")
    assert info.num_ack_pending == 0 and info.num_pending == 0
    await bus.close()


async def test_a_live_step_with_declared_tools_is_re_sampled_by_the_explorer_into_one_judged_group(
    settings, nats_server, model_dir
):
    """attributor -> evo.live_step -> explorer (the real 135M re-samples the step) -> evo.rollout -> attributor ->
    one live judgement of the served step and its alternatives, each scored against the declared tools."""
    from live_doubles import weather  # tests/ is on sys.path

    from actors.attributor import Attributor
    from actors.explorer import Explorer
    from actors.task_events import LiveStep, Rollout

    p = "c" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    settings.judge.base_url = "http://127.0.0.1:9"  # never called: live steps are scored without a judge
    settings.model.source, settings.model.path = "hf-folder", str(model_dir)
    settings.env.pool_workers = 0
    settings.conversations.idle_s = 2.0
    settings.conversations.alternative_tokens = 48
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    tools = [weather("city", "days")]
    ask = [ChatMessage(role="user", content="What is the weather in Oslo for the next 3 days?")]
    served = ChatMessage(role="assistant", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}')])
    it = Interaction(interaction_id=f"chatcmpl-{uuid.uuid4().hex}", user_hash="u1", messages=ask, response=served, tools=tools)
    it.tool_choice = "required"
    await bus.publish(it, weights_version="w-000000")

    attributor, explorer = Attributor(settings), Explorer(settings)
    tasks = [asyncio.create_task(a.run()) for a in (attributor, explorer)]
    try:
        for _ in range(1800):
            await asyncio.sleep(0.1)
            if any(len(j.samples) > 1 for j in await _judgements(bus, p) if isinstance(j, Judgement)):
                break
    finally:
        for a in (attributor, explorer):
            a.stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    (j,) = [j for j in await _judgements(bus, p) if isinstance(j, Judgement)]
    assert j.source == "live" and j.env == "live" and len(j.samples) == 1 + settings.conversations.alternatives
    assert j.signals == ["invalid_call"] + ["alternative"] * settings.conversations.alternatives
    assert j.outcomes[0] == -0.9 and all(o in (-1.0, -0.9, 0.0) for o in j.outcomes[1:])
    assert j.behaviour_versions == ["w-000000"] * len(j.samples) and j.user_hashes == ["u1"] * len(j.samples)
    assert j.samples[0].hint == "tool: Error: get_weather: 'days' is a required property"
    assert all(s.messages[1].content == ask[0].content and s.step_indices == [2] for s in j.samples)
    kinds = {
        type(parse_event(m.data)).__name__
        for m in [await bus.js.get_last_msg(p.upper(), f"{p}.{k}") for k in ("live_step", "rollout")]
    }
    assert kinds == {LiveStep.__name__, Rollout.__name__}
    for durable in ("attributor", "explorer", "explorer-first"):
        info = await bus.consumer_info(durable)
        assert info.num_ack_pending == 0 and info.num_pending == 0
    await bus.close()


async def test_first_kinds_are_taken_ahead_of_the_rest_from_a_consumer_of_their_own(settings, nats_server):
    """The explorer takes users' live steps ahead of environment tasks: `first_kinds` on `<name>-first`, one at a time."""
    from actors.events import Sample
    from actors.task_events import LiveStep, Task

    p = "t" + uuid.uuid4().hex[:8]
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    step = Sample(
        sample_id="s", messages=[ChatMessage(role="user", content="hi"), ChatMessage(role="assistant")], step_indices=[1]
    )

    class Both(EventActor):
        name = "recorder"
        kinds = ("task",)
        first_kinds = ("live_step",)

        seen: list = []

        async def handle_task(self, ev, msg):
            self.seen.append(ev.entry_id)

        async def handle_live_step(self, ev, msg):
            self.seen.append(ev.entry_id)

    actor = Both(settings, bus)
    actor.batch, actor.fetch_timeout_s = 1, 0.2
    for entry in ("task-1", "task-2"):
        await bus.publish(Task(task_id=entry, env="code", entry_id=entry))
    await actor.start()
    await bus.publish(LiveStep(task_id="l1", entry_id="live-1", step=step))
    await bus.publish(LiveStep(task_id="l2", entry_id="live-2", step=step))
    for _ in range(6):
        await actor._once()
    assert actor.seen == ["live-1", "live-2", "task-1", "task-2"]
    assert await bus.backlog("recorder-first") == 0 and await bus.backlog("recorder") == 0
    assert await bus.backlog("nobody") == 0  # a consumer not bound yet has no backlog
    await bus.close()
