"""Every event on the `evo.>` stream, one pydantic model per kind (a task's own in actors/task_events.py), and
their registry: `parse_event` reads any of them.

The subject is derived from the type (`subject_for`), never typed at a call site: `evo.<kind>`, and for an
interaction `evo.interaction.<interaction_id>`, so the stream's own subject index finds it by id (`Bus.interaction`).
Readers are tolerant at run time (unknown fields ignored), strict in tests (`strict()` forbids extras). Large
payloads never travel here: weights are referenced by path + sha256.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, Union

from pydantic import Field, TypeAdapter

from actors import messages
from actors.lifecycles import WeightsState
from actors.messages import (  # noqa: F401  (the shared parts are part of this module's interface)
    DEFAULT_SYSTEM,
    ChatMessage,
    Event,
    FunctionSpec,
    RetrievedExperience,
    RetrieveReply,
    RetrieveRequest,
    Sample,
    ToolCall,
    ToolSpec,
    Wire,
    derived_id,
    new_id,
)
from actors.task_events import LiveStep, Rollout, Task, TaskStatus


class Interaction(Event):
    kind: Literal["interaction"] = "interaction"
    interaction_id: str
    user_hash: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = []
    response: ChatMessage
    experience_ids: list[str] = []
    latency_ms: float = 0.0
    replica: str = ""
    trace_context: dict[str, str] = Field({}, description="W3C trace headers of the HTTP request (for feedback)")
    mixed_weights: bool = Field(
        False,
        description="a weights swap happened while the answer was generated: its "
        "first tokens come from `weights_version`, the rest from the next (not trainable)",
    )
    conversation: str = Field(
        "", description="the client's own conversation key (metadata conversation_id, thread_id or session_id), when it sent one"
    )
    tool_choice: str | dict | None = Field(None, description="the request's tool_choice, as it was sent")
    response_format: dict | None = Field(None, description="the request's response_format, where it asked for JSON")


class Feedback(Event):
    kind: Literal["feedback"] = "feedback"
    interaction_id: str
    score: float = Field(ge=-1.0, le=1.0)
    comment: str | None = None
    interaction: Interaction | None = Field(None, description="the rated interaction (earlier releases; now looked up by id)")


MIXED_WEIGHTS = "mixed"  # behaviour version of a live answer generated across a weights swap (never trained on)


class Judgement(Event):
    kind: Literal["judgement"] = "judgement"
    group_id: str
    source: Literal["rollout", "live"]
    task_id: str
    env: str = Field(
        "", description="the task's environment and entry (rollouts; `live` and the interaction for a re-sampled live step)"
    )
    entry_id: str = ""
    samples: list[Sample]
    outcomes: list[float]
    step_labels: list[list[Literal["GOOD", "BAD"]]]
    judge: str = "env"
    source_event_ids: list[str] = []
    behaviour_versions: list[str] = Field(
        [],
        description="weights version that generated each sample, when they "
        "differ (pooled live groups); empty = the envelope's weights_version",
    )
    judge_labels: list[list[str]] | None = Field(None, description="the judge's own labels (None: not judged)")
    judge_scores: list[float] = Field([], description="reference-based outcome score per sample, 0..100")
    agreement: float | None = Field(None, description="share of steps where judge and environment agree")
    screened_steps: int = Field(0, description="steps forced BAD by the master-key screen")
    origin: Literal["env", "synthetic", "live"] = "env"
    user_hashes: list[str] = Field([], description="hashed user per sample (live judgements)")
    comments: list[str] = Field([], description="the user's feedback comment per sample (live judgements)")
    signals: list[str] = Field(
        [],
        description="per sample, what happened next that gave its outcome (a rule of "
        "policies/judge/conversations.SIGNALS) when no user rated it",
    )


class Experience(Event):
    kind: Literal["experience"] = "experience"
    experience_id: str
    text: str
    when: str
    success: bool
    origin: Literal["live", "synthetic", "env"]
    source_event_ids: list[str] = []
    state: Literal["active", "quarantined", "retired"] = "active"
    user_hash: str | None = Field(None, description="hashed user whose interaction it came from (live)")
    support: int = Field(1, description="judged groups merged into this experience (near-duplicates)")
    reason: str = Field("", description="why this version was written: new, merged, retired (and why)")
    created_at: str | None = Field(None, description="when the experience was first written")


class LearnerStep(Event):
    kind: Literal["learner_step"] = "learner_step"
    step: int
    groups: int
    samples: int
    loss: float
    mean_reward: float
    grad_norm: float
    duration_s: float
    source_event_ids: list[str] = []  # the judgements this step learned from first
    reused_event_ids: list[str] = []  # those an earlier step learned from, trained again (`learner.replay_groups`)
    metrics: dict[str, float] = {}


class WeightsRef(Wire):
    version: str
    path: str
    sha256: str
    parent: str
    step: int


class WeightsPublished(Event):
    kind: Literal["weights_published"] = "weights_published"
    weights: WeightsRef
    force: bool = Field(
        False, description="operator-forced: skip the gate and the canary (live monitoring and automatic rollback still apply)"
    )
    reason: str = ""


class WeightsPromoted(Event):
    """A version passed the gate: `stage` canary (serves `canary_share` of requests) or live (all of them)."""

    kind: Literal["weights_promoted"] = "weights_promoted"
    weights: WeightsRef
    candidate_score: float
    live_score: float
    previous: str
    stage: Literal["canary", "live"] = "live"
    canary_share: float = 0.0
    candidate_nll: float | None = Field(None, description="per-token NLL of held-out reference actions")
    live_nll: float | None = None
    reason: str = ""


class WeightsRejected(Event):
    kind: Literal["weights_rejected"] = "weights_rejected"
    weights: WeightsRef
    candidate_score: float
    live_score: float
    reason: str
    candidate_nll: float | None = None
    live_nll: float | None = None


class WeightsRolledBack(Event):
    kind: Literal["weights_rolled_back"] = "weights_rolled_back"
    from_version: str
    to: WeightsRef
    reason: str


class HeldoutScored(Event):
    """A served version scored against the base on the guard's held-out suite (policies/promotion/guard.py)."""

    kind: Literal["heldout_scored"] = "heldout_scored"
    version: str
    env: str
    entries: int = Field(description="entries scored (fewer than suite_entries when the check stopped early)")
    suite_entries: int
    k: int
    avg: float
    base_avg: float
    delta: float
    p_value: float
    wins: int
    losses: int
    verdict: Literal["not_below", "below"]
    duration_s: float
    reason: str = ""


