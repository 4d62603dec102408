"""Self-questioning on the clients' own tools: practice written about the functions live requests declared.

Live traffic carries no right answers, but a request that declares tools says what a right call of them looks like
(their schemas) and how its users write. From those, with no user and no rating (`questioner.synth_envs` names
`client_tools`):
1. `ToolSets` keeps the declared tool sets of recent live requests, every string of their schemas and one example
   request scrubbed of personal data: at most `questioner.client_tool_sets`, at most `client_tool_sets_per_user` from one
   hashed user (that user's oldest goes first), so one user's burst cannot fill it; the least recently seen set
   goes first. It is kept with the questioner's state.
2. `ClientTaskWriter.write()` picks the least-practised function of the kept sets that BFCL's checker can read
   (`envs/client_check.bfcl_doc`), with at least one required argument and plain identifiers for names. The
   generator fills the required arguments by schema-guided decoding (`call_arguments`), shown a live request that
   declared the function, so the values look like users' values: that call is the reference (see below for two).
   The generator then writes the request that needs it, shown how users write (`synthesis.write_query`): one that
   mentions every literal value and is not an instruction, else one written as users write (`user_request`: what the
   function does and each value after its parameter's name, the function not named). A share of the tasks
   (`questioner.client_parallel_share`) asks for the function twice in one answer, the second call's values filled
   the same way as the answer's next call after the first (users ask "for A, and for B"; BFCL's parallel checker
   judges them in any order), and a request always written as users write one (a generator's sentence that mentions
   every value may still ask for one call, or pair the values two ways); where the checker takes the two for the same
   call, or the second draw is not an object, the task asks for one call. Such answers take about twice the tokens: a
   `rollout.max_new_tokens` of 128 holds them where 64 often does not.
3. Verified when the reference fits the declared schema (`envs/tool_fit.misfit`) and BFCL's checker accepts it
   against itself (two calls: in either order, and neither taken for the other); a near duplicate of an earlier
   request (Milvus, `questioner.dedup_threshold`) is rejected.
The explorer rolls the task out in `envs/client_tools.py`. A task carries the tools and the request the generator
wrote (shown scrubbed live requests), not a live request as it was sent.
"""

from __future__ import annotations

import json
import keyword
import random
import re
from collections import Counter, OrderedDict
from functools import partial

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.bfcl_single import SYSTEM
from envs.client_check import Unjudgeable, bfcl_doc, check
from envs.client_tools import CLIENT_TOOLS, reference_calls, tool_set_key
from envs.live import cleaned_tool
from envs.tool_calls import CallError, parse_python_call
from envs.tool_fit import misfit
from policies.hygiene import scrub, scrub_arguments
from policies.tasks import synthesis as syn
from policies.tasks.synthesis import describe, grounded
from policies.tasks.writer import draft

NOT_RUN = "ok (a client's tool: not run here)"


class ToolSets:
    """The declared tool sets of recent live requests (the module docstring, 1)."""

    def __init__(self, size: int = 64, per_user: int = 4, state: dict | None = None):
        self.size, self.per_user = size, per_user
        self.sets: OrderedDict[str, dict] = OrderedDict((state or {}).items())
        for user in {r["user"] for r in self.sets.values()}:  # the bounds as configured now, on restored sets too
            self._bound(user)

    def add(self, tools: list[ToolSpec], user_hash: str, request: str = "") -> str | None:
        """Keep a request's tool set. Returns its key when it was not kept yet (the caller saves the state then);
        a set kept already is moved last, its user and example request those of this request."""
        if not tools:
            return None
        clean = [cleaned_tool(t, scrub, scrub_arguments) for t in tools]
        key = tool_set_key(clean)
        new = key not in self.sets
        rec = self.sets.pop(key, None) or {"tools": [t.model_dump() for t in clean], "request": ""}
        rec["user"] = user_hash
        if request.strip():
            rec["request"] = scrub(request)[:500]
        self.sets[key] = rec  # the most recently seen last
        self._bound(user_hash)
        return key if new else None

    def _bound(self, user_hash: str) -> None:
        mine = [k for k, r in self.sets.items() if r["user"] == user_hash]
        for k in mine[: max(0, len(mine) - self.per_user)]:
            del self.sets[k]
        while len(self.sets) > self.size:
            self.sets.popitem(last=False)

    def snapshot(self) -> dict[str, dict]:
        """A copy for a writer off the event loop's thread, where the loop goes on adding and dropping sets."""
        return {k: dict(r) for k, r in self.sets.items()}

    def state(self) -> dict:
        return dict(self.sets)


