"""Held-out entries never reach the questioner, the explorer, the navigator's memory or the learner."""
import asyncio

import pytest

from actors.bus import Poison
from actors.events import Task
from actors.explorer import Explorer
from actors.questioner import train_pool
from config.settings import load_settings
from envs.registry import make_envs


@pytest.fixture(scope="module")
def envs():
    return make_envs(load_settings(None).env)


def test_questioner_pool_is_exactly_the_train_split(envs):
    pool = train_pool(envs)
    held = {f"{n}\t{e}" for n, env in envs.items() for e in env.entries("heldout")}
    train = {f"{n}\t{e}" for n, env in envs.items() for e in env.entries("train")}
    assert set(pool) == train and not set(pool) & held and held


def test_explorer_dead_letters_a_heldout_task(envs, tmp_path):
    s = load_settings(None)
    s.state_dir = str(tmp_path)
    ex = Explorer(s, bus=object())
    ex.envs = envs
    name, env = next(iter(envs.items()))
    task = Task(task_id="t", env=name, entry_id=env.entries("heldout")[0], split="heldout")
    with pytest.raises(Poison, match="heldout"):
        asyncio.run(ex.handle_task(task, None))
    sneaky = Task(task_id="t", env=name, entry_id=env.entries("heldout")[0], split="train")  # mislabelled
    with pytest.raises(Poison, match="train split"):
        asyncio.run(ex.handle_task(sneaky, None))
    with pytest.raises(Poison, match="unknown environment"):
        asyncio.run(ex.handle_task(Task(task_id="t", env="nope", entry_id="x"), None))