class WeightsStatus(Event):
    """One change in a weights version's lifecycle (`actors/lifecycles.py`), published by the broadcaster."""

    kind: Literal["weights_status"] = "weights_status"
    version: str
    status: WeightsState
    previous_status: WeightsState | None = None
    reason: str = ""
    metrics: dict[str, float] = {}


class WeightsSwapped(Event):
    """A serving replica reports what it serves: the live version, and the canary it also holds, if any."""

    kind: Literal["weights_swapped"] = "weights_swapped"
    replica: str
    version: str
    swap_ms: float
    canary: str | None = Field(None, description="the canary version the replica also serves, if any")
    reason: str = Field("", description="joined | promoted | rolled_back | canary | canary_ended")


class DeadLetter(Event):
    kind: Literal["dead_letter"] = "dead_letter"
    subject: str
    consumer: str
    reason: str
    original_event_id: str | None = None
    payload: str = Field("", description="the poison payload, truncated to 64 KiB")


_MODELS = (
    Interaction,
    Feedback,
    Task,
    TaskStatus,
    LiveStep,
    Rollout,
    Judgement,
    Experience,
    LearnerStep,
    WeightsPublished,
    WeightsPromoted,
    WeightsRejected,
    WeightsRolledBack,
    WeightsStatus,
    WeightsSwapped,
    DeadLetter,
    HeldoutScored,
)
AnyEvent = Annotated[Union[_MODELS], Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(AnyEvent)
KINDS: tuple[str, ...] = tuple(m.model_fields["kind"].default for m in _MODELS)
KEYED = {"interaction": "interaction_id"}  # kinds stored one subject per key: the stream's index finds one by key
_TOKEN = re.compile(r"[A-Za-z0-9_-]{1,200}")  # a key is one subject token: no dots, wildcards or spaces


def subject_for(event: Event | str, prefix: str = "evo", key: str | None = None) -> str:
    """The one place a subject is made: `evo.<kind>`, or `evo.<kind>.<key>` for an event of a keyed kind (or a
    kind and a `key`), e.g. `evo.interaction.chatcmpl-1f0c`. A key that is not one token is a ValueError."""
    kind = event if isinstance(event, str) else event.kind
    if kind not in KINDS:
        raise ValueError(f"unknown event kind {kind!r}")
    if key is None and kind in KEYED and not isinstance(event, str):
        key = getattr(event, KEYED[kind])
    if key is not None and (kind not in KEYED or not _TOKEN.fullmatch(key)):
        raise ValueError(f"{key!r} is not a key of {kind!r} events")
    return f"{prefix}.{kind}" if key is None else f"{prefix}.{kind}.{key}"


def subjects_of(kind: str, prefix: str = "evo") -> list[str]:
    """The subjects a kind is stored under (stream subjects, consumer filters): for a keyed kind its per-key ones
    and the bare `evo.<kind>` that earlier releases published it on."""
    return [subject_for(kind, prefix)] + ([f"{prefix}.{kind}.*"] if kind in KEYED else [])


def kind_of(subject: str, prefix: str = "evo") -> str | None:
    """The kind of an event stored under `subject`; None when it is not one of ours."""
    parts = subject[len(prefix) + 1 :].split(".") if subject.startswith(prefix + ".") else []
    ok = bool(parts) and parts[0] in KINDS and (len(parts) == 1 or (len(parts) == 2 and parts[0] in KEYED))
    return parts[0] if ok else None


def parse_event(data: bytes | str) -> Event:
    """Decode one event; raises pydantic.ValidationError on poison."""
    return _ADAPTER.validate_json(data)


def strict(on: bool = True) -> None:
    """Unknown fields are an error (tests, KAIZEN_STRICT_EVENTS=1) or ignored (the default)."""
    global _ADAPTER
    messages.strict(on)
    _ADAPTER = TypeAdapter(AnyEvent)
