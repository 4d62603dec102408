"""Real Milvus Lite, real embeddings, real SmolLM2: the pieces the actors are built from."""

import pytest

from actors.events import ChatMessage, Judgement, Sample
from policies.memory.embedder import Embedder
from policies.memory.pool import MemoryPool


@pytest.fixture(scope="module")
def embedder():
    return Embedder()


def test_memory_pool_upsert_is_idempotent_and_retrieval_ranks(tmp_path, embedder):
    pool = MemoryPool(str(tmp_path / "m.db"), 384)
    texts = {
        "a": "For moving a file into a folder, call mv after cd.",
        "b": "For buying stock, call place_order with symbol and amount.",
    }
    rows = [
        {"id": k, "vector": v, "text": t, "success": True, "state": "active", "meta": "{}"}
        for (k, t), v in zip(texts.items(), embedder.embed(list(texts.values())))
    ]
    pool.upsert(rows)
    pool.upsert(rows)  # a redelivered judgement is harmless
    assert pool.count() == 2
    hits = pool.search(embedder.embed(["move report.pdf into the temp folder"])[0], 2, min_score=0.0)
    assert hits[0].experience_id == "a"
    rows[0]["state"] = "quarantined"
    pool.upsert(rows[:1])
    q = embedder.embed(["move report.pdf into the temp folder"])[0]
    hits = pool.search(q, 2, min_score=0.0)
    assert "a" not in [h.experience_id for h in hits]
    # the in-process index answers like Milvus Lite itself, and is rebuilt from it on reopen
    assert [(h.experience_id, round(h.score, 2)) for h in hits] == [
        (h.experience_id, round(h.score, 2)) for h in pool.search_milvus(q, 2, min_score=0.0)
    ]
    pool.close()
    again = MemoryPool(str(tmp_path / "m.db"), 384)
    assert len(again.index) == 2 and [h.experience_id for h in again.search(q, 2, 0.0)] == ["b"]


