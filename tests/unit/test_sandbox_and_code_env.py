"""The code sandbox stops hostile programs within its limits; the code environment scores correctly."""

import json
import os
import subprocess

import pytest

from actors.events import ChatMessage, ToolCall
from envs.code import FAMILIES, CodeEnvironment, _task
from envs.sandbox import Limits, run_python

FAST = Limits(wall_s=4.0, cpu_s=2)


def test_normal_code_runs():
    r = run_python("print(sum(range(10)))", FAST)
    assert r.ok and r.stdout.strip() == "45"


def test_infinite_loop_is_stopped_by_the_cpu_limit():
    r = run_python("while True: pass", FAST)
    assert not r.ok and r.killed_by in ("cpu", "wall") and r.seconds < FAST.wall_s + 2


def test_sleeping_forever_is_stopped_by_the_wall_clock():
    r = run_python("import time; time.sleep(60)", FAST)
    assert r.timed_out and r.seconds < FAST.wall_s + 2


def test_fork_bomb_is_contained_and_leaves_nothing_behind():
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    r = run_python(code, FAST)
    assert not r.ok and r.seconds < FAST.wall_s + 3
    if os.geteuid() == 0:
        left = subprocess.run(["pgrep", "-u", "nobody", "-f", "kaizen-sbx"], capture_output=True, text=True).stdout
        assert left.strip() == ""


def test_memory_hog_hits_the_memory_limit():
    r = run_python("x = bytearray(4 * 1024**3)", FAST)
    assert not r.ok and r.killed_by == "memory"
    r = run_python("x = []\nwhile True:\n    x.append(' ' * 10**7)", FAST)
    assert not r.ok and r.killed_by in ("memory", "cpu", "wall")


def test_output_flood_is_capped():
    r = run_python("while True: print('x' * 1000)", FAST)
    assert not r.ok and len(r.stdout) <= FAST.output_bytes


@pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
def test_no_network():
    r = run_python("import socket; socket.create_connection(('127.0.0.1', 22), timeout=2)", FAST)
    assert not r.ok and ("unreachable" in r.stderr or "refused" in r.stderr.lower())
    assert r.network_isolated


def test_oversized_code_is_refused_without_running():
    r = run_python("#" * 100_000, FAST)
    assert not r.ok and r.killed_by == "size"


def _call(code):
    return ChatMessage(role="assistant", tool_calls=[ToolCall(id="c", name="python", arguments=json.dumps({"code": code}))])


@pytest.mark.parametrize("family", FAMILIES)
def test_code_env_reference_answers_verify(family):
    env = CodeEnvironment(limits=FAST)
    eid = f"code_{family}_3"
    ep = env.episode(eid)
    question, answer, _ = _task(family, 3)
    assert ep.next_user_message() == question
    r = ep.step(_call(f"print({answer})"))
    assert r.signal == 1.0 and r.observations[0].content.strip() == answer
    r = ep.step(ChatMessage(role="assistant", content=f"The answer is {answer}."))
    assert r.turn_done and ep.outcome() == 1.0 and ep.passed()


def test_code_env_wrong_answer_and_bad_calls():
    env = CodeEnvironment(limits=FAST)
    ep = env.episode("code_arith_0")
    ep.next_user_message()
    assert ep.step(ChatMessage(role="assistant", tool_calls=[ToolCall(id="c", name="shell", arguments="{}")])).signal < 0
    bad = ep.step(ChatMessage(role="assistant", tool_calls=[ToolCall(id="c", name="python", arguments="{oops")]))
    assert bad.signal < 0 and "Error" in bad.observations[0].content
    crash = ep.step(_call("1/0"))
    assert crash.signal < 0 and "ZeroDivisionError" in crash.observations[0].content
    ep2 = env.episode("code_arith_0")
    ep2.next_user_message()
    ep2.step(ChatMessage(role="assistant", content="It is 12345678."))
    assert ep2.outcome() == 0.0


def test_code_env_split_is_fixed_and_disjoint():
    env = CodeEnvironment()
    train, held = set(env.entries("train")), set(env.entries("heldout"))
    assert train and held and not train & held and len(train) + len(held) == 700


@pytest.mark.parametrize("family", FAMILIES)
def test_code_env_reference_solution_replays_and_passes(family):
    from envs.base import replay

    env = CodeEnvironment(limits=FAST)
    for n in (0, 7):
        eid = f"code_{family}_{n}"
        ep = replay(env, eid, env.reference_solution(eid))
        assert ep.passed(), (eid, ep.program)


def test_code_env_ladder_levels():
    env = CodeEnvironment()
    assert env.level_of("code_add_1") == 0 and env.level_of("code_muladd_1") == 1
    assert env.level_of("code_arith_1") == 2 and env.level_of("code_collatz_1") == 3
    q, a, prog = _task("add", 5)
    assert q.startswith("What is ") and "+" in q and prog.startswith("print(")
