"""Pins the GRPO maths (verl's estimator and loss) to hand-computed values."""

import math

import pytest
import torch

from actors.events import ChatMessage, Sample
from policies.learning import grpo


def test_group_advantages_match_hand_computation():
    # one group of 3 with scores [1, 0, 0]: mean 1/3, unbiased std sqrt(1/3)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [0, 1, 1]])
    adv = grpo.advantages([1.0, 0.0, 0.0], ["g", "g", "g"], mask)
    std = math.sqrt(((2 / 3) ** 2 + 2 * (1 / 3) ** 2) / 2)
    assert torch.allclose(adv[0], torch.tensor([(2 / 3) / std] * 2 + [0.0]), atol=1e-4)
    assert torch.allclose(adv[1], torch.tensor([(-1 / 3) / std] * 3), atol=1e-4)
    assert adv[2, 0] == 0.0


def test_groups_are_normalised_separately_and_equal_scores_give_zero():
    mask = torch.ones(4, 2, dtype=torch.long)
    adv = grpo.advantages([1.0, 1.0, 0.0, 1.0], ["a", "a", "b", "b"], mask)
    assert torch.all(adv[:2] == 0)
    assert adv[2, 0] < 0 < adv[3, 0]


def test_policy_loss_is_minus_mean_advantage_on_policy():
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    adv = torch.tensor([[0.0, 2.0, 2.0], [-1.0, -1.0, 0.0]])
    lp = torch.zeros(2, 3, requires_grad=True)
    loss, metrics = grpo.policy_loss(lp.detach(), lp, adv, mask)
    assert abs(float(loss) - (-(2 + 2 - 1 - 1) / 4)) < 1e-6
    loss.backward()
    assert lp.grad[0, 0] == 0 and lp.grad[0, 1] < 0 < lp.grad[1, 0]
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_clipping_uses_the_decoupled_upper_bound():
    mask = torch.ones(1, 1)
    adv = torch.ones(1, 1)
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(1.5), requires_grad=True)  # ratio 1.5 > 1 + 0.28
    loss, m = grpo.policy_loss(old, new, adv, mask, clip_low=0.2, clip_high=0.28)
    assert abs(float(loss) + 1.28) < 1e-5 and m["actor/pg_clipfrac"] == 1.0


class _Tok:
    """Character-level stand-in tokenizer with offsets (keeps the test free of model files)."""

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        return {"input_ids": [ord(c) % 251 for c in text], "offset_mapping": [(i, i + 1) for i in range(len(text))]}


def test_tokenize_marks_exactly_the_assistant_steps():
    s = Sample(
        sample_id="x",
        messages=[
            ChatMessage(role="system", content="S"),
            ChatMessage(role="user", content="U"),
            ChatMessage(role="assistant", content="AB"),
            ChatMessage(role="tool", content="T"),
            ChatMessage(role="assistant", content="CD"),
        ],
    )
    t = grpo.tokenize_sample(_Tok(), s, 10_000)
    from policies.chat import assistant_spans

    text, spans = assistant_spans(s.messages)
    chosen = "".join(ch for ch, m in zip(text, t.response_mask) if m)
    assert chosen == "AB<|im_end|>CD<|im_end|>"
    assert sorted(set(t.step_ids) - {-1}) == [0, 1]


def test_only_the_samples_own_steps_are_trained():
    """A live sample of a conversation's second request: the first request's tool call is context; the answer
    being rated is the one step, and its advantage lands on its own tokens."""
    s = Sample(
        sample_id="x",
        step_indices=[4],
        messages=[
            ChatMessage(role="system", content="S"),
            ChatMessage(role="user", content="U"),
            ChatMessage(role="assistant", content="AB"),
            ChatMessage(role="tool", content="T"),
            ChatMessage(role="assistant", content="CD"),
        ],
    )
    t = grpo.tokenize_sample(_Tok(), s, 10_000)
    from policies.chat import render

    text = render(s.messages, add_generation_prompt=False)
    assert "".join(ch for ch, m in zip(text, t.response_mask) if m) == "CD<|im_end|>"
    assert sorted(set(t.step_ids) - {-1}) == [0]
    from policies.learning import adca

    adv = adca.token_advantages([t.step_ids], [[-1.0]], len(t.step_ids))[0]
    assert [ch for ch, a in zip(text, adv.tolist()) if a] == list("CD<|im_end|>")


def test_keep_and_strip_modes_really_differ():
    """AgentEvolver's two modes end up identical through a metadata key bug; ours must not."""
    s = Sample(
        sample_id="x",
        messages=[
            ChatMessage(role="system", content="S"),
            ChatMessage(role="user", content="U"),
            ChatMessage(role="assistant", content="AB"),
        ],
        guided=True,
        experiences=["call mv after cd"],
    )
    strip, keep = grpo.tokenize_sample(_Tok(), s, 10_000), grpo.tokenize_sample(_Tok(), s, 10_000, keep_experience=True)
    strip_text, keep_text = "".join(map(chr, strip.input_ids)), "".join(map(chr, keep.input_ids))
    assert "call mv after cd" in keep_text and "call mv after cd" not in strip_text
    assert "Experience" not in strip_text
    # the trained tokens are the same action either way
    assert [c for c, m in zip(strip_text, strip.response_mask) if m] == [c for c, m in zip(keep_text, keep.response_mask) if m]


