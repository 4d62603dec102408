"""The weights and task lifecycle tables, and the promotion gate."""

import math

import pytest

from actors.lifecycles import IllegalTransition, task_transition, transition
from actors.lifecycles import TaskState as T
from actors.lifecycles import WeightsState as S
from policies.promotion.gate import gate
from policies.promotion.models import GateScore as G


def test_lifecycle_allows_the_documented_paths_only():
    for path in (
        [S.STAGED, S.EVALUATING, S.CANARY, S.LIVE, S.RETIRED],
        [S.STAGED, S.EVALUATING, S.REJECTED],
        [S.STAGED, S.SUPERSEDED],
        [S.STAGED, S.EVALUATING, S.CANARY, S.ROLLED_BACK],
        [S.STAGED, S.EVALUATING, S.LIVE, S.ROLLED_BACK],
        [S.STAGED, S.EVALUATING, S.LIVE, S.RETIRED, S.LIVE],
    ):
        state = None
        for nxt in path:
            state = transition(state, nxt)
        assert state == path[-1]
    assert transition(None, S.LIVE) == S.LIVE  # the base model, or an operator's forced version
    for bad in [
        (S.STAGED, S.CANARY),
        (S.REJECTED, S.CANARY),
        (S.EVALUATING, S.RETIRED),
        (S.ROLLED_BACK, S.CANARY),
        (None, S.EVALUATING),
        (S.LIVE, S.CANARY),
    ]:
        with pytest.raises(IllegalTransition):
            transition(*bad)


def test_task_lifecycle_allows_the_documented_paths_only():
    for path in ([None, T.PROPOSED, T.VERIFIED, T.ACTIVE, T.ACTIVE, T.RETIRED], [None, T.PROPOSED, T.REJECTED]):
        for a, b in zip(path, path[1:]):
            assert task_transition(a, b) == b
    for a, b in (
        (None, T.ACTIVE),
        (T.PROPOSED, T.ACTIVE),
        (T.REJECTED, T.VERIFIED),
        (T.RETIRED, T.ACTIVE),
        (T.VERIFIED, T.RETIRED),
    ):
        with pytest.raises(IllegalTransition):
            task_transition(a, b)


def test_gate_needs_both_success_and_reference_likelihood():
    live = G(success=0.25, nll=1.20)
    assert gate(G(success=0.25, nll=1.21), live, 0.05, 0.05)[0]
    assert gate(G(success=0.22, nll=1.10), live, 0.05, 0.05)[0]  # within tolerance
    ok, why = gate(G(success=0.0, nll=1.10), live, 0.05, 0.05)
    assert not ok and "held-out success 0.000 < live 0.250" in why
    ok, why = gate(G(success=0.5, nll=3.0), live, 0.05, 0.05)  # damaged weights, even if lucky on tasks
    assert not ok and "reference NLL 3.000 > live 1.200" in why
    assert gate(G(success=0.0), G(success=0.0), 0.05, 0.05)[0]  # no reference actions: success alone


def test_gate_stops_a_ratchet_of_small_drifts_from_the_base():
    from policies.promotion.gate import clearly_worse, gate

    base, live = G(success=0.0, nll=1.19), G(success=0.0, nll=1.30)
    cand = G(success=0.0, nll=1.34)  # within 0.05 of live, 0.15 above the base
    ok, why = gate(cand, live, 0.05, 0.05)
    assert ok  # live alone lets it through
    ok, why = gate(cand, live, 0.05, 0.05, base, 0.12)
    assert not ok and "drift" in why and "base 1.190" in why
    assert "drift" in clearly_worse(cand, live, 0.05, base, 0.12)
    assert clearly_worse(G(success=0.0, nll=1.25), live, 0.05, base, 0.12) is None


def test_reference_likelihood_runs_shared_prompt_prefixes_once_and_matches_a_full_forward(untied_dir):
    """The gate's NLL scoring reuses the KV cache over prompts that start alike and computes only the
    continuation's logits; each pair's log-probability equals a plain forward of that pair alone."""
    import torch

    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(untied_dir, dtype="float32")
    system = "<|im_start|>system\nYou can call: add(a, b), mul(a, b), div(a, b).<|im_end|>\n<|im_start|>user\n"
    pairs = [
        (system + "What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", "add(2, 3)<|im_end|>"),
        ("<|im_start|>user\nhi<|im_end|>\n", "hello<|im_end|>"),
        (system + "What is 4 * 5?<|im_end|>\n<|im_start|>assistant\n", "mul(4, 5)<|im_end|>"),
        (system + "What is 2 + 3?<|im_end|>\n<|im_start|>assistant\n", "The answer is 5."),  # same prompt
        (system + "What", " is 2 + 3?"),  # a prompt that is a prefix of the others
        ("x", ""),
    ]
    fed = []
    forward = eng.model.forward
    eng.model.forward = lambda *a, **k: (fed.append(k["input_ids"].shape[1]), forward(*a, **k))[1]
    got = eng.sequence_logprobs(pairs)
    eng.model.forward = forward
    ids = [
        (eng.tok(p, add_special_tokens=False)["input_ids"], eng.tok(c, add_special_tokens=False)["input_ids"]) for p, c in pairs
    ]
    with torch.inference_mode():
        for (p, c), (lp, n) in zip(ids, got):
            assert n == len(c)
            if not c:
                assert lp == 0.0
                continue
            logits = eng.model(input_ids=torch.tensor([p + c])).logits[0, len(p) - 1 : -1]
            want = float(torch.log_softmax(logits, -1).gather(-1, torch.tensor(c).unsqueeze(-1)).sum())
            assert lp == pytest.approx(want, abs=1e-3)
    total = sum(len(p) + len(c) for p, c in ids[:5])
    saved = total - sum(fed)  # the repeated prompt alone saves all its tokens but the last; shared prefixes more
    assert len(fed) == 5 and saved > len(ids[0][0]) + len(ids[4][0])
    with pytest.raises(ValueError, match="non-empty prompt"):
        eng.sequence_logprobs([("", "x")])


