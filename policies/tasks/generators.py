"""Who writes synthetic tasks: the served policy (`PolicyGenerator`, constrained decoding of call arguments
from the tool schemas) or a configured OpenAI-compatible endpoint (`EndpointGenerator`).
"""

from __future__ import annotations

import json
import re

from actors.events import ChatMessage
from policies.chat import enum_texts, parse_assistant, render, tools_block

_NUM = re.compile(r"-?\d+(?:\.\d+)?")


class PolicyGenerator:
    """The served policy as generator (ChatML + forced prefixes).

    `call_arguments` fills a call's required parameters one at a time, guided by the schema
    (the key and the value's opening are forced, the policy writes the value, or picks one of an `enum`'s values),
    which is what JSON-schema-guided decoding does: a small policy then explores with well-formed calls. With `after`
    (earlier calls' arguments), the call is the next one of the same answer, written after those."""

    name = "policy"

    def __init__(self, engine, temperature: float = 0.8, max_new_tokens: int = 64):
        self.engine, self.temperature, self.max_new_tokens = engine, temperature, max_new_tokens

    def _continue(self, prompt: str, max_new_tokens: int) -> str:
        return self.engine.generate([prompt], max_new_tokens=max_new_tokens, temperature=self.temperature, top_p=0.95)[0].text

    def chat(self, messages: list[ChatMessage], tools=None, prefix: str = "") -> str:
        return prefix + self._continue(render(messages, tools) + prefix, self.max_new_tokens)

    def call_arguments(self, messages: list[ChatMessage], tool, after: tuple[str, ...] = ()) -> str | None:
        f = tool.function
        params = f.parameters or {}
        props = params.get("properties") or {}
        text = render(messages, [tool]) + "<tool_call>[" + _opening(f.name, after)
        args: dict = {}
        for key in params.get("required") or []:
            prop = props.get(key) or {}
            kind = prop.get("type", "string")
            head = ("" if not args else ", ") + f'"{key}": '
            if options := enum_texts(prop.get("enum")):  # one of the declared values, by constrained decoding
                value = json.loads(self.engine.choose(text + head, options, self.temperature))
            elif kind == "string":
                raw = re.split(r'["<}\n]', self._continue(text + head + '"', 16))[0].strip()
                value = raw[:80] or None
            elif kind in ("integer", "number"):
                m = _NUM.search(self._continue(text + head, 6))
                value = None if m is None else (int(float(m.group())) if kind == "integer" else float(m.group()))
            elif kind == "boolean":
                good, bad = self.engine.choice_logprobs([text + head], ["true", "false"])[0]
                value = good >= bad
            else:  # arrays and objects: the policy writes the JSON, which must parse
                opener = "[" if kind == "array" else "{"
                raw = opener + self._continue(text + head + opener, 24)
                value = _first_json(raw)
            if value is None:
                return None
            args[key] = value
            text += head + json.dumps(value)
        return json.dumps(args)


def _opening(name: str, after) -> str:
    """An answer's calls of `name` up to the next one's arguments: each earlier call's arguments in `after`."""
    return "".join(f'{{"name": "{name}", "arguments": {a}}}, ' for a in after) + f'{{"name": "{name}", "arguments": {{'


def _first_json(raw: str):
    for end in range(len(raw), 0, -1):
        try:
            return json.loads(raw[:end])
        except json.JSONDecodeError:
            continue
    return None


class EndpointGenerator:
    """A configured OpenAI-compatible generator endpoint; a forced prefix becomes an instruction."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        temperature: float = 0.8,
        max_new_tokens: int = 128,
        client=None,
    ):
        from openai import OpenAI

        self.name = f"endpoint:{model}"
        self.model, self.temperature, self.max_new_tokens = model, temperature, max_new_tokens
        self.client = client or OpenAI(base_url=base_url, api_key=api_key or "none", timeout=60.0, max_retries=1)

    def chat(self, messages: list[ChatMessage], tools=None, prefix: str = "") -> str:
        msgs = [{"role": m.role if m.role != "tool" else "user", "content": m.content or ""} for m in messages]
        if tools:
            msgs[0]["content"] += "\n\n" + tools_block(tools)
        if prefix:
            msgs.append({"role": "user", "content": f"Start your reply with: {prefix}"})
        r = self.client.chat.completions.create(
            model=self.model, messages=msgs, temperature=self.temperature, max_tokens=self.max_new_tokens
        )
        text = r.choices[0].message.content or ""
        return text if (not prefix or text.startswith(prefix) or "<tool_call>" in text) else prefix + text

    def call_arguments(self, messages: list[ChatMessage], tool, after: tuple[str, ...] = ()) -> str | None:
        """The arguments of a call of `tool`: with `after`, the first call of it in the reply whose arguments are
        none of those (whether the endpoint repeats the earlier calls or not)."""
        name = tool.function.name
        action = parse_assistant(self.chat(messages, [tool], "<tool_call>[" + _opening(name, after)))
        seen = {json.dumps(json.loads(a), sort_keys=True) for a in after}
        for c in action.tool_calls:
            try:
                key = json.dumps(json.loads(c.arguments), sort_keys=True)
            except json.JSONDecodeError:
                key = c.arguments
            if c.name == name and key not in seen:
                return c.arguments
        return None


def make_generator(settings, engine=None):
    q = settings.questioner
    if q.generator_base_url:
        return EndpointGenerator(q.generator_base_url, q.generator_model or "generator", q.generator_api_key)
    if engine is None:
        raise ValueError("the policy generator needs the served policy's engine")
    return PolicyGenerator(engine)


# ----------------------------------------------------------------------------- exploration