def tools_of(rec: dict) -> list[ToolSpec]:
    return [ToolSpec.model_validate(t) for t in rec["tools"]]


def _plain(name) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name)


def practisable(tool: ToolSpec) -> bool:
    """Whether tasks can be written about a function: a plain name, plain parameter names (identifiers a Python
    call can pass: not keywords), at least one required argument, and a schema BFCL's checker can read."""
    f = tool.function
    props = (f.parameters or {}).get("properties") or {}
    if not _plain(f.name) or not all(_plain(k) for k in props):
        return False
    if not (f.parameters or {}).get("required"):
        return False
    try:
        bfcl_doc(tool)
    except Unjudgeable:
        return False
    return True


def python_call(name: str, args: dict) -> str:
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in args.items())})"


MAX_CALLS = 3  # the most calls of one function a task asks for in one answer


def _same(a: ToolCall, b: ToolCall, tools: list[ToolSpec]) -> bool:
    """Whether BFCL's checker would take one call for the other (a string in another case, an optional argument
    at its default): as a task's two calls, one of them would be asked for twice."""
    return check([a], tools, b)[0] or check([b], tools, a)[0]


def verify(reference: list[str], tools: list[ToolSpec]) -> tuple[bool, str]:
    """The reference is one call, or up to `MAX_CALLS` calls of one function no two of which the checker takes for
    each other, that fit the declared schema and that BFCL's checker accepts against themselves, in either order."""
    try:
        calls = reference_calls(reference)
    except CallError as exc:
        return False, f"reference is not a plain call: {exc}"
    if not 1 <= len(calls) <= MAX_CALLS:
        return False, f"a reference of {len(calls)} calls; 1 to {MAX_CALLS} are written here"
    if len({c.name for c in calls}) > 1:
        return False, "a reference of several calls asks for one function with different values"
    if (why := misfit(calls, tools)) is not None:
        return False, f"the reference does not fit the declared schema: {why}"
    try:
        if any(_same(a, b, tools) for i, a in enumerate(calls) for b in calls[i + 1 :]):
            return False, "two of the reference's calls are the same call to BFCL's checker"
        ok, why = check(calls, tools, calls)
        if ok and len(calls) > 1:  # the checker pairs calls greedily: the reverse order must pass as well
            ok, why = check(calls[::-1], tools, calls)
    except Unjudgeable as exc:
        return False, f"the checker cannot judge the reference: {exc}"
    if not ok:
        return False, f"the checker rejects the reference: {why}"
    return True, "the reference fits the declared schema and BFCL's checker accepts it"


_FORMS = ("{ask}, with {args}.", "{ask}. Use {args}.", "{ask} for {args}.")
_SEVERAL = (", once with ", ", and once with "), (" for each of these: ", "; ")  # several calls: before and between their values


def _spoken(v) -> str:
    """A value as a user writes it: a number or a plain string bare, a flat list of plain items as "a, b and c", an
    object as its keys and values; JSON where that could be read two ways (a separator inside a string, a nested or
    empty container, an empty string)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return json.dumps(v)
    if isinstance(v, str):
        plain = v.strip() and not any(sep in v for sep in (",", ";", " and "))
        return v if plain else json.dumps(v, ensure_ascii=False)
    if isinstance(v, list) and v and all(_bare(x) for x in v):
        items = [_spoken(x) for x in v]
        return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
    if isinstance(v, dict) and v and all(_bare(x) for x in v.values()):
        return ", ".join(f"{k} {_spoken(x)}" for k, x in v.items())
    return json.dumps(v, ensure_ascii=False)


def _bare(x) -> bool:
    """An item `_spoken` writes without JSON: a boolean, a number, or a plain string."""
    return isinstance(x, (bool, int, float)) or (isinstance(x, str) and _spoken(x) == x)


def _values(kwargs: dict) -> str:
    parts = [f"{k.replace('_', ' ')} {_spoken(v)}" for k, v in kwargs.items()]
    return ", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else "".join(parts)


def user_request(reference: list[str], tools: list[ToolSpec], rng: random.Random) -> str:
    """The request for a reference of one function's calls when the generator's is not grounded, as users write
    one: what the function does (its description's first sentence, else its name in words) and each value after its
    parameter's name in words (`_spoken`), in one of a few forms at random (several calls: each call's values in
    turn); the function is not named. Where that would not be grounded (a description with no word
    `grounded` can match, or one that writes a call), the plain description (`synthesis.describe`), which names the
    function and writes the values as JSON."""
    calls = [parse_python_call(c) for c in reference]
    name = calls[0].name
    doc = next((t.function.description or "" for t in tools if t.function.name == name), "")
    ask = re.split(r"(?<=[.!?])\s+", doc.strip())[0].rstrip(".?!").strip()[:200] or name.replace("_", " ")
    args = [_values(c.kwargs) for c in calls]
    ask = ask[0].upper() + ask[1:]
    if len(args) > 1:
        head, between = rng.choice(_SEVERAL)
        text = ask + head + between.join(args) + "."
    else:
        text = (rng.choice(_FORMS) if args[0] else "{ask}.").format(ask=ask, args=args[0])
    return text if grounded(text, reference, tools) else describe(reference, tools)


def _arguments(text: str | None) -> dict | None:
    """The generator's arguments as an object, or None."""
    try:
        args = json.loads(text) if text is not None else None
    except json.JSONDecodeError:
        return None
    return args if isinstance(args, dict) else None


