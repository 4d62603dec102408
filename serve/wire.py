"""The OpenAI wire format at the HTTP edge: parsing and checking a chat request, and writing answers.

Everything a client can get wrong is found here, before the model runs, and becomes a 4xx with the reference's
error object, `{"error": {"message", "type", "param", "code"}}` (`BadRequest`): invalid JSON, nesting deeper
than `MAX_DEPTH`, text that is not valid Unicode, fields of the wrong shape, tool schemas the prompt cannot
describe, a `tool_choice` naming an undeclared function (400, as the reference answers validation errors).
What the reference accepts and this deployment cannot do is refused by name, never ignored: `n` > 1, `seed`,
`logprobs`, a non-zero `presence_penalty` or `frequency_penalty`, a non-empty `logit_bias`, a `response_format`
schema its grammar compiler refuses; so are the deprecated `functions` / `function_call` (and role "function"),
and, as the reference refuses it, `tool_choice` "required" or a named function without `tools`. A
`max_tokens` above the deployment's cap is clamped to it (the answer then finishes with `length`), as clients send
1024 or 4096 by default; `stop`, `parallel_tool_calls: false`, `response_format` (json_object, json_schema:
decoded under its grammar, `policies.grammar`) and a function's `strict` (a call of it decoded under its
parameters' grammar, forced or not; a strict schema the compiler refuses is a 400 naming `tools`) are honoured.
"""

from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from actors.events import ChatMessage, FunctionSpec, ToolCall, ToolSpec
from policies.chat import tool_choice_prefix
from policies.grammar import response_grammar, strict_arguments_grammar
from serve.schemas import ChatRequest


class BadRequest(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def response(self) -> JSONResponse:
        return error(self.status, self.message, param=self.param, code=self.code)


def error(
    status: int, message: str, type_: str = "invalid_request_error", param: str | None = None, code: str | None = None
) -> JSONResponse:
    """The reference's error object (`code` is a string such as "model_not_found", or null)."""
    return JSONResponse({"error": {"message": message, "type": type_, "param": param, "code": code}}, status_code=status)


def too_long(n_prompt: int, limit: int) -> JSONResponse | None:
    """The reference's 400 for a prompt longer than the model's context (`serve.max_prompt_tokens`), else None."""
    if n_prompt <= limit:
        return None
    return error(
        400,
        f"prompt is {n_prompt} tokens; this model's context takes at most {limit}",
        param="messages",
        code="context_length_exceeded",
    )


# what clients of the reference try besides chat completions (LlamaIndex's OpenAILike defaults to completions)
OTHER_APIS = ("/v1/completions", "/v1/responses", "/v1/embeddings", "/v1/assistants", "/v1/audio", "/v1/images")


def answer_errors(app) -> None:
    """The reference's error object outside the routes too: unknown routes and methods (not FastAPI's {"detail"}),
    and uncaught errors (never a plain-text 500)."""
    from starlette.exceptions import HTTPException

    async def http_error(request, exc):
        detail = str(exc.detail)
        if exc.status_code == 404 and request.url.path.startswith(OTHER_APIS):  # a client set up for another API
            detail = f"{request.url.path} is not served here: this deployment answers POST /v1/chat/completions"
        return error(exc.status_code, detail, "invalid_request_error" if exc.status_code < 500 else "server_error")

    async def uncaught(request, exc):
        return error(500, f"internal error: {type(exc).__name__}", "server_error")

    app.add_exception_handler(HTTPException, http_error)
    app.add_exception_handler(Exception, uncaught)


MAX_DEPTH = 64


def check_json(body, max_depth: int = MAX_DEPTH) -> str | None:
    """What is wrong with a parsed body that JSON itself allows: nesting deeper than `max_depth`, or a string
    that is not valid Unicode (a lone surrogate such as "\\ud800", which no tokenizer or UTF-8 writer takes)."""
    stack = [(body, 1, "body")]
    while stack:
        x, depth, where = stack.pop()
        if depth > max_depth:
            return f"body is nested deeper than {max_depth} levels (at {where})"
        if isinstance(x, str):
            try:
                x.encode("utf-8")
            except UnicodeEncodeError as exc:
                return f"{where} is not valid Unicode text: {exc.reason} at position {exc.start}"
        elif isinstance(x, dict):
            stack.extend((v, depth + 1, f"{where}.{k}") for k, v in x.items())
            stack.extend((k, depth + 1, f"{where} key") for k in x)
        elif isinstance(x, list):
            stack.extend((v, depth + 1, f"{where}[{i}]") for i, v in enumerate(x))
    return None


def to_chat_messages(req: ChatRequest) -> list[ChatMessage]:
    out = []
    for m in req.messages:
        role = "system" if m.role == "developer" else m.role
        calls = [
            ToolCall(
                id=c.id or f"call_{i}",
                name=c.function.name,
                arguments=c.function.arguments if isinstance(c.function.arguments, str) else json.dumps(c.function.arguments),
            )
            for i, c in enumerate(m.tool_calls or [])
        ]
        out.append(ChatMessage(role=role, content=m.text(), tool_calls=calls, tool_call_id=m.tool_call_id))
    return out


def pretty(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])


