"""One chat request on its way through a replica (`Turn`), and the `Interaction` event it ends in.

Serve keeps no store of its own for interactions: the event goes to the outbox (`serve/outbox.py`) and from there
to the stream, where feedback finds it by id (`serve/feedback.py`).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from actors.events import ChatMessage, Interaction, RetrieveReply, ToolSpec, derived_id
from config.private import secret_file
from policies.chat import json_object, served_answer
from policies.grammar import response_grammar
from policies.vetting import call_cut
from serve.schemas import ChatRequest, NamedToolChoice
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
    peer: str = ""  # the client's address: who a request without `user` comes from
    holder: str = ""  # the name of the per-user key it came with ("": the deployment's key, its users named by `user`)
    text: str = ""  # the answer's text as generated (after its forced prefix, cut at a stop sequence)

    @cached_property
    def grammar(self) -> str | None:
        """The grammar its `response_format`, or its strict functions, ask for (None: free text),
        checked already by `serve.wire.parse_chat`."""
        r, call_tokens = self.req, getattr(self.engine, "call_tokens", False)
        return response_grammar(r.response_format, self.tools, self.forced, r.parallel_tool_calls is False, call_tokens)

    def generate(self, stream_cb=None):
        """Its answer's generation, on the engine that answers it from start to end."""
        r = self.req
        return self.engine.generate([self.prompt], self.max_new, r.temperature, r.top_p, stream_cb, r.stop or (), self.grammar)

    def answer(self, gen) -> ChatMessage:
        """The assistant message of a generation: cut at the first stop sequence; with tools, the whole text parsed
        (a forced call keeps its name, and is the answer even with arguments that do not parse) and vetted
        (`trusted_calls`), one call only when the client asked for no parallel calls."""
        text, self.stopped = cut_at_stop(gen.text, self.req.stop or [])
        self.text = self.forced + text
        self.n_completion = gen.completion_tokens
        if not self.tools:
            return ChatMessage(role="assistant", content=text.strip())
        cut = gen.finish_reason == "length" and not self.stopped
        msg = served_answer(self.forced, text, self.tools, cut)
        if isinstance(self.req.tool_choice, NamedToolChoice):  # a named function: calls of it alone, as the reference's
            msg.tool_calls = [c for c in msg.tool_calls if c.name == self.req.tool_choice.function.name]
        if self.req.parallel_tool_calls is False and len(msg.tool_calls) > 1:
            msg.tool_calls = msg.tool_calls[:1]
        return msg

    def finish(self, answer: ChatMessage, gen) -> str:
        """`length` when the token limit ended the answer; with calls, only when it cut the last one off (its markup
        still open, its arguments no JSON object), as the reference's; a call that closed finishes with `tool_calls`."""
        cut = gen.finish_reason == "length" and not self.stopped
        if answer.tool_calls:
            cut = call_cut(self.text, cut) and json_object(answer.tool_calls[-1].arguments) is None
            return "length" if cut else "tool_calls"
        return "length" if cut else "stop"

    def interaction(self, answer: ChatMessage, version: str, straddled: bool, replica: str, key: str, salt: bytes) -> Interaction:
        # a request without `user` (or `safety_identifier`, OpenAI's newer name for it) is its connection's: one API key's
        # anonymous clients are not one user to the per-user caps and to conversation stitching. A per-user key
        # (`serve.user_keys_file`) is its holder whatever `user` says: a new `user` a request makes no new user there;
        # hashed under a salt of their own, so that no `user` string a deployment-key client sends is taken for one.
        # Keyed by the deployment's secret salt (`user_salt`): an address or a name cannot be found again from its hash
        who = self.req.user or self.req.safety_identifier or f"peer:{self.peer}"
        user = self.holder or who + "|" + hashlib.sha256(key.encode()).hexdigest()[:8]
        salt = salt + b"|user key" if self.holder else salt
        choice = self.req.tool_choice
        choice = choice.model_dump(exclude_none=True) if hasattr(choice, "model_dump") else choice
        ev = Interaction(
            event_id=interaction_event_id(self.iid),
            interaction_id=self.iid,
            user_hash=hmac.new(salt, user.encode(), hashlib.sha256).hexdigest()[:16],
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
            response_format=self.req.response_format if self.grammar else None,
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


def user_salt(state: Path) -> bytes:
    """The deployment's secret for user hashes: `secrets/user_salt` in the head's state dir, made once (32 random
    bytes), owner-only. `serve.app.build_app` reads it where the app is deployed and hands it to every replica, on every
    host (so a user is one hash whichever replica answers, and after a restart)."""
    path = Path(state) / "secrets" / "user_salt"
    text = secret_file(path, lambda: secrets.token_hex(32))
    try:
        if len(text) < 32:
            raise ValueError(text)
        return bytes.fromhex(text)
    except ValueError:
        raise ValueError(f"{path} holds no usable salt (at least 32 hex characters); remove it to have a new one made") from None


def interaction_event_id(interaction_id: str) -> str:
    """An interaction's event id derives from its id: the outbox finds a pending one by it (`Outbox.get`)."""
    return derived_id("interaction", interaction_id)