def test_selective_boosting_only_for_guided_positive_samples():
    assert grpo.sample_clip_high(0.28, True, 0.5, 0.6) == 0.6
    assert grpo.sample_clip_high(0.28, True, -0.5, 0.6) == 0.28
    assert grpo.sample_clip_high(0.28, False, 0.5, 0.6) == 0.28
    assert grpo.sample_clip_high(0.28, True, 0.5, 0.0) == 0.28  # disabled
    assert grpo.sample_clip_high(0.3, True, 0.0, 0.6) == 0.3  # zero advantage is not positive


def test_off_policy_loss_matches_luffy_by_hand():
    """loss_t = -A f(pi), f(x) = x / (x + gamma); d loss / d log pi = -A gamma pi / (pi + gamma)^2."""
    import math

    lp = torch.tensor([[0.0, math.log(0.1), math.log(0.9)]], requires_grad=True)
    adv = torch.tensor([[2.0, 2.0, -1.0]])
    mask = torch.tensor([[0, 1, 1]])
    loss = grpo.off_policy_loss(lp, adv, mask, gamma=0.1)
    # token 1: pi 0.1 -> f 0.5 -> -2 * 0.5 = -1.0; token 2: pi 0.9 -> f 0.9 -> +0.9; token-mean over 2 tokens
    assert float(loss) == pytest.approx((-1.0 + 0.9) / 2)
    loss.backward()
    g = lp.grad[0]
    assert float(g[0]) == 0.0  # masked
    assert float(g[1]) == pytest.approx(-2.0 * 0.1 * 0.1 / 0.2**2 / 2)  # -0.25
    assert float(g[2]) == pytest.approx(1.0 * 0.1 * 0.9 / 1.0**2 / 2)  # +0.045


def test_a_reference_in_an_all_failed_group_gets_the_only_positive_advantage():
    """Mixed-policy group normalisation (LUFFY): four failures and one verified reference."""
    from policies.learning import adca

    adv = adca.step_advantages([["BAD"]] * 4 + [["GOOD"]], [0.0] * 4 + [1.0], alpha=0.0)
    # outcomes mean 0.2, population std 0.4 -> failures -0.5, reference +2.0
    assert [a[0] for a in adv] == pytest.approx([-0.5] * 4 + [2.0])


def test_shared_prefix_counts_the_common_leading_tokens():
    rows = torch.tensor([[1, 2, 3, 4, 0], [1, 2, 3, 5, 6], [1, 2, 3, 4, 7]])
    assert grpo.shared_prefix(rows, [4, 5, 5]) == 3
    assert grpo.shared_prefix(rows[[0, 2]], [4, 5]) == 4  # all of the shorter row
    assert grpo.shared_prefix(rows[:1], [4]) == 0  # one row shares nothing
    assert grpo.shared_prefix(torch.tensor([[9, 1], [8, 1]]), [2, 2]) == 0


@pytest.mark.parametrize("bf16", [False, True])
def test_a_shared_prompt_and_a_late_head_give_the_same_logprobs_and_gradients(bf16):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=100,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )
    prompt = torch.randint(0, 100, (12,)).tolist()
    rows = [prompt + torch.randint(0, 100, (k,)).tolist() for k in (5, 9, 3, 1)]
    lens = [len(r) for r in rows]
    ids, attn = grpo.pad(rows, 0), grpo.pad([[1] * n for n in lens], 0)
    shared = grpo.shared_prefix(ids, lens)
    assert shared == 12
    tol = dict(atol=5e-4, rtol=2e-2) if bf16 else dict(atol=1e-5, rtol=1e-4)
    for start in (1, 5, 12, 13, 15):  # the head from the prompt's middle, its end, or inside the answers
        mask = torch.zeros(len(rows), ids.shape[1])
        for i, n in enumerate(lens):
            mask[i, start:n] = 1
        out = []
        for kw in ({}, {"shared": shared, "start": start}):
            model.zero_grad()
            lp = grpo.token_logprobs(model, ids, attn, bf16, **kw)
            (lp * mask).sum().backward()
            out.append((lp.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
        (full, g_full), (fast, g_fast) = out
        assert fast.shape == full.shape and not fast[:, :start].any()  # no head before `start`
        torch.testing.assert_close(fast * mask, full * mask, **tol)
        assert g_fast.keys() == g_full.keys()
        for n in g_full:  # bf16 rounds single elements differently: compare each gradient as a whole
            assert float((g_fast[n] - g_full[n]).norm()) <= tol["rtol"] * float(g_full[n].norm()) + 1e-7, n
