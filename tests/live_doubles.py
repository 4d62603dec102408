"""Doubles for the tests of live steps and their alternatives: tools, a served interaction, an engine that records
its prompts. tests/ is on sys.path (its conftest.py)."""

import json

from actors.events import ChatMessage, Interaction, ToolCall, ToolSpec
from policies.engines.generation import Generation


def tool(name: str, properties: dict, required: list[str], description: str = "") -> ToolSpec:
    """A function tool whose parameters are an object of these properties."""
    params = {"type": "object", "properties": properties, "required": list(required)}
    return ToolSpec(function={"name": name, "description": description, "parameters": params})


def weather(*required: str) -> ToolSpec:
    """get_weather(city: string, days: integer), with the given parameters required."""
    return tool("get_weather", {"city": {"type": "string"}, "days": {"type": "integer"}}, list(required))


WEATHER = weather("city")
TIME = ToolSpec(function={"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}}})
ASK = "What is the weather in Oslo for the next 3 days?"


def answer(args: dict | str, name="get_weather", cid="c1") -> ChatMessage:
    text = args if isinstance(args, str) else json.dumps(args)
    return ChatMessage(role="assistant", tool_calls=[ToolCall(id=cid, name=name, arguments=text)])


def interaction(iid="i1", response=None, tools=(WEATHER,), choice="required", user="u1", messages=None):
    it = Interaction(
        interaction_id=iid,
        user_hash=user,
        messages=messages or [ChatMessage(role="user", content=ASK)],
        tools=list(tools),
        response=response or answer({"city": "Oslo", "days": "3"}),
        tool_choice=choice,
    )
    it.weights_version = "w-000003"
    return it


class FakeEngine:
    """Answers each prompt with the next canned text (a ("text", "length") pair: cut off by the token budget), and
    records the prompts and the options it chose among."""

    version = "w-000005"

    def __init__(self, texts):
        self.texts, self.prompts, self.chose = list(texts), [], []

    def choose(self, prompt, options, temperature=0.0):
        self.chose.append(options)
        return options[-1]

    def count_tokens(self, text):
        return 1

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, grammar=None):
        assert prompts, "an empty batch (the engine's tokenizer fails on one)"
        self.prompts += prompts
        self.grammars = getattr(self, "grammars", []) + [grammar] * len(prompts)
        out = []
        for _ in prompts:
            text = self.texts.pop(0)
            text, finish = (text, "stop") if isinstance(text, str) else text
            out.append(Generation(text, 10, 5, finish, self.version))
        return out