def _fake_gate(monkeypatch, scores, outcome, call):
    """`GateScores` over a fake engine whose greedy episode on entry `e<i>` of `env` scores `outcome(version,
    env, i)`; returns (scores, score(version, ...), the episodes run as `call(version, env, ids)`, gate settings)."""
    from types import SimpleNamespace

    import policies.rollout as rollout

    calls = []

    def evaluate(engine, env, ids, k, **kw):
        calls.append(call(engine.version, env, ids))
        return {"entries": {i: [outcome(engine.version, env, int(i[1:]))] for i in ids}}

    class Engine:
        version = "live"

        def load_weights(self, path, version):
            self.version = version

    monkeypatch.setattr(rollout, "evaluate", evaluate)
    engine = Engine()

    def score(v, success=True, counts=None):
        return scores.score(engine, v, lambda: "unused", success, counts)

    return (
        scores,
        score,
        calls,
        SimpleNamespace(tolerance=0.05, nll_tolerance=0.05, base_nll_tolerance=math.inf, success_alpha=1.0),
    )


def test_a_second_look_on_more_entries_decides_when_the_candidate_falls_short_on_the_first(tmp_path, monkeypatch):
    """Live went live because it did well on the first entries: one greedy flip there must not reject every
    successor. Both versions are scored on more entries (live's once: cached on disk), and that decides."""
    from policies.promotion.gate import GateScores, decide

    outcomes = {"live": [1, 1, 0, 0, 0, 0], "good": [1, 0, 1, 1, 0, 0], "bad": [1, 0, 0, 0, 0, 0], "same": [1, 1, 0, 0, 0, 0]}
    ids = [f"e{i}" for i in range(6)]
    path = tmp_path / "evals.json"
    scores, score, calls, g = _fake_gate(
        monkeypatch,
        GateScores(path, {"code": None}, {"code": ids}, [], max_new_tokens=8, call_prefix=True, first=2),
        lambda v, env, i: outcomes[v][i],
        lambda v, env, ids: (v, tuple(ids)),
    )
    assert scores.looks == ({"code": 2}, {"code": 6})
    ok, why, cand, live = decide(score, "good", "live", g, None, *scores.looks)
    assert ok and "second look on 6 code entries" in why and "on the first 2: held-out success 0.500 < live 1.000" in why
    assert cand.success == 0.5 and live.success == pytest.approx(2 / 6)
    ok, why, cand, live = decide(score, "bad", "live", g, None, *scores.looks)
    assert not ok and why.startswith("held-out success 0.167 < live 0.333") and "second look" in why
    ok, why, cand, live = decide(score, "same", "live", g, None, *scores.looks)
    assert ok and "second look" not in why and cand.success == 1.0
    assert [c for c in calls if c[0] == "live"] == [("live", ("e0", "e1")), ("live", ("e2", "e3", "e4", "e5"))]
    assert ("same", ("e2", "e3", "e4", "e5")) not in calls
    again = GateScores(path, {"code": None}, {"code": ids}, [], max_new_tokens=8, call_prefix=True, first=2)
    assert again.view("good", {"code": 6}).flat() == {"success_code": 0.5, "success": 0.5}
    assert again.recent()["live"] == {"success_code": 1.0, "success": 1.0}


