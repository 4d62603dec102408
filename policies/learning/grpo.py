"""GRPO on judged groups, on top of verl's core algorithms.

Pure functions the learner calls:
- `tokenize_sample()`: full ChatML text -> token ids, a response mask over assistant tokens and
  the step index of every token (so a step's advantage reaches all its tokens).
- `advantages()`: group-normalised outcome advantages from verl's
  `compute_grpo_outcome_advantage` (score_i - mean_g) / (std_g + eps), broadcast to tokens.
- `policy_loss()`: verl's registered "vanilla" clipped PPO loss with decoupled clip ranges
  (clip_ratio_low / clip_ratio_high as in DAPO / AgentEvolver), optionally weighted per token by
- `is_weights()`: verl's truncated importance weights min(pi_prox / pi_behav, C) for samples that
  older weights generated (token-level TIS), and
- `off_policy_loss()`: LUFFY's mixed-policy term for verified reference trajectories (no verl
  counterpart): the shaped probability f(pi) = pi / (pi + gamma), unclipped,
- `kl_loss()`: verl's KL estimator to the reference policy, token-mean aggregated.
- `token_logprobs()`: log p(token_t | prefix) for every position.
Nothing here re-implements what verl provides.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch

from actors.events import Sample
from policies.chat import assistant_spans

warnings.filterwarnings("ignore", message=".*deprecated.*", category=FutureWarning)


@dataclass
class Tokenized:
    input_ids: list[int]
    response_mask: list[int]  # 1 on tokens the policy produced
    step_ids: list[int]  # step index per token, -1 outside assistant spans


def tokenize_sample(tok, sample: Sample, max_tokens: int, keep_experience: bool = False) -> Tokenized:
    """Strip mode (default): the training text is what the policy would see without guidance.
    Keep mode: a guided sample is trained in the context it was generated in, experiences included."""
    # only the sample's own steps are trained (step k = its k-th step index): a live sample of a conversation's
    # second request carries the first request's answer as context, and training that too would give the earlier
    # answer this one's advantage (a rated pair of the same conversation then cancelled exactly)
    text, spans = assistant_spans(
        sample.messages, sample.tools, sample.experiences if keep_experience else None, only=list(sample.step_indices) or None
    )
    enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    step_ids = []
    for s, e in offsets:
        step = -1
        for k, (a, b) in enumerate(spans):
            if s >= a and e <= b and e > s:
                step = k
                break
        step_ids.append(step)
    mask = [1 if k >= 0 else 0 for k in step_ids]
    if len(ids) > max_tokens:  # keep the end: the actions being trained sit there
        ids, mask, step_ids = ids[-max_tokens:], mask[-max_tokens:], step_ids[-max_tokens:]
    return Tokenized(ids, mask, step_ids)


def sample_clip_high(clip_high: float, guided: bool, advantage: float, boost: float) -> float:
    """Selective boosting (AgentEvolver): a guided sample whose advantage is positive may move its
    tokens' probability further up (upper clip `boost`, 0.6 by default); all others keep `clip_high`."""
    return max(clip_high, boost) if guided and boost > 0 and advantage > 0 else clip_high


def advantages(scores: list[float], group_index: list[str], response_mask: torch.Tensor, epsilon: float = 1e-6) -> torch.Tensor:
    """Outcome advantages per token [B, T] via verl's GRPO estimator (score on the last valid token)."""
    from verl.trainer.ppo.core_algos import compute_grpo_outcome_advantage

    rewards = torch.zeros_like(response_mask, dtype=torch.float32)
    for i, s in enumerate(scores):
        valid = response_mask[i].nonzero()
        if len(valid):
            rewards[i, valid[-1]] = float(s)
    adv, _ = compute_grpo_outcome_advantage(
        rewards, response_mask.float(), np.array(group_index, dtype=object), epsilon=epsilon, norm_adv_by_std_in_grpo=True
    )
    return adv


@lru_cache(maxsize=8)
def _actor_config(clip_low: float, clip_high: float, loss_agg_mode: str):
    from verl.workers.config import ActorConfig

    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        clip_ratio=clip_low,
        clip_ratio_low=clip_low,
        clip_ratio_high=clip_high,
        ppo_micro_batch_size_per_gpu=1,
        loss_agg_mode=loss_agg_mode,
    )


def policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    adv: torch.Tensor,
    response_mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    loss_agg_mode: str = "token-mean",
    is_weights: torch.Tensor | None = None,
):
    """verl's vanilla PPO-clip loss (ratio to `old_log_prob` = pi_prox), each token's term scaled by its
    importance weight when given; returns (loss, metrics)."""
    from verl.trainer.ppo.core_algos import get_policy_loss_fn

    fn = get_policy_loss_fn("vanilla")
    cfg = _actor_config(clip_low, clip_high, loss_agg_mode)
    loss, metrics = fn(
        old_log_prob, log_prob, adv, response_mask.float(), loss_agg_mode=loss_agg_mode, config=cfg, rollout_is_weights=is_weights
    )
    return loss, {k: float(v) for k, v in metrics.items()}


