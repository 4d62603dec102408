"""The environment pool's contract with in-process workers (the Ray actors run the same class)."""

import inspect
import json
import time

import pytest

from actors.events import ChatMessage, ToolCall
from config.settings import EnvSettings
from envs.bfcl import BfclEnvironment
from envs.pool import EnvWorker, PooledEnvironment
from envs.tool_calls import parse_python_call


def _pool(max_concurrent=2, idle_s=300.0, keepalive_s=30.0):
    es = EnvSettings(names=["bfcl"], bfcl_categories=["base"], max_turns=99, max_steps_per_turn=99)
    worker = EnvWorker(es.model_dump_json(), idle_s)
    local = BfclEnvironment(["base"], max_turns=99, max_steps_per_turn=99)
    return worker, PooledEnvironment(local, [worker], max_concurrent, remote=False, slot_timeout_s=0.2, keepalive_s=keepalive_s)


def test_ground_truth_through_the_pool_passes_and_releases():
    worker, env = _pool()
    ep = env.episode("multi_turn_base_0")
    local = BfclEnvironment(["base"], max_turns=99, max_steps_per_turn=99).episode("multi_turn_base_0")
    while ep.next_user_message() is not None:
        local.next_user_message()
        calls = []
        for i, s in enumerate(local.truth[local.turn]):
            p = parse_python_call(s)
            bound = inspect.signature(local.model.methods[p.name]).bind(*p.args, **p.kwargs)
            calls.append(ToolCall(id=str(i), name=p.name, arguments=json.dumps(dict(bound.arguments))))
        r = ep.step(ChatMessage(role="assistant", tool_calls=calls))
        assert r.signal > 0
    assert ep.outcome() == 1.0
    assert worker.stats()["live"] == 1
    ep.release()
    assert worker.stats()["live"] == 0


def test_concurrency_limit_and_idle_release():
    worker, env = _pool(max_concurrent=2, idle_s=0.05, keepalive_s=0)  # an owner that stopped renewing
    a, b = env.episode("multi_turn_base_0"), env.episode("multi_turn_base_1")
    with pytest.raises(TimeoutError):
        env.episode("multi_turn_base_2")
    a.release()
    c = env.episode("multi_turn_base_2")
    time.sleep(0.1)
    worker.gc()  # the reaper thread may have done it already
    assert worker.stats()["live"] == 0 and worker.stats()["reaped"] >= 2
    with pytest.raises(KeyError):
        b.step(ChatMessage(role="assistant", content="hi"))
    b.release()
    c.release()


def test_a_held_episode_outlives_a_slow_generation_but_not_its_owner():
    """The pool renews the lease of what it holds: a step that comes after longer than `idle_s` of
    generation still finds its episode (it once lost a whole group on a starved CPU); once released,
    or when nobody renews, the reaper takes it."""
    worker, env = _pool(idle_s=0.3, keepalive_s=0.05)
    ep = env.episode("multi_turn_base_0")
    assert ep.next_user_message()
    time.sleep(0.8)  # a generation slower than idle_s
    worker.gc()
    assert worker.stats()["live"] == 1 and worker.stats()["reaped"] == 0
    ep.step(ChatMessage(role="assistant", content="hi"))
    assert env.renew() == 1
    ep.release()
    assert env.held == {} and env.renew() == 0 and worker.stats()["live"] == 0
    dead_owner = env.episode("multi_turn_base_1")
    env.held.clear()  # its owner is gone: nobody renews
    time.sleep(0.4)
    worker.gc()  # the reaper thread may have done it already
    assert worker.stats()["reaped"] == 1 and worker.stats()["live"] == 0
    with pytest.raises(KeyError):
        dead_owner.step(ChatMessage(role="assistant", content="hi"))