def first_param(exc: ValidationError) -> str | None:
    errs = exc.errors()
    return ".".join(str(p) for p in errs[0]["loc"]) if errs and errs[0]["loc"] else None


def cut_at_stop(text: str, stops: list[str]) -> tuple[str, bool]:
    """The text up to the first stop sequence, and whether one was found."""
    at = min((i for i in (text.find(x) for x in stops) if i >= 0), default=-1)
    return (text[:at], True) if at >= 0 else (text, False)


class StopStream:
    """Streamed text with stop sequences: `feed` returns what can be sent (never the start of a stop sequence that
    the next piece may complete), `stopped` once one was found; `rest` is what remains at the end."""

    def __init__(self, stops: list[str]):
        self.stops, self.held, self.stopped = stops, "", False
        self.keep = max((len(x) for x in stops), default=1) - 1

    def feed(self, piece: str) -> str:
        if self.stopped:
            return ""
        self.held += piece
        text, self.stopped = cut_at_stop(self.held, self.stops)
        if self.stopped:
            self.held = ""
            return text
        send, self.held = (
            (self.held[: len(self.held) - self.keep], self.held[len(self.held) - self.keep :]) if self.keep else (self.held, "")
        )
        return send

    def rest(self) -> str:
        out, self.held = ("" if self.stopped else self.held), ""
        return out


def usage(n_prompt: int, gen) -> dict:
    return {
        "prompt_tokens": n_prompt,
        "completion_tokens": gen.completion_tokens,
        "total_tokens": n_prompt + gen.completion_tokens,
    }


def completion(iid: str, model: str, version: str, answer: ChatMessage, gen, n_prompt: int, finish: str) -> dict:
    msg: dict = {"role": "assistant", "content": answer.content or (None if answer.tool_calls else "")}
    if answer.tool_calls:
        msg["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in answer.tool_calls
        ]
    return {
        "id": iid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": version,
        "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
        "usage": usage(n_prompt, gen),
    }