class ClientTaskWriter:
    def __init__(self, embedder, index, gen, visits: Counter, rng: random.Random, q):
        self.embedder, self.index, self.gen = embedder, index, gen
        self.visits, self.rng, self.q = visits, rng, q

    def pick(self, sets: dict[str, dict]) -> tuple[str, ToolSpec] | None:
        """The least-practised function of the kept sets (ties at random); a set that declares one name twice is
        not practised (which of the two a call means is not said)."""
        cands = []
        for k, rec in sets.items():
            tools = tools_of(rec)
            if len({t.function.name for t in tools}) == len(tools):
                cands += [(k, t) for t in tools if practisable(t)]
        if not cands:
            return None
        return min(cands, key=lambda c: (self.visits[f"{CLIENT_TOOLS}:{c[1].function.name}"], self.rng.random()))

    def write(self, live: list[str], sigs: set[str], sets: dict[str, dict]) -> dict:
        """Write, dedup and verify one task (the module docstring, 2-3) about the kept sets (`sets`: a snapshot
        taken on the event loop's thread, `ToolSets.snapshot`). Returns the outcome: "empty", or the record
        "rejected" or "verified" with the reason."""
        picked = self.pick(sets)
        if picked is None:
            return {"outcome": "empty", "base": None}
        key, tool = picked
        name = tool.function.name
        self.visits[f"{CLIENT_TOOLS}:{name}"] += 1
        tools = tools_of(sets[key])
        request = sets[key].get("request") or f"Use {name}."
        msgs = [ChatMessage(role="system", content=SYSTEM), ChatMessage(role="user", content=request)]
        args = _arguments(self.gen.call_arguments(msgs, tool))
        if args is None:
            return {"outcome": "empty", "base": key}
        reference = [python_call(name, args)]
        share = self.q.client_parallel_share
        if share > 0 and self.rng.random() < share:  # the module docstring, 2 (no draw at 0: the same tasks as before)
            more = _arguments(self.gen.call_arguments(msgs, tool, after=(json.dumps(args),)))  # the answer's next call
            if more is not None and not self._same(reference[0], python_call(name, more), tools):
                reference = sorted(reference + [python_call(name, more)])  # one order: one signature
        exp = syn.Exploration(key, [syn.ProbeStep(call, True, NOT_RUN) for call in reference])
        trace = [f"{call} -> {NOT_RUN}" for call in reference]
        spoken = partial(user_request, rng=self.rng)
        gen = self.gen if len(reference) == 1 else None  # several calls: the request as users write it (module docstring)
        rec = draft(gen, exp, tools, live, CLIENT_TOOLS, trace, spoken, tools=[t.model_dump() for t in tools])
        if rec.sig in sigs:
            return {"outcome": "empty", "base": key}
        ok, why = verify(rec.reference, tools)
        if not ok:
            return {"task": rec, "outcome": "rejected", "reason": why}
        vec, dup = syn.near_duplicate(self.embedder, self.index, rec.query, self.q.dedup_threshold)
        if dup:
            return {"task": rec, "outcome": "rejected", "reason": dup}
        self.index.add(rec.task_id, vec, rec.query)
        return {"task": rec, "outcome": "verified", "reason": why}

    @staticmethod
    def _same(a: str, b: str, tools: list[ToolSpec]) -> bool:
        try:
            return _same(*reference_calls([a, b]), tools)
        except (CallError, Unjudgeable, ValueError):
            return False  # verify() says what is wrong with it
