"""BFCL v4 single-turn entries scored by BFCL's own AST checker, loaded without any vendor's API client."""

import subprocess
import sys

import pytest

from actors.events import ChatMessage, ToolCall
from envs.bfcl_single import SingleTurnEnvironment, check, reference_calls


def _call(name, args):
    return ToolCall(id="c", name=name, arguments=args)


def test_the_checker_accepts_the_right_call_and_says_why_it_rejects_others():
    assert check("simple_python_0", [_call("calculate_triangle_area", '{"base": 10, "height": 5}')]) == (True, "")
    ok, why = check("simple_python_0", [_call("calculate_triangle_area", '{"base": 11, "height": 5}')])
    assert not ok and "base" in why and "10" in why
    assert check("simple_python_0", [_call("calculate_triangle_area", '{"base": ')])[0] is False  # broken JSON
    # parallel calls are checked in any order
    assert check("parallel_0", reference_calls("parallel_0")[::-1])[0]


def test_episodes_split_and_references():
    env = SingleTurnEnvironment()
    train, held = env.entries("train"), env.entries("heldout")
    assert len(train) + len(held) == 800 and not set(train) & set(held) and 120 < len(held) < 200
    assert {env.category_of(e) for e in held} == {"simple_python", "multiple", "parallel"}
    ep = env.episode("simple_python_0")
    assert ep.next_user_message().startswith("Find the area of a triangle") and ep.next_user_message() is None
    assert [t.function.name for t in ep.tools] == ["calculate_triangle_area"]
    assert ep.tools[0].function.parameters["type"] == "object"
    r = ep.step(ChatMessage(role="assistant", content="The area is 25."))
    assert r.turn_done and r.signal == -1.0 and ep.outcome() == 0.0
    ep = env.episode("simple_python_0")
    ep.next_user_message()
    r = ep.step(env.reference_action("simple_python_0").action)
    assert r.signal == 1.0 and ep.outcome() == 1.0
    refs = [env.reference_action(e) for e in train[:100]]
    assert sum(r is not None for r in refs) >= 95


def test_the_checker_does_not_import_any_vendor_client():
    code = (
        "import sys; sys.path.insert(0, '.'); from envs.bfcl_single import check, reference_calls; "
        "assert check('multiple_0', reference_calls('multiple_0'))[0]; "
        "print(sorted(m for m in sys.modules if 'model_handler' in m or m.split('.')[0] in "
        "('anthropic', 'openai', 'google', 'cohere', 'mistralai')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=__import__("pathlib").Path(__file__).resolve().parents[2],
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_the_configured_categories_are_its_entries_held_out_split_and_checks():
    from config.settings import Settings
    from envs.registry import make_env

    s = Settings.model_validate({"env": {"bfcl_single_categories": ["simple_python"]}})
    env = make_env("bfcl_single", s.env)
    held, whole = env.entries("heldout"), SingleTurnEnvironment().entries("heldout")
    assert held and {env.category_of(e) for e in held} == {"simple_python"}
    assert held == [e for e in whole if e.startswith("simple_python_")]  # the same split, only that category
    with pytest.raises(ValueError, match="unknown BFCL single-turn category 'simple_java'"):
        SingleTurnEnvironment(categories=["simple_java"])
