"""Self-questioning: explore an environment, write tasks with reference solutions, keep the good ones.

1. `explore()`: curiosity-guided exploration of a train entry's functions. Each step forces a
   call of the least-visited function (visits counted across explorations; among those, the one
   with the fewest required arguments, then at random: a call the policy can get right comes
   first, the ladder's lowest rung) and lets the generator fill in its arguments from the tool
   schemas and the previous results; every call runs on fresh backends and is recorded.
2. `write_query()`: from the calls that worked, the generator writes the request a user would
   send, shown how live users write (recent `evo.interaction` queries). The request must mention
   every literal value of the reference solution; otherwise (or when it reads like an
   instruction to the model) it is replaced by a plain description built from the tool
   descriptions, and `synthesizer` says which one was used.
3. `verify()`: feasibility by replaying the reference in a fresh synthetic episode: every call must
   execute without error and BFCL's state and response checkers must pass. Tasks that fail are
   hallucinated and dropped.
4. `TaskIndex`: semantic dedup of task queries in Milvus Lite (cosine >= threshold = duplicate).
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field

from actors.events import ChatMessage, ToolCall
from envs.base import replay
from envs.tool_calls import CallError, parse_python_call
from policies.hygiene import looks_like_injection, scrub
from policies.tasks.generators import EndpointGenerator, PolicyGenerator, make_generator  # noqa: F401

EXPLORE_SYSTEM = (
    "You are exploring a set of functions to learn what they do. Call the function you are asked to "
    "try, with sensible arguments that fit what you have seen so far."
)


@dataclass
class ProbeStep:
    call: str
    ok: bool
    result: str


@dataclass
class Exploration:
    base_entry_id: str
    steps: list[ProbeStep] = field(default_factory=list)

    @property
    def reference(self) -> list[str]:
        return [s.call for s in self.steps if s.ok]


# ----------------------------------------------------------------------------- generators


def explore(generator, env, base_entry_id: str, steps: int, visits: Counter, rng: random.Random) -> Exploration:
    """Curiosity-guided exploration of one train entry's functions (see module docstring)."""
    probe = env.probe(base_entry_id)
    out = Exploration(base_entry_id)
    names = [t.function.name for t in probe.tools]
    if not names:
        return out
    msgs = [
        ChatMessage(role="system", content=EXPLORE_SYSTEM),
        ChatMessage(role="user", content=f"{probe.description}. Try them one at a time."),
    ]
    by_name = {t.function.name: t for t in probe.tools}
    for i in range(steps):
        fname = min(names, key=lambda n: (visits[n], len(by_name[n].function.parameters.get("required") or []), rng.random()))
        visits[fname] += 1
        arguments = generator.call_arguments(msgs, by_name[fname])
        tc = ToolCall(id=f"call_{i}", name=fname, arguments=arguments if arguments is not None else "{}")
        if arguments is None:
            out.steps.append(ProbeStep(f"{fname}(...)", False, "Error: no usable arguments written"))
            continue
        call, ok, result = probe.call(tc.name, tc.arguments)
        out.steps.append(ProbeStep(call, ok, result[:400]))
        msgs.append(ChatMessage(role="assistant", tool_calls=[tc]))
        msgs.append(ChatMessage(role="tool", tool_call_id=tc.id, content=result[:400]))
        msgs.append(ChatMessage(role="user", content="Good. Try another function."))
    return out


# ----------------------------------------------------------------------------- the query


