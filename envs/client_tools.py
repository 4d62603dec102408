"""The clients' own tools as an environment: practice written about the functions live requests declared.

It has no dataset and is not one of `env.names`: like a live step, the explorer always has it, and the gate, the
guard and `main.py eval` never score it (it has no held-out entries). Each task is synthetic, the questioner's
(`policies/tasks/client_tasks.py`): a request the policy wrote about one of a client's functions, the call it was
written from (the reference: one Python call string, or several calls of one function made in one answer), and the
tool set the live request declared. The episode is one action, as a client with `tool_choice: "required"` asks for
it: the calls are checked against the reference by BFCL's AST checker on the client's own schema
(`envs/client_check.py`; several calls: its parallel checker, in any order). Nothing a client declared is ever run here.
Outcome 1.0 when the checker accepts, else 0.0; the step's signal is +1 accepted, -0.5 rejected (with the checker's
reason), -1 no call, as in `bfcl_single`.

An episode's spec (from the `Task` event): `tools` (the declared tool set), `query` and `reference`.
"""

from __future__ import annotations

import hashlib
import json

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.base import Reference, Split
from envs.bfcl_single import OneCallEpisode
from envs.client_check import check
from envs.tool_calls import parse_python_call

CLIENT_TOOLS = "client_tools"


def tool_set_key(tools: list[ToolSpec]) -> str:
    """The identity of a declared tool set: its functions' schemas, in name order."""
    body = json.dumps(sorted((t.model_dump() for t in tools), key=lambda t: t["function"]["name"]), sort_keys=True)
    return "tools-" + hashlib.sha256(body.encode()).hexdigest()[:16]


def reference_calls(reference: list[str]) -> list[ToolCall]:
    out = []
    for i, text in enumerate(reference):
        p = parse_python_call(text)
        out.append(ToolCall(id=f"ref-{i}", name=p.name, arguments=json.dumps(p.kwargs)))
    return out


class ClientToolsEpisode(OneCallEpisode):
    def __init__(self, entry_id: str, spec: dict):
        tools = [t if isinstance(t, ToolSpec) else ToolSpec.model_validate(t) for t in spec["tools"]]
        super().__init__(entry_id, spec["query"], tools)
        self.reference = reference_calls(spec["reference"])
        if not self.reference:
            raise ValueError("a client-tools task has at least one reference call")

    def judge(self, calls: list[ToolCall]) -> tuple[bool, str]:
        return check(calls, self.tools, self.reference)


class ClientToolsEnvironment:
    name = CLIENT_TOOLS  # no entries of its own: every task is written about a live request's tools

    def entries(self, split: Split) -> list[str]:
        return []

    def episode(self, entry_id: str, spec: dict | None = None) -> ClientToolsEpisode:
        if not spec or not spec.get("tools") or not spec.get("reference"):
            raise ValueError("a client-tools episode needs the task's tools, query and reference")
        return ClientToolsEpisode(entry_id, spec)

    def category_of(self, entry_id: str) -> str:
        return self.name

    def level_of(self, entry_id: str) -> int:
        return 0

    def query_of(self, entry_id: str) -> str:
        return ""

    def reference_action(self, entry_id: str) -> Reference | None:
        return None  # no entry has a reference outside its task

    def reference_solution(self, entry_id: str, spec: dict | None = None) -> list[list[ChatMessage]] | None:
        if not spec:
            return None
        return [[ChatMessage(role="assistant", tool_calls=reference_calls(spec["reference"]))]]