def test_episodes_that_cannot_change_the_decision_are_not_run(tmp_path, monkeypatch):
    """Where live solved none of its first entries the candidate cannot fall short: when it passes with 0 there,
    those episodes (BFCL's are the gate's longest) are skipped; when it might fail, everything runs."""
    from policies.promotion.gate import GateScores, decide

    outcomes = {
        "live": {"code": [1, 0, 0, 0], "bfcl": [0, 0, 1, 0]},
        "good": {"code": [1, 1, 0, 0], "bfcl": [1, 1, 1, 1]},
        "worse": {"code": [0, 0, 0, 0], "bfcl": [0] * 4},
        "base": {"code": [0, 0, 0, 0], "bfcl": [0] * 4},
    }
    ids = [f"e{i}" for i in range(4)]
    scores, score, calls, g = _fake_gate(
        monkeypatch,
        GateScores(
            tmp_path / "evals.json",
            {"code": "code", "bfcl": "bfcl"},
            {"code": ids, "bfcl": ids},
            [],
            max_new_tokens=8,
            call_prefix=True,
            first=2,
        ),
        lambda v, env, i: outcomes[v][env][i],
        lambda v, env, ids: (v, env, tuple(ids)),
    )
    ok, why, cand, live = decide(score, "good", "live", g, None, *scores.looks)
    assert ok and "(bfcl not run: live solved none of its first entries there)" in why
    assert cand.flat() == {"success_code": 1.0, "success": 0.5} and live.success == 0.25
    assert [c for c in calls if c[0] == "good"] == [("good", "code", ("e0", "e1"))]
    # what an idle broadcaster scores before "good" is the next gate's comparator: its first look where it is not cached
    assert (
        scores.unscored("good") == {"bfcl": 2}
        and scores.unscored("live") == {}
        and scores.unscored("new") == {"code": 2, "bfcl": 2}
    )
    # code falls short: bfcl could make up for it, so it runs, and the second look decides
    ok, why, cand, live = decide(score, "worse", "live", g, None, *scores.looks)
    assert not ok and "not run" not in why and "second look on 4 code entries" in why
    assert ("worse", "bfcl", ("e0", "e1")) in calls and cand.envs["bfcl"] == 0.0
    # live solved nothing anywhere: the candidate cannot fall short, only its likelihood is checked
    n = len(calls)
    ok, why, cand, live = decide(score, "good", "base", g, None, *scores.looks)
    assert ok and "code, bfcl not run" in why and cand.success == 0.0 and len(calls) == n + 2  # base's own
    assert all(c[0] == "base" for c in calls[n:])


def test_drop_p_is_the_one_sided_exact_sign_flip_p():
    from policies.promotion.gate import drop_p

    assert drop_p([0] * 8, [1] * 5 + [0] * 3) == pytest.approx(1 / 32)  # 5 entries lost, none won
    assert drop_p([1, 0, 0, 0], [1, 1, 0, 0]) == pytest.approx(0.5)  # one flip out of one: a coin
    assert drop_p([0, 1, 0, 1, 0, 0], [1, 0, 1, 1, 0, 0]) == pytest.approx(0.5)  # lost 2, won 1: 4 of 8 sign sets
    assert drop_p([0, 1], [1, 0]) == 1.0 and drop_p([0, 0], [1, 0]) == pytest.approx(0.5)  # a win offsets a loss
    assert drop_p([1, 0], [1, 0]) == 1.0  # the same outcomes: no evidence
    assert drop_p([1, 1, 0], [0, 0, 0]) == 1.0  # the candidate is above live there


def test_the_deciding_look_rejects_on_success_only_for_a_significant_drop(tmp_path, monkeypatch):
    """The hour that stalled: live had 2 of the 8 second-look entries, each successor 1, and every one was
    rejected for the last 20 minutes. With `success_alpha` a one-entry drop passes (the likelihood checks still apply);
    a version that loses five entries and wins none is still rejected."""
    from policies.promotion.gate import GateScores, decide

    outcomes = {
        "live": [1, 0, 1, 0, 0, 0, 0, 0],
        "one_less": [0, 0, 1, 0, 0, 0, 0, 0],
        "broken": [0] * 8,
        "live2": [1, 1, 1, 1, 1, 0, 0, 0],
    }
    ids = [f"e{i}" for i in range(8)]
    scores, score, calls, g = _fake_gate(
        monkeypatch,
        GateScores(tmp_path / "evals.json", {"code": None}, {"code": ids}, [], max_new_tokens=8, call_prefix=True, first=2),
        lambda v, env, i: outcomes[v][i],
        lambda v, env, ids: (v, tuple(ids)),
    )
    ok, why, cand, live = decide(score, "one_less", "live", g, None, *scores.looks)
    assert not ok and "second look on 8 code entries" in why  # the point rule (alpha 1) rejects it
    g.success_alpha = 0.05
    ok, why, cand, live = decide(score, "one_less", "live", g, None, *scores.looks, scores.drop_p)
    assert ok and "not significantly: paired p = 0.500 >= 0.05" in why and "second look on 8 code entries" in why
    assert cand.success == 0.125 and live.success == 0.25
    ok, why, cand, live = decide(score, "broken", "live2", g, None, *scores.looks, scores.drop_p)
    assert not ok and why.startswith("held-out success 0.000 < live 0.625 - 0.05 (paired p = 0.031)")
    # no second look configured: the first look decides, with the same test
    one = GateScores(tmp_path / "one.json", {"code": None}, {"code": ids[:2]}, [], max_new_tokens=8, call_prefix=True)
    sc2, score2, _, _ = _fake_gate(monkeypatch, one, lambda v, env, i: outcomes[v][i], lambda v, env, ids: (v, ids))
    ok, why, _, _ = decide(score2, "one_less", "live", g, None, *one.looks, one.drop_p)
    assert ok and "paired p = 0.500" in why
    with pytest.raises(ValueError, match="not scored on the same entries"):
        one.drop_p("one_less", "never_scored", {"code": 2})