def literals(reference: list[str]) -> list[str]:
    """Every literal argument value (as text) a request must mention for the task to be solvable."""
    out: list[str] = []

    def walk(v):
        if isinstance(v, bool) or v is None:
            return
        if isinstance(v, (int, float)):
            out.append(str(v))
        elif isinstance(v, str):
            if v.strip():
                out.append(v)
        elif isinstance(v, dict):
            for x in v.values():
                walk(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                walk(x)

    for call in reference:
        p = parse_python_call(call)
        for v in (*p.args, *p.kwargs.values()):
            walk(v)
    return out


_STOP = {"the", "and", "for", "with", "from", "into", "that", "this", "user", "given", "specified", "current", "function"}


def _words(text: str) -> set[str]:
    return {w for w in re.findall(r"[a-z]{4,}", text.lower()) if w not in _STOP}


def grounded(query: str, reference: list[str], tools=()) -> bool:
    """The request mentions every literal value, says something about every call (a word of its
    name or description), and is not itself code."""
    q = query.lower()
    if not all(lit.lower() in q for lit in literals(reference)):
        return False
    docs = {t.function.name: t.function.description or "" for t in tools}
    words = _words(query)
    for call in reference:
        name = parse_python_call(call).name
        if f"{name.lower()}(" in q:
            return False
        if not words & (_words(name.replace("_", " ")) | _words(docs.get(name, ""))):
            return False
    return True


def describe(reference: list[str], tools) -> str:
    """A plain request built from the tool descriptions; always grounded."""
    docs = {t.function.name: (t.function.description or "").strip().split(". ")[0].rstrip(".") for t in tools}
    parts = []
    for call in reference:
        p = parse_python_call(call)
        what = docs.get(p.name) or f"run {p.name}"
        args = ", ".join(f"{k} {json.dumps(v)}" for k, v in p.kwargs.items())
        parts.append(f"{what[0].lower() + what[1:]} using {p.name}" + (f" with {args}" if args else ""))
    return "Please " + "; then ".join(parts) + "."


def write_query(generator, exploration: Exploration, tools, live_examples: list[str], fallback=describe) -> tuple[str, str]:
    """(query, synthesizer) for an exploration's working calls; `fallback(reference, tools)` when the generator's is
    not grounded, or when there is no generator (None)."""
    ref = exploration.reference
    if generator is None:  # the caller wants the fallback's request
        return fallback(ref, tools), "template"
    shown = "\n".join(f"{i}. {s.call} -> {s.result[:150]}" for i, s in enumerate([s for s in exploration.steps if s.ok], 1))
    style = (
        "\nUsers write requests like these:\n" + "\n".join(f"- {scrub(e)[:160]}" for e in live_examples[-5:])
        if live_examples
        else ""
    )
    msgs = [
        ChatMessage(
            role="user",
            content=(
                f"These function calls were made, with their results:\n{shown}\n{style}\n\nWrite the single request a user "
                "would send that needs exactly these calls. Mention every value used. Reply with the request only."
            ),
        )
    ]
    try:
        text = generator.chat(msgs).strip().split("\n")[0].strip().strip('"')[:400]
    except Exception:  # a failing generator endpoint falls back to the description
        text = ""
    if text and grounded(text, ref, tools) and not looks_like_injection(text):
        return text, generator.name
    return fallback(ref, tools), "template"


# ----------------------------------------------------------------------------- feasibility


def verify(env, task_entry_id: str, spec: dict) -> tuple[bool, str]:
    """Replay the reference in a fresh synthetic episode: it must run cleanly and pass BFCL's checkers."""
    try:
        calls = [parse_python_call(c) for c in spec["reference"]]
    except CallError as exc:
        return False, f"reference is not a plain call list: {exc}"
    action = ChatMessage(
        role="assistant",
        tool_calls=[ToolCall(id=f"ref{i}", name=c.name, arguments=json.dumps(c.kwargs)) for i, c in enumerate(calls)],
    )
    try:
        ep = env.episode(task_entry_id, spec)
        if ep.next_user_message() is None:
            return False, "task has no turn"
        r = ep.step(action)
        if r.errors or r.signal < 1.0:  # every call must run and return a non-error result
            bad = (
                r.errors[-1]
                if r.errors
                else next(
                    (o.content for o in r.observations if "rror" in o.content[:60]),
                    r.observations[-1].content if r.observations else "",
                )
            )
            return False, "reference call fails on replay: " + bad[:200]
        if not ep.passed():
            return False, "reference replay does not pass the state/response check (not reproducible)"
        again = replay(env, task_entry_id, [[action]], spec)
        if again.outcome() != 1.0:
            return False, "second replay differs (not reproducible)"
    except (KeyError, ValueError, CallError) as exc:
        return False, f"task cannot be instantiated: {exc}"
    return True, "reference replays cleanly and passes BFCL's checkers"


def signature(env_name: str, base_entry_id: str, reference: list[str]) -> str:
    """Identity of a synthetic task: same start state and same reference = same task."""
    return hashlib.sha256(json.dumps([env_name, base_entry_id, reference]).encode()).hexdigest()[:32]


def task_entry_id(sig: str) -> str:
    return f"syn-{sig[:16]}"


# ----------------------------------------------------------------------------- dedup


def near_duplicate(embedder, index, query: str, threshold: float) -> tuple[list[float], str | None]:
    """The request's embedding, and why it duplicates an accepted task's (cosine >= threshold), or None."""
    vec = embedder.embed([query])[0]
    near = index.nearest(vec)
    if near and near[1] >= threshold:
        return vec, f"duplicate of {near[0]} (cosine {near[1]:.3f})"
    return vec, None


class TaskIndex:
    """Embeddings of accepted task queries in Milvus Lite (its own data dir: one process per dir)."""

    COLLECTION = "tasks"

    def __init__(self, path: str, dim: int):
        from pymilvus import DataType, MilvusClient

        self.path = path
        self.client = MilvusClient(path)
        self.lock = threading.Lock()
        if not self.client.has_collection(self.COLLECTION):
            schema = self.client.create_schema(auto_id=False, enable_dynamic_field=False)
            schema.add_field("id", DataType.VARCHAR, is_primary=True, max_length=64)
            schema.add_field("vector", DataType.FLOAT_VECTOR, dim=dim)
            schema.add_field("query", DataType.VARCHAR, max_length=2048)
            index = self.client.prepare_index_params()
            index.add_index("vector", index_type="FLAT", metric_type="COSINE")
            self.client.create_collection(self.COLLECTION, schema=schema, index_params=index)
        self.client.load_collection(self.COLLECTION)

    def nearest(self, vector: list[float]) -> tuple[str, float] | None:
        with self.lock:
            hits = self.client.search(
                self.COLLECTION, [vector], limit=1, output_fields=["query"], search_params={"metric_type": "COSINE"}
            )[0]
        return (hits[0]["id"], float(hits[0]["distance"])) if hits else None

    def add(self, task_id: str, vector: list[float], query: str) -> None:
        with self.lock:
            self.client.upsert(self.COLLECTION, [{"id": task_id, "vector": vector, "query": query[:2000]}])
            self.client.flush(self.COLLECTION)

    def close(self) -> None:
        from policies.memory.pool import release_lite

        release_lite(self.client, self.path)


_WS = re.compile(r"\s+")


def normalise(query: str) -> str:
    return _WS.sub(" ", query).strip()
