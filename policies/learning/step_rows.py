"""One training step's rows: judged groups flattened to one row per sample, their advantages and micro-batches.

The rows, the padded batch and the log-probs of a micro-batch under a given model: `Trainer.train_step`
(`policies/learning/trainer.py`) takes them from here, lets hindsight teach the hinted rows, and runs the forwards and
the update. Off-policy samples (`Sample.off_policy`: a verified reference trajectory added to a group no sample
solved) share the group's normalisation; ADPO's self-consistency counts only the policy's own samples, and in such a
floor group the failures' negative advantages are scaled by `learner.floor_negative_scale` (`groups.floor_scales`).
"""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field

from actors.events import Judgement
from policies.learning import adca, grpo
from policies.learning.groups import baseline, floor_scales, step_credit

# one step's samples, padded: token ids, attention mask, each sample's length and its first response token
Batch = namedtuple("Batch", "ids attn lens first")


@dataclass
class Rows:
    """Per sample (one row each, in group order): what the step needs beside the model."""

    samples: list = field(default_factory=list)  # tokenized samples (grpo.tokenize_sample)
    scores: list[float] = field(default_factory=list)
    index: list[str] = field(default_factory=list)  # the group id of each row
    step_adv: list = field(default_factory=list)  # ADCA step-level advantages (learner.adca_alpha > 0)
    scale: list[float] = field(default_factory=list)  # ADPO's per-group scale
    clip_high: list[float] = field(default_factory=list)
    guided: list[bool] = field(default_factory=list)
    versions: list[str] = field(default_factory=list)  # the version that generated each sample
    off: list[bool] = field(default_factory=list)  # a verified reference trajectory, not the policy's own
    member: list[int] = field(default_factory=list)  # the index of each row's group
    keys: list[tuple] = field(default_factory=list)  # (group, sample, its version): the log-prob memo's key
    hinted: dict = field(default_factory=dict)  # row -> its sample, for live steps that hindsight teaches


def rows_of(groups: list[Judgement], behaviour: list[list[str]] | None, version: str, tok, L) -> Rows:
    """`behaviour[g][i]` = the version that generated sample i of group g (default: `version`, i.e. on-policy)."""
    r = Rows()
    for gi, g in enumerate(groups):
        p = adca.self_consistency([o for s, o in zip(g.samples, g.outcomes) if not s.off_policy])
        use_adpo = L.adpo and g.source == "rollout"
        r.scale += [adca.adpo_scale(p) if use_adpo else 1.0] * len(g.samples)
        r.clip_high += [max(L.clip_ratio_high, adca.adpo_clip_high(p)) if use_adpo else L.clip_ratio_high] * len(g.samples)
        if L.adca_alpha > 0:  # step-level credit: each step's advantage goes to all its tokens
            r.step_adv.extend(step_credit(g, L.adca_alpha))  # a pooled live group: each step its own outcome
        r.versions += list(behaviour[gi]) if behaviour else [version] * len(g.samples)
        for i, (s, o) in enumerate(zip(g.samples, g.outcomes)):
            r.keys.append((g.group_id, s.sample_id, r.versions[len(r.keys)]))
            if s.hint and not s.off_policy and L.hindsight_clip > 0:
                r.hinted[len(r.samples)] = s
            r.samples.append(grpo.tokenize_sample(tok, s, L.max_seq_tokens, L.experience_mode == "keep"))
            r.guided.append(s.guided)
            r.off.append(s.off_policy)
            r.scores.append(o)
            r.index.append(baseline(g, i))
            r.member.append(gi)
    return r


def batch_of(samples: list, pad_id: int, device) -> Batch:
    """The samples padded into one batch on `device`, with each one's length and first response token."""
    return Batch(
        grpo.pad([t.input_ids for t in samples], pad_id).to(device),
        grpo.pad([[1] * len(t.input_ids) for t in samples], 0).to(device),
        [len(t.input_ids) for t in samples],
        [t.response_mask.index(1) if 1 in t.response_mask else len(t.input_ids) for t in samples],
    )


def advantages(rows: Rows, groups: list[Judgement], L):
    """The response mask and each token's advantage: ADCA step credit (or outcome-only GRPO), scaled by ADPO and,
    in a floor group, the failures' negative advantages by `learner.floor_negative_scale`."""
    import torch

    mask = grpo.pad([t.response_mask for t in rows.samples], 0)
    if L.adca_alpha > 0:
        adv = adca.token_advantages([t.step_ids for t in rows.samples], rows.step_adv, mask.shape[1]) * mask
    else:
        adv = grpo.advantages(rows.scores, rows.index, mask)
    adv = adv * torch.tensor(rows.scale).unsqueeze(1)  # ADPO: ambiguous tasks count less
    adv = adv * torch.tensor(floor_scales(groups, adv, L.floor_negative_scale)).unsqueeze(1)
    return mask, adv


def micro_batches(rows: Rows, n_groups: int, lens: list[int], size: int) -> list[list[int]]:
    """Micro-batches within a group, of similar length, each cut to its own longest sample: the group's prompt runs
    once, and a short code sample beside a BFCL prompt four times its length does not pay for the padding (the loss is
    a token-mean over the whole step: order is free)."""
    batches = []
    for gi in range(n_groups):
        group = sorted((i for i in range(len(rows.member)) if rows.member[i] == gi), key=lambda i: lens[i])
        batches += [group[j : j + size] for j in range(0, len(group), size)]
    return batches


def logprobs(model, rows: list[int], batch: Batch, bf16: bool):
    """Log-probs of some samples of one micro-batch, cut to the longest of them; the prompt they share
    runs once and the head starts at their first response token."""
    width = max(batch.lens[i] for i in rows)
    ids, attn = batch.ids[rows, :width], batch.attn[rows, :width]
    return grpo.token_logprobs(
        model,
        ids,
        attn,
        bf16,
        shared=grpo.shared_prefix(ids, [batch.lens[i] for i in rows]),
        start=min(batch.first[i] for i in rows),
    )
