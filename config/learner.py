"""The learner's settings (the GRPO step, its step size, staleness, LoRA); part of `config.settings.Settings`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from config.checks import _Section


class LearnerSettings(_Section):
    lr: float = Field(1e-5, description="AdamW learning rate")
    kl_target: float = Field(
        0.0,
        ge=0,
        description="Tie the step size to measured drift (policies/learning/step_size.py): "
        "the smoothed per-step KL to the base under half this grows lr by lr_up, over twice it "
        "shrinks lr by lr_down, a rejected version divides it by lr_reject; 0 keeps lr",
    )
    lr_min: float = Field(0.0, ge=0, description="Lowest lr kl_target may set")
    lr_max: float = Field(0.0, ge=0, description="Highest lr kl_target may set (0: no bound)")
    kl_ema: float = Field(0.3, gt=0, le=1, description="Weight of the newest step's KL in the smoothed drift")
    lr_up: float = Field(1.25, ge=1, description="Growth of lr while the drift is under half of kl_target")
    lr_down: float = Field(1.5, ge=1, description="Shrink of lr while the drift is over twice kl_target")
    lr_reject: float = Field(2.0, ge=1, description="Shrink of lr when the gate rejects a version this learner trained")
    lr_warmup: int = Field(
        0,
        ge=0,
        description="Updates over which a fresh optimizer (the start, a reset after a rejection or a rollback) "
        "ramps up to lr, linearly: the n-th update (n = 1, 2, ...) takes lr * min(1, n / lr_warmup). A fresh "
        "AdamW's first update moves every weight by the whole step size, whatever its gradient. 0 = no ramp",
    )
    ref_reset_after: int = Field(
        0,
        ge=0,
        description="Steps in a row at lr_min after which the weights being trained become the KL and drift "
        "reference in place of the base (ProRL's reference reset); the gate and the guard still measure against "
        "the base. 0 = the base stays the reference",
    )
    groups_per_step: int = Field(2, description="Judged groups per learner step")
    live_groups_per_user: int = Field(
        1,
        ge=1,
        description="Live groups of one user in a step while other users' "
        "live groups wait (one user's burst cannot crowd out the others)",
    )
    replay_groups: int = Field(
        0,
        ge=0,
        description="The newest groups that earlier steps trained, trained again "
        "beside each step's new ones (a second pass, importance-corrected and clipped like any "
        "older sample; not counted as the step's sources). 0 = each group once",
    )
    clip_ratio_low: float = Field(0.2, description="PPO lower clip")
    clip_ratio_high: float = Field(0.28, description="PPO upper clip (decoupled, as AgentEvolver)")
    loss_agg_mode: str = Field("token-mean", description="verl loss aggregation mode")
    max_seq_tokens: int = Field(2048, description="Samples longer than this are left-truncated")
    min_live_group: int = Field(
        2,
        ge=1,
        description="Feedback-judged interactions grouped per live GRPO group (1 only makes sense with pooled_advantage "
        "outcome: each step trained alone by its own rating; z-normed, one step alone has no spread)",
    )
    pooled_advantage: Literal["zscore", "outcome"] = Field(
        "zscore",
        description="A pooled live group's advantages (its steps answer unrelated prompts). 'zscore': ADCA over the pool, "
        "as measured in the rated hours (a step rated -0.5 beside one rated -1.0 gets +1). 'outcome': each step its own "
        "outcome (value x confidence, or the rating), no mean, no std: one rated code hour gained +15.6 points, under "
        "the +20.6 its keep rule asked for; one rated three-category BFCL hour with min_live_group 1, -2.3 points, p = 0.34 "
        "(tests/benchmarks/LOG.md 2026-12-06, 2026-12-07)",
    )
    grad_clip: float = Field(1.0, description="Gradient norm clip")
    adpo: bool = Field(
        True,
        description="Scale rollout-group advantages by self-consistency and widen the upper "
        "clip for ambiguous tasks (Agent0's ADPO)",
    )
    experience_mode: Literal["strip", "keep"] = Field(
        "strip",
        description="strip: train guided samples without the experience text they saw (default); "
        "keep: train them in the context they were generated in",
    )
    boost_clip_high: float = Field(
        0.6, description="Upper clip for guided samples with positive advantage (selective boosting); 0 disables"
    )
    adca_alpha: float = Field(
        0.1, description="Weight of step-level credit (ADCA-GRPO); 0 = outcome-only GRPO with verl's estimator"
    )
    max_staleness: int = Field(
        4,
        description="Samples generated more than this many learner steps behind the weights "
        "being trained are dropped (0 = strictly on-policy)",
    )
    max_wait_s: float = Field(
        600.0,
        description="While users are active, the learner steps no further than max_staleness past the version they "
        "are answered with (live or canary) and waits for the gate, at most this long for one version",
    )
    wait_for: Literal["canary", "live"] = Field(
        "canary",
        description="Where the lead that makes the learner wait (max_staleness, max_wait_s) is counted from: 'canary' "
        "(the nearest served, the canary while there is one; as the committed hours ran) or 'live' (the version most "
        "users get). From the canary, "
        "one rated hour's learner was 5 steps past live when it began to wait, and 20 of its 34 rated steps were "
        "dropped as stale; from live, 16 of 33 (live moves only as the guard checks each canary; LOG.md 2026-12-07)",
    )
    is_threshold: float = Field(
        2.0,
        description="Upper bound of the truncated importance ratio pi_train / "
        "pi_behaviour that corrects stale samples (verl's token-level TIS)",
    )
    kl_coef: float = Field(0.001, description="Weight of the KL penalty to the reference (base) policy; 0 disables")
    off_policy_gamma: float = Field(
        0.1, description="LUFFY's policy-shaping constant for reference (off-policy) tokens: f(pi) = pi / (pi + gamma)"
    )
    floor_negative_scale: float = Field(
        0.0,
        description="In a group none of the policy's samples solved and a "
        "reference joined, scale of the failures' negative advantages (0: the "
        "group teaches by the reference alone)",
    )
    hindsight_clip: float = Field(
        1.0,
        description="Unrated live steps whose next turn says what was wrong train by "
        "hindsight (policies/learning/hindsight.py): per-token advantage = teacher (hint in context) "
        "minus student log-prob, clipped to +-this (1: a z-scored advantage's scale); 0 "
        "disables (they train on the rule's value, pooled). On SmolLM2-135M it pointed the "
        "right way on 24 of 30 wrong BFCL calls (bench_hindsight.py)",
    )
    kl_type: str = Field("low_var_kl", description="verl KL estimator (low_var_kl = k3)")
    micro_batch_size: int = Field(1, description="Samples per forward/backward; gradients accumulate over the batch")
    bf16: bool | Literal["auto"] = Field(
        "auto",
        description="Run the transformer body under bfloat16 autocast "
        "(master weights, gradients and log-softmax stay float32); auto: where "
        "bf16 is native on learner.device (11x slower than float32 on an AVX2 CPU)",
    )
    device: str = Field("cpu", description="torch device of the learner")
    lora_rank: int = Field(
        0,
        description="0: full fine-tuning (fp32 weights + AdamW: 16 bytes a parameter); > 0: "
        "low-rank adapters of this rank on every linear layer over a frozen base (policies/learning/lora.py)",
    )
    lora_alpha: float = Field(32.0, description="LoRA scale numerator (scale = alpha / rank)")
    lora_targets: str | list[str] = Field("all-linear", description="Modules that get adapters (peft target_modules)")
    base_dtype: Literal["float32", "bfloat16"] = Field("bfloat16", description="dtype of the frozen base under LoRA")
    gradient_checkpointing: bool = Field(
        False, description="Recompute each layer's activations in the backward pass (less memory, ~30% more time)"
    )
    checkpoints_kept: int = Field(2, description="Learner checkpoints kept (the newest verified one is resumed)")

    @model_validator(mode="after")
    def _drift_needs_kl(self):
        if self.kl_target > 0 and self.kl_coef <= 0:
            raise ValueError("learner.kl_target measures drift with the KL term: set learner.kl_coef > 0")
        if self.ref_reset_after > 0 and not (self.kl_target > 0 and self.lr_min > 0):
            raise ValueError("learner.ref_reset_after counts steps at lr_min under kl_target: set both > 0")
        return self
