"""One chat request on its way through a replica (`Turn`), and the `Interaction` event it ends in.

Serve keeps no store of its own for interactions: the event goes to the outbox (`serve/outbox.py`) and from there
to the stream, where feedback finds it by id (`serve/feedback.py`).
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field

from actors.events import ChatMessage, Interaction, RetrieveReply, ToolCall, ToolSpec, derived_id
from policies.chat import parse_forced
from serve.schemas import ChatRequest
from serve.wire import cut_at_stop


@dataclass
class Turn:
    req: ChatRequest
    messages: list[ChatMessage]
    tools: list[ToolSpec]
    memory: RetrieveReply
    prompt: str
    forced: str = ""
    max_new: int = 0
    iid: str = ""
    trace_id: str | None = None
    trace_headers: dict = field(default_factory=dict)
    engine: object = None  # this request is answered by one engine from start to end
    n_prompt: int = 0
    n_completion: int = 0
    stopped: bool = False  # the answer ended at one of the request's stop sequences
    t0: float = field(default_factory=time.perf_counter)

    def answer(self, gen) -> ChatMessage:
        """The assistant message of a generation: cut at the first stop sequence; with tools, the whole text parsed
        (a forced call keeps its name) and vetted (`trusted_calls`), one call only when the client asked for no
        parallel calls."""
        text, self.stopped = cut_at_stop(gen.text, self.req.stop or [])
        self.n_completion = gen.completion_tokens
        if not self.tools:
            return ChatMessage(role="assistant", content=text.strip())
        cut = gen.finish_reason == "length" and not self.stopped
        msg = trusted_calls(parse_forced(self.forced, text), self.tools, self.forced + text, cut)
        if self.req.parallel_tool_calls is False and len(msg.tool_calls) > 1:
            msg.tool_calls = msg.tool_calls[:1]
        return msg

    def finish(self, answer: ChatMessage, gen) -> str:
        cut = gen.finish_reason == "length" and not self.stopped
        if answer.tool_calls:  # a call cut off by the token limit finishes with `length`, as the reference's does
            return "length" if cut and _json_object(answer.tool_calls[-1].arguments) is None else "tool_calls"
        return "length" if cut else "stop"

    def interaction(self, answer: ChatMessage, version: str, straddled: bool, replica: str, key: str) -> Interaction:
        user = (self.req.user or "") + "|" + hashlib.sha256(key.encode()).hexdigest()[:8]
        choice = self.req.tool_choice
        choice = choice.model_dump(exclude_none=True) if hasattr(choice, "model_dump") else choice
        ev = Interaction(
            event_id=interaction_event_id(self.iid),
            interaction_id=self.iid,
            user_hash=hashlib.sha256(user.encode()).hexdigest()[:16],
            messages=self.messages,
            tools=self.tools,
            response=answer,
            experience_ids=[e.experience_id for e in self.memory.experiences],
            latency_ms=(time.perf_counter() - self.t0) * 1000,
            replica=replica,
            trace_id=self.trace_id,
            trace_context=self.trace_headers,
            mixed_weights=straddled,
            tool_choice=choice,
            conversation=next(
                (
                    str(v)[:128]
                    for k, v in (self.req.metadata or {}).items()
                    if k in ("conversation_id", "thread_id", "session_id")
                ),
                "",
            ),
        )
        ev.weights_version, ev.producer = version, f"serve:{replica}"
        return ev


def interaction_event_id(interaction_id: str) -> str:
    """An interaction's event id derives from its id: the outbox finds a pending one by it (`Outbox.get`)."""
    return derived_id("interaction", interaction_id)


def _json_object(text: str) -> dict | None:
    try:
        v = json.loads(text)
    except ValueError:
        return None
    return v if isinstance(v, dict) else None


def trusted_calls(msg: ChatMessage, tools: list[ToolSpec], text: str, cut: bool) -> ChatMessage:
    """Only calls a client can run: to a declared function, with a JSON object of arguments (positional arguments
    of a Python-style call named by the declared parameters, in order). Anything else is the model's text, answered
    as text (its tokens unchanged, so the learner trains what was generated); a last call cut off by the token
    limit is kept as the reference keeps it, finishing with `length`."""
    declared = {t.function.name: t.function for t in tools}
    as_text = ChatMessage(role="assistant", content=text.replace("<|im_end|>", "").strip())
    calls = []
    for i, c in enumerate(msg.tool_calls):
        args = _json_object(c.arguments)
        if c.name in declared and args is None and cut and i == len(msg.tool_calls) - 1:
            calls.append(c)
            continue
        if c.name not in declared or args is None:
            return as_text
        if "_positional" in args:
            given = args.pop("_positional")
            free = [p for p in (declared[c.name].parameters or {}).get("properties", {}) if p not in args]
            if not isinstance(given, list) or len(given) > len(free):
                return as_text
            c = ToolCall(id=c.id, name=c.name, arguments=json.dumps({**dict(zip(free, given)), **args}))
        calls.append(c)
    return ChatMessage(role="assistant", content=msg.content, tool_calls=calls)
