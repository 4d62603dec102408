"""The held-out scorers' batched generation (policies/engines/shared_decode.py) on a tiny random model: greedy gives the
tokens `model.generate` gives, and every sampled token is drawn from the distribution `generate` draws from."""

import pytest

from policies.engines import shared_decode
from policies.engines.shared_decode import common_prefix

SYSTEM = "<|im_start|>system\nYou solve problems with Python.<|im_end|>\n"


def _prompts():
    asks = ["What is 2 + 3?", "What is 40265 + 63807?", "Compute 7 * 6 + 1.", "What is 2 + 3?", "Hi"]
    return [f"{SYSTEM}<|im_start|>user\n{a}<|im_end|>\n<|im_start|>assistant\n" for a in asks]


@pytest.fixture(scope="module")
def engine(tiny_dir):
    from policies.engines.engine import TransformersEngine

    return TransformersEngine(tiny_dir, dtype="float32", threads=1)


def test_common_prefix_leaves_a_token_of_every_row():
    assert common_prefix([[1, 2, 3, 4], [1, 2, 5], [1, 2, 3, 9]]) == 2
    assert common_prefix([[1, 2, 3], [1, 2, 3]]) == 2
    assert common_prefix([[7], [7, 8]]) == 0
    assert common_prefix([[1, 2], [3, 4]]) == 0


@pytest.mark.parametrize("attention", ["sdpa", "eager"])  # eager: the eval role's on CPU (policies/engines/roles.py)
def test_greedy_gives_the_tokens_generate_gives(engine, attention):
    prompts = _prompts() * 2  # repeats, distinct lengths, rows of different budgets that leave at different steps
    budgets = [3, 17, 9, 24, 1, 12, 24, 5, 20, 2]
    runs = {}
    engine.model.set_attn_implementation(attention)
    for shared in (False, True):
        engine.share_prefill = shared
        runs[shared] = engine._generate(prompts, budgets, 0.0, 1.0, None)
    engine.share_prefill = False
    engine.model.set_attn_implementation("sdpa")
    assert [(g.text, g.completion_tokens, g.finish_reason, g.prompt_tokens) for g in runs[True]] == [
        (g.text, g.completion_tokens, g.finish_reason, g.prompt_tokens) for g in runs[False]
    ]
    assert [g.completion_tokens for g in runs[True]] == budgets  # a random model never stops by itself here


def test_each_sampled_token_is_drawn_from_the_full_forwards_distribution(engine, monkeypatch):
    import torch

    tok, model = engine.tok, engine.model
    rows = [tok(p, add_special_tokens=False)["input_ids"] for p in _prompts()] * 3
    budgets = [2 + i % 7 for i in range(len(rows))]
    seen = []
    draw = shared_decode.draw
    monkeypatch.setattr(
        shared_decode, "draw", lambda torch, logits, t, p: seen.append(logits.clone()) or draw(torch, logits, t, p)
    )
    torch.manual_seed(3)
    with torch.inference_mode():
        out = shared_decode.decode(model, torch, rows, budgets, 0.9, 0.95, (), tok.pad_token_id, "cpu")
        assert [len(o) for o in out] == budgets
        assert len(seen) == max(budgets)
        for step, logits in enumerate(seen):
            alive = [i for i in range(len(rows)) if len(out[i]) > step]  # the rows of this step, in batch order
            assert logits.shape[0] == len(alive)
            for j, i in enumerate(alive):
                ids = torch.tensor([rows[i] + out[i][:step]])
                want = model(input_ids=ids).logits[0, -1].float()
                assert torch.allclose(logits[j], want, atol=1e-4), (step, i)


def test_a_draw_samples_the_nucleus_generate_samples():
    """`draw` finds the top-p nucleus among a row's most likely tokens (else in the whole vocabulary): the same
    support and probabilities as transformers' warpers, for a peaked, a middling and a flat row."""
    import torch
    from transformers.generation.logits_process import TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(3, 40) * torch.tensor([[4.0], [1.0], [0.2]])
    n = 20000
    for candidates in ((8,), (4, 16), (64,)):  # the flat row's nucleus is wider than 16: the whole vocabulary
        for row in logits:
            want = torch.softmax(TopPLogitsWarper(top_p=0.9)(None, row[None] / 0.7), dim=-1)[0]
            got = shared_decode.draw(torch, row.repeat(n, 1), 0.7, 0.9, candidates=candidates)
            freq = torch.bincount(got, minlength=40).float() / n
            assert (freq[want == 0] == 0).all()
            assert (freq - want).abs().max() < 0.015


def test_only_the_scorers_and_the_explorers_engines_share_prefills(tmp_path, tiny_dir):
    """The guard, `main.py report` and the benchmarks' scoring make their engine with role "eval" (shared prefills,
    eager attention on CPU); the explorer's shares prefills with the default attention; serving (its streaming and
    batcher), the gate and the judge keep `model.generate` and transformers' default attention."""
    from config.settings import load_settings
    from policies.engines.roles import make_engine

    s = load_settings(None)
    s.state_dir = str(tmp_path / "state")
    scorer = make_engine(s, tiny_dir, role="eval")
    assert scorer.share_prefill and scorer.model.config._attn_implementation == "eager"
    explorer = make_engine(s, tiny_dir, role="explorer")
    assert explorer.share_prefill and explorer.model.config._attn_implementation == "sdpa"
    others = [make_engine(s, tiny_dir, role=r) for r in ("serve", "gate", "judge")]
    assert not any(e.share_prefill for e in others)
    assert {e.model.config._attn_implementation for e in others} == {"sdpa"}
