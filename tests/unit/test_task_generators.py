"""Who writes practice: the policy's schema-guided call arguments and a configured endpoint's, first and next calls."""

import json
from types import SimpleNamespace

from live_doubles import tool

from actors.events import ChatMessage
from policies.tasks.generators import EndpointGenerator, PolicyGenerator


def test_the_policy_fills_a_required_enum_with_one_of_its_values():
    """Schema-guided arguments: a declared enum is chosen from by constrained decoding; other values are written."""

    class Engine:
        def __init__(self):
            self.options = []

        def choose(self, prompt, options, temperature=0.0):
            self.options.append(options)
            assert prompt.endswith('"unit": ')
            return options[1]

        def generate(self, prompts, max_new_tokens, temperature, top_p):
            self.prompts = prompts
            return [SimpleNamespace(text='Paris", "x')]

    eng = Engine()
    spec = tool("weather", {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}}, ["city", "unit"])
    hi = [ChatMessage(role="user", content="hi")]
    assert json.loads(PolicyGenerator(eng).call_arguments(hi, spec)) == {"city": "Paris", "unit": "F"}
    assert eng.options == [['"C"', '"F"']]
    # the answer's next call: written after the earlier one, in the same call list
    assert json.loads(PolicyGenerator(eng).call_arguments(hi, spec, after=('{"city": "Oslo", "unit": "C"}',)))["city"] == "Paris"
    assert eng.prompts[0].endswith(
        '<tool_call>[{"name": "weather", "arguments": {"city": "Oslo", "unit": "C"}}, {"name": "weather", "arguments": {"city": "'
    )


def test_an_endpoint_writes_the_next_call_whether_or_not_it_repeats_the_earlier_one():
    class Client:
        def __init__(self, reply):
            self.reply, self.sent = reply, []
            self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

        def create(self, **kw):
            self.sent.append(kw["messages"])
            return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=self.reply))])

    spec, first = tool("weather", {"city": {"type": "string"}}, ["city"]), '{"city": "Oslo"}'
    both = (
        '<tool_call>[{"name": "weather", "arguments": {"city": "Oslo"}}, '
        '{"name": "weather", "arguments": {"city": "Rome"}}]</tool_call>'
    )
    only = '<tool_call>[{"name": "weather", "arguments": {"city": "Rome"}}]</tool_call>'
    same = '<tool_call>[{"name": "weather", "arguments": {"city":"Oslo"}}]</tool_call>'
    for reply, want in ((both, {"city": "Rome"}), (only, {"city": "Rome"}), (same, None)):
        client = Client(reply)
        got = EndpointGenerator("http://x", "m", client=client).call_arguments(
            [ChatMessage(role="user", content="hi")], spec, (first,)
        )
        assert (json.loads(got) if got else None) == want, reply
        assert '"arguments": {"city": "Oslo"}}, {"name": "weather"' in client.sent[0][-1]["content"]
