"""The OpenAI wire format at the HTTP edge: parsing and checking a chat request, and writing answers.

Everything a client can get wrong is found here, before the model runs, and becomes a 4xx with a JSON
message (`BadRequest`): invalid JSON, nesting deeper than `MAX_DEPTH`, text that is not valid Unicode,
fields of the wrong shape (422, from the schemas), tool schemas the prompt cannot describe, a
`tool_choice` naming an undeclared function, and `max_tokens` beyond the deployment's cap (400, as
OpenAI answers a budget beyond the model's limit).
"""
from __future__ import annotations

import json
import time

from fastapi.responses import JSONResponse
from pydantic import ValidationError

from actors.events import ChatMessage, FunctionSpec, ToolCall, ToolSpec
from policies.chat import tool_choice_prefix
from serve.schemas import ChatRequest


class BadRequest(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status, self.message = status, message

    def response(self) -> JSONResponse:
        return error(self.status, self.message)


def error(status: int, message: str, type_: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": type_, "code": status}}, status_code=status)


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
        calls = [ToolCall(id=c.id or f"call_{i}", name=c.function.name,
                          arguments=c.function.arguments if isinstance(c.function.arguments, str)
                          else json.dumps(c.function.arguments))
                 for i, c in enumerate(m.tool_calls or [])]
        out.append(ChatMessage(role=role, content=m.text(), tool_calls=calls, tool_call_id=m.tool_call_id))
    return out


def pretty(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])


def completion(iid: str, model: str, version: str, answer: ChatMessage, gen, n_prompt: int) -> dict:
    msg: dict = {"role": "assistant", "content": answer.content or (None if answer.tool_calls else "")}
    if answer.tool_calls:
        msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                             for c in answer.tool_calls]
    finish = "tool_calls" if answer.tool_calls else ("length" if gen.finish_reason == "length" else "stop")
    return {"id": iid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "system_fingerprint": version,
            "choices": [{"index": 0, "message": msg, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": gen.completion_tokens,
                      "total_tokens": n_prompt + gen.completion_tokens}}


def parse_chat(body, max_new_tokens: int, checked: bool = False
               ) -> tuple[ChatRequest, list[ChatMessage], list[ToolSpec], str]:
    """(request, messages, offered tools, forced prefix) of a parsed JSON body, or BadRequest; `checked`: the
    caller already ran `check_json` on it (the HTTP edge does, for every route)."""
    if not checked and (problem := check_json(body)):
        raise BadRequest(400, problem)
    try:
        req = ChatRequest.model_validate(body)
        messages = to_chat_messages(req)
    except ValidationError as exc:
        raise BadRequest(422, pretty(exc)) from None
    except ValueError as exc:
        raise BadRequest(400, str(exc)) from None
    if (asked := req.max_completion_tokens or req.max_tokens or 0) > max_new_tokens:
        raise BadRequest(400, f"max_tokens is {asked}; this deployment generates at most {max_new_tokens} tokens "
                              "per request (serve.max_new_tokens)")
    tools = [ToolSpec(function=FunctionSpec(name=t.function.name, description=t.function.description or "",
                                            parameters=t.function.parameters))
             for t in (req.tools or [])] if req.tool_choice != "none" else []
    choice = req.tool_choice.model_dump() if hasattr(req.tool_choice, "model_dump") else req.tool_choice
    try:
        forced = tool_choice_prefix(choice, tools)
    except ValueError as exc:
        raise BadRequest(400, str(exc)) from None
    return req, messages, tools, forced
