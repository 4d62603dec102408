"""The events of a task on its way to a judgement: the questioner's `Task` and, for a synthetic one, its
`TaskStatus`; the attributor's `LiveStep`; the explorer's `Rollout` of either. Like every event they are in the
stream's registry (`actors/events.py`), which parses them with the others.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from actors.lifecycles import TaskState
from actors.messages import Event, Sample, ToolSpec


class Task(Event):
    kind: Literal["task"] = "task"
    task_id: str
    env: str
    entry_id: str
    split: Literal["train", "heldout"] = "train"
    origin: Literal["env", "synthetic", "live"] = "env"
    query: str = ""
    reference: list[str] = Field([], description="reference solution (call strings) of a synthetic task")
    base_entry_id: str | None = Field(None, description="train entry whose initial state a synthetic task starts from")
    tools: list[ToolSpec] = Field(
        [], description="the declared tools a synthetic task on the clients' tools is written about (env client_tools)"
    )


class LiveStep(Task):
    """A live step no user rated, for the explorer to re-sample into a group (`policies/judge/live_steps.py`): a task of
    env `live` on a kind of its own, so that the explorer takes it ahead of environment tasks."""

    kind: Literal["live_step"] = "live_step"
    env: str = "live"
    origin: Literal["env", "synthetic", "live"] = "live"
    step: Sample | None = Field(
        description="its context and the answer users were served, scrubbed, with the outcome and hint its signal gave "
        "it; the envelope's weights_version wrote the answer (None in a Rollout: there the step is its first sample)"
    )
    tool_choice: str | dict | None = Field(None, description="the request's tool_choice, as it was sent")
    response_format: dict | None = Field(None, description="the request's response_format, where it asked for JSON")
    user_hash: str = Field("", description="the hashed user")
    signal: str = Field("", description="what gave the step its outcome (a rule of conversations.SIGNALS)")
    source_event_ids: list[str] = Field([], description="the events it came from (its interaction)")


class TaskStatus(Event):
    """Lifecycle of a synthetic task: proposed -> verified -> active -> retired, or proposed -> rejected."""

    kind: Literal["task_status"] = "task_status"
    task_id: str
    status: TaskState
    reason: str = ""
    env: str = ""
    query: str = ""
    reference: list[str] = []
    base_entry_id: str | None = None
    consistency: float | None = Field(None, description="self-consistency of the last rollout group")
    synthesizer: str = ""
    exploration: list[str] = Field([], description="the exploration the task came from: `call -> ok|error: result`")


class Rollout(Event):
    """A whole GRPO group: groups stay intact through the pipeline."""

    kind: Literal["rollout"] = "rollout"
    task: Annotated[Task | LiveStep, Field(discriminator="kind")]
    group_id: str
    samples: list[Sample]
    duration_s: float = 0.0
    behaviour_versions: list[str] = Field(
        [], description="the weights version that generated each sample, when they differ (a live step and its re-samples)"
    )
    scored_by: Literal["tool-fit", "served-call", "consensus"] = Field(
        "tool-fit",
        description="how a live step's group was scored: against the request's schema (envs/tool_fit.py), for a step "
        "its next turn confirmed against the served call (envs/live.confirmed_alternatives), or for a step it turned "
        "down against the call most re-sampled answers give (envs/live.consensus_alternatives)",
    )
