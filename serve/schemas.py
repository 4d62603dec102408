"""OpenAI-compatible request models for the HTTP edge (tolerant of fields we do not use)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class _Tolerant(BaseModel):
    model_config = ConfigDict(extra="ignore")


class FunctionCall(_Tolerant):
    name: str
    arguments: str | dict = "{}"


class InToolCall(_Tolerant):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class InMessage(_Tolerant):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]  # "function": legacy, refused by name
    content: str | list | None = None
    tool_calls: list[InToolCall] | None = None
    tool_call_id: str | None = None
    function_call: Any = Field(None, description="legacy (before tool_calls): refused by name, never ignored")

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for p in self.content:
            if isinstance(p, dict) and p.get("type") == "text":
                parts.append(str(p.get("text", "")))
            else:
                raise ValueError("only text content parts are supported")
        return "".join(parts)


class InFunction(_Tolerant):
    name: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")  # the reference's pattern (MCP tools use dashes)
    description: str | None = ""
    parameters: dict = {}
    strict: bool | None = None

    @field_validator("parameters")
    @classmethod
    def _schema(cls, p: dict) -> dict:
        """The parts of a JSON Schema the prompt uses: an object with named, described properties."""
        if p.get("type", "object") != "object":
            raise ValueError(f"parameters must be a JSON Schema of type object, not {p.get('type')!r}")
        props = p.get("properties", {})
        if not isinstance(props, dict):
            raise ValueError("parameters.properties must be an object mapping names to schemas")
        for k, v in props.items():
            if not isinstance(v, dict):
                raise ValueError(
                    f'parameters.properties.{k} must be a schema object like {{"type": "string"}}, not {type(v).__name__}'
                )
            if "type" in v and not isinstance(v["type"], (str, list)):
                raise ValueError(f"parameters.properties.{k}.type must be a string or a list of strings")
        req = p.get("required", [])
        if not isinstance(req, list) or not all(isinstance(r, str) for r in req):
            raise ValueError("parameters.required must be a list of property names")
        if unknown := [r for r in req if r not in props]:
            raise ValueError(f"parameters.required names {unknown}, which are not in parameters.properties")
        return p


class InTool(_Tolerant):
    type: Literal["function"] = "function"
    function: InFunction


class _Named(_Tolerant):
    name: str


class NamedToolChoice(_Tolerant):
    type: Literal["function"] = "function"
    function: _Named


class StreamOptions(_Tolerant):
    include_usage: bool | None = None


class ChatRequest(_Tolerant):
    """Explicit nulls mean "the default", as the reference takes them (wrappers pass temperature=None)."""

    model: str | None = None
    messages: list[InMessage] = Field(min_length=1, max_length=256)
    tools: list[InTool] | None = Field(None, max_length=128)  # the reference's limit
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="nucleus sampling; 0, the smallest nucleus, is greedy")
    n: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="refused unless 0: not applied here")
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, description="refused unless 0: not applied here")
    logit_bias: dict[str, float] | None = Field(None, description="refused unless empty: not applied here")
    user: str | None = None
    safety_identifier: str | None = Field(None, description="OpenAI's successor of `user`: the user when `user` is absent")
    functions: Any = Field(None, description="legacy (before tools): refused by name, never ignored")
    function_call: Any = Field(None, description="legacy (before tool_choice): refused by name, never ignored")
    metadata: dict[str, Any] | None = Field(
        None, description="OpenAI's request metadata; conversation_id, thread_id or session_id keys a conversation explicitly"
    )
    memory: bool = Field(True, description="extension: retrieve experiences into the context (extra_body)")

    @model_validator(mode="after")
    def _defaults(self):
        self.stream = bool(self.stream)
        self.temperature = 0.7 if self.temperature is None else self.temperature
        self.top_p = 1.0 if self.top_p is None else self.top_p
        if self.top_p == 0:  # the smallest nucleus holds the likeliest token only: greedy (temperature 0 to every engine)
            self.temperature, self.top_p = 0.0, 1.0
        self.n = 1 if self.n is None else self.n
        return self

    @field_validator("stop")
    @classmethod
    def _stops(cls, v):
        stops = [v] if isinstance(v, str) else list(v or [])
        if len(stops) > 4 or any(not isinstance(x, str) or not x for x in stops):
            raise ValueError("stop must be a non-empty string or a list of up to 4 non-empty strings")
        return stops

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class FeedbackRequest(_Tolerant):
    interaction_id: str = Field(min_length=1, max_length=128)
    score: float = Field(ge=-1.0, le=1.0)
    comment: str | None = Field(None, max_length=4000)
