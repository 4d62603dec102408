"""The parts events are made of (their envelope among them), and the request/reply messages that are not events.

Readers are tolerant at run time (unknown fields ignored) and strict in tests (`strict()`).
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the chat template's


class Wire(BaseModel):
    """Base of every wire model: tolerant (unknown fields ignored) unless `strict()` was called."""

    model_config = ConfigDict(extra="ignore", frozen=False)


def strict(on: bool = True) -> None:
    """Forbid unknown fields in every wire model (tests; main.py and the actor host when
    KAIZEN_STRICT_EVENTS=1), or tolerate them again. Models are rebuilt twice, so nested ones match."""
    extra = "forbid" if on else "ignore"
    models, todo = [], [Wire]
    while todo:
        m = todo.pop()
        models.append(m)
        todo.extend(m.__subclasses__())
    for m in models:
        m.model_config["extra"] = extra
    for _ in range(2):
        for m in models:
            m.model_rebuild(force=True)


def new_id() -> str:
    return str(uuid.uuid4())


def derived_id(kind: str, key: str) -> str:
    """The event id of what a given input makes (uuid5 of "kaizen:<kind>:<key>"): the same every time it is made
    again after a redelivery or a restart, so JetStream's de-duplication drops the copy."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:{kind}:{key}"))


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def event_time(iso: str) -> float:
    """An event's `occurred_at` as epoch seconds (now, if it cannot be read)."""
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return time.time()


# ----------------------------------------------------------------------------- envelope

SCHEMA_VERSION = 1


class Event(Wire):
    """Every event's envelope; the kinds are in actors/events.py and actors/task_events.py."""

    event_id: str = Field(default_factory=new_id)
    kind: str
    schema_version: int = SCHEMA_VERSION
    occurred_at: str = Field(default_factory=_now)
    producer: str = "unknown"
    weights_version: str = "w-000000"
    trace_id: str | None = None


# ----------------------------------------------------------------------------- shared parts


class ToolCall(Wire):
    id: str
    name: str
    arguments: str  # JSON object text, as in the OpenAI API


class ChatMessage(Wire):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None


class FunctionSpec(Wire):
    name: str
    description: str = ""
    parameters: dict = Field(default_factory=dict, description="JSON Schema of the arguments object")
    strict: bool = Field(False, description="calls must match `parameters` exactly (OpenAI's strict function calling)")


class ToolSpec(Wire):
    """An OpenAI-format function tool: {"type": "function", "function": {...}}."""

    type: Literal["function"] = "function"
    function: FunctionSpec


class Sample(Wire):
    """One rollout of a task. `messages` are the training view: experience text stripped."""

    sample_id: str
    messages: list[ChatMessage]
    tools: list[ToolSpec] = []
    step_indices: list[int] = Field(default_factory=list, description="indices of assistant messages = steps")
    step_signals: list[float] = Field(default_factory=list, description="environment signal per step, in [-1, 1]")
    outcome: float = 0.0
    guided: bool = False
    experience_ids: list[str] = []
    experiences: list[str] = Field([], description="experience text a guided sample saw (not in `messages`)")
    error: str | None = None
    off_policy: bool = Field(
        False,
        description="a verified reference trajectory replayed in the environment, not "
        "sampled from any weights version (mixed-policy GRPO); never counts as the policy's own",
    )
    hint: str = Field(
        "",
        description="a live step no user rated whose next turn says what was wrong (a tool's "
        "error, a correction): that next turn, the hindsight teacher's context (policies/learning/hindsight.py); "
        "never trained on",
    )


# ----------------------------------------------------------------------------- request / reply (not events)


class RetrieveRequest(Wire):
    """Navigator retrieval query (core NATS request/reply, not stored in the stream)."""

    query: str
    k: int = 3
    origin: Literal["explorer", "serve", "cli"] = "explorer"


class RetrievedExperience(Wire):
    experience_id: str
    text: str
    score: float


class RetrieveReply(Wire):
    experiences: list[RetrievedExperience] = []
    took_ms: float = Field(0.0, description="time the navigator spent on the query (embedding + search + ranking)")