def parse_chat(body, max_new_tokens: int, checked: bool = False) -> tuple[ChatRequest, list[ChatMessage], list[ToolSpec], str]:
    """(request, messages, offered tools, forced prefix) of a parsed JSON body, or BadRequest; `checked`: the
    caller already ran `check_json` on it (the HTTP edge does, for every route)."""
    if not checked and (problem := check_json(body)):
        raise BadRequest(400, problem)
    try:
        req = ChatRequest.model_validate(body)
        refuse(req)  # before the messages are read: a legacy "function" message is refused by name
        messages = to_chat_messages(req)
    except ValidationError as exc:
        raise BadRequest(400, pretty(exc), first_param(exc)) from None
    except ValueError as exc:
        raise BadRequest(400, str(exc), "messages") from None
    if req.max_completion_tokens:
        req.max_completion_tokens = min(req.max_completion_tokens, max_new_tokens)
    if req.max_tokens:
        req.max_tokens = min(req.max_tokens, max_new_tokens)  # clamped: the answer finishes with "length"
    tools = (
        [
            ToolSpec(
                function=FunctionSpec(
                    name=t.function.name,
                    description=t.function.description or "",
                    parameters=t.function.parameters,
                    strict=bool(t.function.strict),
                )
            )
            for t in (req.tools or [])
        ]
        if req.tool_choice != "none"
        else []
    )
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
    try:
        forced = tool_choice_prefix(choice, tools, grammar=True)
    except ValueError as exc:
        raise BadRequest(400, str(exc), "tool_choice") from None
    try:  # a strict function's arguments are decoded under its schema's grammar: one that cannot be built is a 400
        for t in tools:
            if t.function.strict:
                strict_arguments_grammar(t.function)
    except ValueError as exc:
        raise BadRequest(400, str(exc), "tools") from None
    try:  # structured output, or strict tools: a grammar the engine enforces (`Turn.grammar`); one that cannot be built is a 400
        response_grammar(req.response_format, tools, forced, req.parallel_tool_calls is False)
    except ValueError as exc:
        asked = (req.response_format or {}).get("type", "text") != "text"
        raise BadRequest(400, str(exc), "response_format" if asked else "tools") from None
    return req, messages, tools, forced


def refuse(req: ChatRequest) -> None:
    """What the reference accepts and this deployment cannot do, and what it refuses too: a 400 that names it."""
    legacy(req)
    if req.tool_choice not in (None, "auto", "none") and not req.tools:  # the reference's 400: nothing to call
        raise BadRequest(400, "tool_choice 'required' or a named function needs tools; this request declares none", "tool_choice")
    if req.n > 1:
        raise BadRequest(400, f"n is {req.n}; this deployment returns one choice per request (n = 1)", "n")
    if req.seed is not None:
        raise BadRequest(
            400,
            "seed is not supported: answers are generated in batches with other requests, so no seed can make one reproducible",
            "seed",
        )
    if req.logprobs or req.top_logprobs:
        raise BadRequest(400, "logprobs are not supported by this deployment", "logprobs")
    for name in ("presence_penalty", "frequency_penalty", "logit_bias"):  # accepted only where they change nothing
        if getattr(req, name):
            raise BadRequest(400, f"{name} is not supported by this deployment (send 0, or leave it out)", name)


def legacy(req: ChatRequest) -> None:
    """The function-calling fields OpenAI deprecated for tools: clients that still send them get a 400 naming the field
    and its successor, not an answer that silently ignored their functions."""
    for field, instead in (("functions", "tools"), ("function_call", "tool_choice")):
        if getattr(req, field) is not None:
            raise BadRequest(400, f"{field} is not supported (the deprecated function-calling API); use {instead}", field)
    for i, m in enumerate(req.messages):
        if m.role == "function":
            raise BadRequest(
                400, 'role "function" is not supported (deprecated); use role "tool" with tool_call_id', f"messages.{i}.role"
            )
        if m.function_call is not None:
            raise BadRequest(400, "function_call is not supported (deprecated); use tool_calls", f"messages.{i}.function_call")


def model_card(name: str, weights_version: str, replica: str, canary_version: str | None) -> dict:
    """One entry of GET /v1/models: a name this deployment answers to, and the weights behind it now."""
    return {
        "id": name,
        "object": "model",
        "owned_by": "kaizen",
        "created": 0,
        "weights_version": weights_version,
        "replica": replica,
        "canary_version": canary_version,
    }


def no_such_model(name: str, served: str) -> JSONResponse:
    return error(
        404,
        f"The model {name!r} does not exist; this deployment serves {served!r} (aliases: serve.model_aliases)",
        param="model",
        code="model_not_found",
    )