def test_vector_index_matches_exact_cosine():
    import numpy as np

    from policies.memory.vector_index import VectorIndex

    rng = np.random.default_rng(1)
    v = rng.standard_normal((3000, 384)).astype(np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    idx = VectorIndex(384, capacity=16)  # grows by doubling
    idx.upsert([{"id": f"x{i}", "vector": v[i].tolist(), "text": str(i), "state": "active"} for i in range(3000)])
    idx.set_state("x7", "quarantined")
    for qi in (7, 100, 2999):
        q = v[qi] * 0.7 + v[(qi + 1) % 3000] * 0.3
        q /= np.linalg.norm(q)
        exact = np.argsort(-(v @ q))
        want = [f"x{i}" for i in exact if i != 7][:5]
        got = idx.search(q.tolist(), 5)
        assert [g[0] for g in got] == want
        assert all(abs(g[2] - float(v[int(g[0][1:])] @ q)) < 2e-3 for g in got)
    assert len(idx) == 3000 and idx.search(v[0].tolist(), 3, min_score=0.999)[0][0] == "x0"


@pytest.fixture(scope="module")
def engine(model_dir):
    from policies.engines.engine import TransformersEngine

    return TransformersEngine(model_dir, dtype="float32")


def test_engine_generates_and_hot_swaps(engine, tmp_path):
    import torch

    from policies.chat import render
    from policies.weights.model_store import WeightsStore

    prompt = render([ChatMessage(role="user", content="What is the capital of France?")])
    g = engine.generate([prompt], 12, temperature=0.0)[0]
    assert "Paris" in g.text and g.completion_tokens > 0
    store = WeightsStore(tmp_path)
    sd = {k: v.clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}
    sd["model.norm.weight"] = sd["model.norm.weight"] * 0.0 + 0.5  # a visibly different version
    path, digest = store.save(sd, "w-000001")
    assert store.verify(path, digest) and not store.verify(path, "0" * 64)
    ms = engine.load_weights(path, "w-000001")
    assert engine.version == "w-000001" and ms > 0
    assert torch.allclose(engine.model.model.norm.weight, torch.full_like(engine.model.model.norm.weight, 0.5))
    with pytest.raises(ValueError):
        engine.load_state_dict({"model.norm.weight": sd["model.norm.weight"]}, "w-bad")


def test_a_row_ends_at_its_own_stop_string_and_the_others_go_on(model_dir):
    from policies.chat import render
    from policies.engines.engine import TransformersEngine

    engine = TransformersEngine(model_dir, dtype="float32")  # the base's weights (the module's engine was swapped)

    prompt = render([ChatMessage(role="user", content="Count from 1 to 30, separated by commas.")])
    (full,) = engine.generate([prompt], 40, temperature=0.0)
    assert "5" in full.text and full.completion_tokens > 12
    cut, again = engine._generate([prompt, prompt], [40, 40], 0.0, 1.0, None, [("5",), ()])  # one padded batch
    assert "5" in cut.text and cut.completion_tokens < full.completion_tokens and cut.finish_reason == "stop"
    assert again.text == full.text  # its neighbour's stop string does not end it
    (one,) = engine.generate([prompt], 40, temperature=0.0, stops=("5",))  # Serve's single-prompt path (the batcher)
    assert one.text == cut.text


def test_engine_choose_only_returns_an_option(engine):
    from policies.chat import CALL_PREFIX, render

    prompt = render([ChatMessage(role="user", content="Create a new folder named budget.")]) + CALL_PREFIX
    options = ['mkdir"', 'ls"', 'list_all_files"', 'cd"']
    assert engine.choose(prompt, options) in options
    assert all(engine.choose(prompt, options, temperature=1.5) in options for _ in range(8))
    assert engine.choose(prompt, ['only_one"']) == 'only_one"'


def test_rollout_group_against_bfcl(engine):
    from envs.bfcl import BfclEnvironment
    from policies.rollout import run_group

    env = BfclEnvironment(["base"], max_turns=1, max_steps_per_turn=2)
    res = run_group(
        engine,
        env,
        env.entries("train")[0],
        2,
        max_new_tokens=24,
        temperature=1.0,
        experiences=["use ls first"],
        guided=1,
        experience_ids=["e1"],
        call_prefix=True,
    )
    assert len(res.samples) == 2
    for s in res.samples:
        assert s.messages[0].role == "system" and "use ls first" not in s.messages[0].content  # stripped
        assert s.step_indices and all(s.messages[i].role == "assistant" for i in s.step_indices)
        assert len(s.step_signals) == len(s.step_indices) and 0.0 <= s.outcome <= 1.0
    assert res.samples[0].guided and res.samples[0].experience_ids == ["e1"] and not res.samples[1].guided


def test_learner_step_changes_weights_and_checkpoint_resumes(settings, model_dir):
    import torch

    from policies.learning.checkpoint import CheckpointStore, applied_ids
    from policies.learning.trainer import Trainer

    settings.learner.lr = 1e-4
    t = Trainer(settings, model_dir)

    def sample(answer, guided=False):
        return Sample(
            sample_id=answer,
            messages=[
                ChatMessage(role="system", content="s"),
                ChatMessage(role="user", content="2+2?"),
                ChatMessage(role="assistant", content=answer),
            ],
            step_indices=[2],
            guided=guided,
            experiences=["add the numbers"] if guided else [],
        )

    g = Judgement(
        group_id="g",
        source="live",
        task_id="t",
        samples=[sample("4", True), sample("5", True)],
        outcomes=[1.0, -1.0],
        step_labels=[["GOOD"], ["BAD"]],
        source_event_ids=["a", "b"],
    )
    before = t.model.model.norm.weight.detach().clone()
    stats = t.train_step([g])
    assert stats["samples"] == 2 and stats["grad_norm"] > 0
    assert stats["guided_samples"] == 2 and stats["boosted_samples"] == 1  # only the guided success is boosted
    assert not torch.equal(before, t.model.model.norm.weight)
    t.applied = applied_ids(t.applied, t.step, ["a", "b"])
    t.version = "w-000001"
    ck = CheckpointStore(settings.state / "learner")
    ck.save(t.state(), t.step, t.version)
    t2 = Trainer(settings, model_dir)
    state, man, _ = ck.load()
    t2.load_state(state)
    assert man["version"] == "w-000001" and t2.step == 1 and t2.applied == {"a": 1, "b": 1}
    assert torch.equal(t2.model.model.norm.weight, t.model.model.norm.weight)


async def test_navigator_rebuilds_memory_from_the_stream(settings, nats_server, tmp_path):
    import uuid

    from actors.bus import Bus
    from actors.events import Experience
    from actors.navigator import Navigator

    p = "n" + uuid.uuid4().hex[:8]
    settings.nats.stream, settings.nats.subject_prefix = p.upper(), p
    bus = await Bus(nats_server.url, nats_server.user, nats_server.password, stream=p.upper(), prefix=p).connect()
    for i in range(5):
        await bus.publish(
            Experience(
                experience_id=f"e{i}",
                text=f"For a request like task {i}: calling ls worked.",
                when=f"task {i}",
                success=True,
                origin="env",
            )
        )
    nav = Navigator(settings)
    await nav.start()  # a fresh state dir: the Milvus pool is empty, the stream has 5 experiences
    try:
        assert nav.rebuilt == 5 and nav.pool.count() == 5
        again = await nav.rebuild_if_needed()
        assert again == 0  # consistent now: nothing to do
    finally:
        await nav.shutdown()
        await bus.close()
