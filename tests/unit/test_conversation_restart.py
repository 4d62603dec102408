"""The attributor's conversations after a restart: what the stream hands back closes one ack wait later, not after a
whole idle time again (the helpers are test_conversations.py's)."""

import asyncio

from test_conversations import FakeBus, Msg, _agent_conversation, _it, _user  # tests/unit is on sys.path

from actors.events import ChatMessage, Judgement
from policies.judge.conversations import ConversationBook


def test_a_conversation_handed_back_after_a_restart_waits_one_ack_wait_not_idle_s_again(tmp_path):
    """Idle counts from when a request was served (a clock ahead counts as now): a conversation that went quiet while
    the attributor was down closes one ack wait after it comes back (its other held requests come back within it)."""
    from datetime import datetime, timedelta, timezone

    from actors.attributor import Attributor
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir, s.nats.ack_wait_s = str(tmp_path), 5.0
    a = Attributor(s, bus=FakeBus())
    a.book, a.held, a.signalled, a._last_beat = ConversationBook(idle_s=30), {}, {}, 0.0
    old = _agent_conversation("Error: city not found", "No, that is not what I asked.")
    fresh = _it("f1", [_user("hello")], ChatMessage(role="assistant", content="hi"), user="u2")
    ahead = _it("f2", [_user("later")], ChatMessage(role="assistant", content="yes"), user="u3")
    for it, dt in [*((it, -300) for it in old), (ahead, 600)]:
        it.occurred_at = (datetime.now(timezone.utc) + timedelta(seconds=dt)).isoformat()
    msgs = {it.event_id: Msg() for it in [*old, fresh, ahead]}

    async def go():
        for it in [*old, fresh, ahead]:
            await a.handle_interaction(it, msgs[it.event_id])
        await a.tick()
        assert len(a.book.open) == 3  # all within their wait
        for c in a.book.open.values():
            c.last_at -= 5.0  # one ack wait later
        await a.tick()

    asyncio.run(go())
    assert set(a.book.open) == {"f1", "f2"} and [msgs[it.event_id].acks for it in old] == [1, 1, 1]
    assert sorted(j.signals[0] for j in a.bus.events if isinstance(j, Judgement)) == ["correction", "tool_error"]
