"""Held-out entries never reach the questioner, the explorer, the navigator's memory or the learner."""

import asyncio

import pytest

from actors.bus import Poison
from actors.explorer import Explorer
from actors.task_events import Task
from config.settings import load_settings
from envs.registry import make_envs
from policies.tasks.book import TaskBook
from policies.tasks.curriculum import train_pool


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


def _questioner(envs, tmp_path):
    from actors.questioner import Questioner

    s = load_settings(None)
    s.state_dir = str(tmp_path)
    q = Questioner(s, bus=object())
    q.envs = envs
    q._init_pools({})
    q.book = TaskBook()
    return q


def test_questioner_alternates_envs_and_climbs_the_code_ladder(envs, tmp_path):
    from actors.events import Judgement, Sample

    q = _questioner(envs, tmp_path)
    q._save, q.book, q.proposed = (lambda: None), TaskBook(), 0
    code, train = envs["code"], {n: set(e.entries("train")) for n, e in envs.items()}
    picks = [q.next_entry()[0].split("\t") for _ in range(8)]
    assert [n for n, _ in picks] == ["code", "bfcl", "code", "code"] * 2  # the preset's env_weights {code: 3, bfcl: 1}
    assert all(e in train[n] for n, e in picks)  # never a held-out entry
    assert {code.level_of(e) for n, e in picks if n == "code"} == {0}  # the lowest rung first
    for i in range(4):  # the policy now solves rung 0 (a reference sample does not count as its own)
        smp = [Sample(sample_id=str(k), messages=[], outcome=1.0) for k in range(4)]
        ref = Sample(sample_id="r", messages=[], outcome=1.0, off_policy=True)
        asyncio.run(
            q.handle_judgement(
                Judgement(
                    group_id=str(i),
                    source="rollout",
                    task_id=f"code:code_add_{i}:0",
                    env="code",
                    entry_id=f"code_add_{i}",
                    samples=smp + [ref],
                    outcomes=[1.0] * 5,
                    step_labels=[[]] * 5,
                ),
                None,
            )
        )
    assert q.ladder.mastered("code", 0)
    nxt = [q.next_entry()[0].split("\t") for _ in range(4)]
    assert {code.level_of(e) for n, e in nxt if n == "code"} == {1}
    assert q.health()["ladder"]["code"]["rung"] == 1


def test_synthetic_tasks_start_with_one_call_and_climb(envs, tmp_path):
    from actors.events import Judgement, Sample
    from actors.questioner import SYNTHETIC

    q = _questioner(envs, tmp_path)
    q._save = lambda: None

    async def status(*a):
        pass

    q._status = status  # retiring a too-easy task publishes its status; no bus here
    assert q.ladder.rung(SYNTHETIC, [0, 1]) == 0  # one explicit call first
    for i in range(4):
        q.book = TaskBook(
            {
                f"t{i}": {
                    "task_id": f"t{i}",
                    "env": "bfcl",
                    "entry": "e",
                    "base": "b",
                    "query": "q",
                    "status": "active",
                    "reference": ["ls()"],
                    "issued": 1,
                }
            }
        )
        smp = [Sample(sample_id=str(k), messages=[], outcome=1.0) for k in range(4)]
        asyncio.run(
            q.handle_judgement(
                Judgement(
                    group_id=str(i),
                    source="rollout",
                    task_id=f"t{i}",
                    origin="synthetic",
                    samples=smp,
                    outcomes=[1.0] * 4,
                    step_labels=[[]] * 4,
                ),
                None,
            )
        )
    assert q.ladder.rung(SYNTHETIC, [0, 1]) == 1  # mastered single calls: two-call tasks next