def is_weights(
    prox_log_prob: torch.Tensor, behav_log_prob: torch.Tensor, response_mask: torch.Tensor, threshold: float = 2.0
) -> tuple[torch.Tensor, dict]:
    """Decoupled-PPO correction (AReaL) with verl's token-level truncated IS: w = min(pi_prox / pi_behav, C),
    zero on padding. Equal log-probs (on-policy samples) give w = 1."""
    from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_weights

    w, metrics = compute_rollout_correction_weights(
        prox_log_prob - behav_log_prob, response_mask.float(), rollout_is="token", rollout_is_threshold=threshold
    )
    return w.detach(), {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def off_policy_loss(
    log_prob: torch.Tensor, adv: torch.Tensor, response_mask: torch.Tensor, gamma: float = 0.1, loss_agg_mode: str = "token-mean"
) -> torch.Tensor:
    """Mixed-policy GRPO for off-policy reference tokens (LUFFY, arXiv 2504.14945, eq. 6):
        loss_t = -A_t * f(pi_theta(y_t)),   f(x) = x / (x + gamma)
    The reference came from no policy we can score, so its behaviour probability is taken as 1 and the
    importance ratio is pi_theta itself; there is no clip (the ratio is already in [0, 1]). The shaping's
    gradient, gamma * pi / (pi + gamma)^2 * grad log pi, peaks at pi = gamma: tokens the policy finds
    unlikely but not hopeless get the most weight, where a plain ratio (gradient pi * grad log pi) would
    ignore them and SFT (weight 1) would let them dominate. Aggregated like the on-policy loss."""
    from verl.trainer.ppo.core_algos import agg_loss

    p = log_prob.exp()
    return agg_loss(-adv * p / (p + gamma), response_mask.float(), loss_agg_mode)


def kl_loss(
    log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kind: str = "low_var_kl"
) -> torch.Tensor:
    """Token-mean KL(pi || pi_ref) estimate (verl's `kl_penalty`; low_var_kl is Schulman's k3)."""
    from verl.trainer.ppo.core_algos import agg_loss, kl_penalty

    return agg_loss(kl_penalty(log_prob, ref_log_prob, kind), response_mask.float(), "token-mean")


def token_logprobs(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, bf16: bool = False, shared: int = 0, start: int = 1
) -> torch.Tensor:
    """[B, T] log-probs of each token given its prefix; positions before `start` get 0 (a prompt needs no
    output projection: at BFCL's ~850-token prompts that is most of the head's cost). `shared` = the
    length of a prefix every row holds (a group's prompt): the body runs it once and the rows continue
    from its key/value cache, gradients included. With `bf16`, the transformer body runs under bfloat16
    autocast (about 1.5x faster on CPUs with AVX512-BF16) while the output projection and the
    log-softmax stay in float32, so log-probs keep their precision."""
    inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # a LoRA (peft) model
    B, T = input_ids.shape
    start = max(1, min(start, T))
    if not (hasattr(inner, "lm_head") and hasattr(inner, "model")):
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, start - 1 : -1].float()
    else:
        with torch.autocast(input_ids.device.type, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            h = _hidden(inner, input_ids, attention_mask, shared, start)
        head = inner.lm_head  # in float32 even when the frozen base is bf16 (LoRA)
        if bf16:
            logits = torch.nn.functional.linear(h.float(), head.weight.float(), None if head.bias is None else head.bias.float())
        else:
            logits = head(h).float()
    lp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, start:].unsqueeze(-1)).squeeze(-1)
    return torch.cat([torch.zeros_like(input_ids[:, :start], dtype=lp.dtype), lp], dim=1)


def _hidden(inner, ids: torch.Tensor, attn: torch.Tensor, shared: int, start: int) -> torch.Tensor:
    """Hidden states at positions start-1 .. T-2 (those that predict tokens start .. T-1)."""
    B, T = ids.shape
    checkpointing = getattr(inner, "is_gradient_checkpointing", False) and torch.is_grad_enabled()
    shared = min(shared, T - 1)
    if B == 1 or shared < 2 or checkpointing:  # (checkpointing turns the cache off)
        return inner.model(input_ids=ids, attention_mask=attn).last_hidden_state[:, start - 1 : -1]
    pre = inner.model(input_ids=ids[:1, :shared], attention_mask=attn[:1, :shared], use_cache=True)
    cache = pre.past_key_values
    cache.batch_repeat_interleave(B)
    rest = inner.model(input_ids=ids[:, shared:], attention_mask=attn, past_key_values=cache, use_cache=True).last_hidden_state
    if start - 1 >= shared:  # rest[:, j] is position shared + j
        return rest[:, start - 1 - shared : T - 1 - shared]
    return torch.cat([pre.last_hidden_state[:, start - 1 :].expand(B, -1, -1), rest], dim=1)[:, : T - start]


def shared_prefix(rows: torch.Tensor, lengths: list[int]) -> int:
    """How many leading tokens every row of `rows` [B, T] has in common (within each row's length)."""
    n = min(lengths)
    if rows.shape[0] < 2 or n == 0:
        return 0
    same = (rows[:, :n] == rows[:1, :n]).all(dim=0)
    return n if bool(same.all()) else int(same.int().argmin())


def fit_width(row: torch.Tensor, width: int) -> torch.Tensor:
    """A per-sample [T] row cut or zero-padded to `width` (past the sample's length its mask is 0)."""
    return row[:width] if len(row) >= width else torch.nn.functional.pad(row, (0, width - len(row)))


def pad(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def is_stats(weights: list[torch.Tensor]) -> dict:
    """Mean, max and min of a step's truncated importance weights (none: {})."""
    if not weights:
        return {}
    w = torch.cat(weights)
    return {"is_mean": float(w.mean()), "is_max": float(w.max()), "is_min": float(w.min())}
