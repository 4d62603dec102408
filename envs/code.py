"""A code-interpreter environment (Agent0-style): reason -> run Python -> read the result -> answer.

Tasks are generated deterministically from an entry id (`code_<family>_<n>`), each with a
reference answer and a reference program computed here, so they are verifiable offline. The
families form a ladder (`LEVELS`): level 0 is one `python` call that prints a sum, level 1 a
product plus a term, level 2 modular arithmetic, level 3 loops (primes, Fibonacci, digit sums,
Collatz). The questioner climbs it; the explorer replays a reference program as an off-policy
sample when a whole group fails (`reference_solution`). The agent has one tool,
`python(code)`, executed in the `envs.sandbox` subprocess sandbox (time, memory, process, output
limits, no network). A turn ends when the agent answers in text; the outcome is 1.0 when the last
number in the answer equals the reference, else 0.0.
"""

from __future__ import annotations

import json
import random
import re

from actors.events import ChatMessage, ToolCall, ToolSpec
from envs.base import Reference, Split, StepResult, split_of
from envs.sandbox import Limits, run_python

SYSTEM = (
    "You are an assistant that solves problems by writing Python. Call the python tool with code that "
    "prints the result (or ends with an expression), read the output, then give the final answer as a number."
)
PYTHON_TOOL = ToolSpec(
    function={
        "name": "python",
        "description": "Run Python 3 code in a sandbox; returns what it prints, or the value of its last expression.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "Python source"}},
            "required": ["code"],
        },
    }
)
ENTRIES_PER_FAMILY = 100
_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def _primes_below(n: int) -> list[int]:
    sieve = bytearray([1]) * n
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(n**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytearray(len(sieve[i * i :: i]))
    return [i for i in range(n) if sieve[i]]


def _task(family: str, n: int) -> tuple[str, str, str]:
    """(question, reference answer, reference program) for one entry; deterministic in (family, n)."""
    r = random.Random(f"{family}:{n}")
    if family == "add":
        a, b = r.randint(100, 99999), r.randint(100, 99999)
        return f"What is {a} + {b}?", str(a + b), f"print({a} + {b})"
    if family == "muladd":
        a, b, c = r.randint(11, 999), r.randint(11, 999), r.randint(1, 999)
        return f"What is {a} * {b} + {c}?", str(a * b + c), f"print({a} * {b} + {c})"
    if family == "arith":
        a, b, c = r.randint(1000, 99999), r.randint(1000, 99999), r.randint(2, 99)
        return f"What is ({a} * {b}) mod {c} + {a}?", str((a * b) % c + a), f"print(({a} * {b}) % {c} + {a})"
    if family == "primes":
        m = r.randint(100, 5000)
        return (
            f"What is the sum of all prime numbers below {m}?",
            str(sum(_primes_below(m))),
            f"print(sum(p for p in range(2, {m}) if all(p % d for d in range(2, int(p ** 0.5) + 1))))",
        )
    if family == "fib":
        k, m = r.randint(20, 200), r.randint(7, 997)
        a, b = 0, 1
        for _ in range(k):
            a, b = b, a + b
        return (
            f"What is the {k}-th Fibonacci number (F(0)=0, F(1)=1) modulo {m}?",
            str(a % m),
            f"a, b = 0, 1\nfor _ in range({k}):\n    a, b = b, a + b\nprint(a % {m})",
        )
    if family == "digits":
        k = r.randint(10, 60)
        return (
            f"What is the sum of the digits of 2 to the power {k}?",
            str(sum(int(d) for d in str(2**k))),
            f"print(sum(int(d) for d in str(2 ** {k})))",
        )
    if family == "collatz":
        x = r.randint(10, 10_000)
        steps, y = 0, x
        while y != 1:
            y = y // 2 if y % 2 == 0 else 3 * y + 1
            steps += 1
        return (
            f"How many steps does the Collatz sequence starting at {x} take to reach 1?",
            str(steps),
            f"y, n = {x}, 0\nwhile y != 1:\n    y = y // 2 if y % 2 == 0 else 3 * y + 1\n    n += 1\nprint(n)",
        )
    raise KeyError(family)


LEVELS: dict[str, int] = {"add": 0, "muladd": 1, "arith": 2, "primes": 3, "fib": 3, "digits": 3, "collatz": 3}
FAMILIES = tuple(LEVELS)


def notebook_cell(code: str) -> str:
    """Like a notebook cell, the value of a final bare expression is shown (printed when not None), so
    `40265 + 63807` answers as `print(40265 + 63807)` does. Code that does not parse runs unchanged and
    reports its own SyntaxError."""
    import ast

    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):
        return code
    last = tree.body[-1] if tree.body else None
    if not isinstance(last, ast.Expr):
        return code
    if isinstance(last.value, ast.Call) and getattr(last.value.func, "id", None) == "print":
        return code
    show = ast.parse("__kaizen_value = None\nif __kaizen_value is not None:\n    print(__kaizen_value)").body
    show[0].value = last.value
    tree.body[-1:] = show
    return ast.unparse(ast.fix_missing_locations(tree))


def last_number(text: str) -> str | None:
    found = _NUM.findall(text.replace(",", ""))
    return found[-1] if found else None


class CodeEpisode:
    def __init__(self, entry_id: str, max_steps: int, limits: Limits, max_obs_chars: int):
        _, family, n = entry_id.split("_")
        self.entry_id, self.category = entry_id, family
        self.question, self.answer, self.program = _task(family, int(n))
        self.max_steps, self.limits, self.max_obs = max_steps, limits, max_obs_chars
        self.system_prompt = SYSTEM
        self.tools = [PYTHON_TOOL]
        self.turn, self.steps, self.score = -1, 0, None

    def next_user_message(self) -> str | None:
        self.turn += 1
        return self.question if self.turn == 0 else None

    def step(self, action: ChatMessage) -> StepResult:
        self.steps += 1
        if not action.tool_calls:
            got = last_number(action.content)
            self.score = 1.0 if got is not None and _same(got, self.answer) else 0.0
            return StepResult([], 1.0 if self.score else -0.5, True)
        obs, signals, errors = [], [], []
        for tc in action.tool_calls:
            if tc.name != "python":
                obs.append(ChatMessage(role="tool", tool_call_id=tc.id, content=f"Error: unknown function {tc.name!r}"))
                signals.append(-1.0)
                errors.append(f"unknown function {tc.name}")
                continue
            try:
                args = json.loads(tc.arguments) if tc.arguments.strip() else {}
                code = args["code"] if isinstance(args, dict) else None
            except (json.JSONDecodeError, KeyError):
                code = None
            if not isinstance(code, str):
                obs.append(ChatMessage(role="tool", tool_call_id=tc.id, content='Error: expected {"code": "<python>"}'))
                signals.append(-0.8)
                errors.append("bad python arguments")
                continue
            res = run_python(notebook_cell(code), self.limits)
            if res.ok:
                text, sig = res.stdout or "(no output)", 0.3
                if _same(last_number(res.stdout) or "", self.answer):
                    sig = 1.0
            else:
                why = f" (stopped: {res.killed_by} limit)" if res.killed_by else ""
                text, sig = f"Error{why}:\n{res.stderr[-self.max_obs :]}", -0.5
                errors.append(f"code failed{why}")
            obs.append(ChatMessage(role="tool", tool_call_id=tc.id, content=text[: self.max_obs]))
            signals.append(sig)
        return StepResult(obs, sum(signals) / len(signals), self.steps >= self.max_steps, errors)

    def end_turn(self) -> None:
        pass

    def snapshot(self) -> dict:
        return {"turn": self.turn, "steps": self.steps, "score": self.score}

    def restore(self, snap: dict) -> None:
        self.turn, self.steps, self.score = snap["turn"], snap["steps"], snap["score"]

    def outcome(self) -> float:
        return self.score or 0.0

    def passed(self) -> bool:
        return self.score == 1.0


def _same(a: str, b: str) -> bool:
    try:
        return abs(float(a) - float(b)) < 1e-6
    except ValueError:
        return False


class CodeEnvironment:
    name = "code"

    def __init__(
        self,
        max_steps_per_turn: int = 3,
        heldout_fraction: float = 0.2,
        max_observation_chars: int = 800,
        limits: Limits | None = None,
    ):
        self.max_steps, self.heldout_fraction, self.max_obs = max_steps_per_turn, heldout_fraction, max_observation_chars
        self.limits = limits or Limits()
        self._ids = [f"code_{f}_{n}" for f in FAMILIES for n in range(ENTRIES_PER_FAMILY)]

    @classmethod
    def from_settings(cls, env) -> "CodeEnvironment":
        return cls(env.max_steps_per_turn, env.heldout_fraction, env.max_observation_chars)

    def entries(self, split: Split) -> list[str]:
        return sorted(e for e in self._ids if split_of(e, self.heldout_fraction) == split)

    def episode(self, entry_id: str, spec: dict | None = None) -> CodeEpisode:
        if spec is not None:
            raise ValueError("the code environment has no synthetic tasks (its problems carry checked answers)")
        if entry_id not in set(self._ids):
            raise KeyError(f"unknown code entry {entry_id!r}")
        return CodeEpisode(entry_id, self.max_steps, self.limits, self.max_obs)

    def query_of(self, entry_id: str) -> str:
        _, family, n = entry_id.split("_")
        return _task(family, int(n))[0]

    def level_of(self, entry_id: str) -> int:
        """Rung of the difficulty ladder (0 = one call that prints a sum)."""
        return LEVELS[self.category_of(entry_id)]

    def category_of(self, entry_id: str) -> str:
        return entry_id.split("_")[1]

    def reference_action(self, entry_id: str) -> Reference:
        """The first action of the reference solution: the python call that prints the answer."""
        ep = self.episode(entry_id)
        return Reference(
            [ChatMessage(role="system", content=ep.system_prompt), ChatMessage(role="user", content=ep.question)],
            ep.tools,
            self.reference_solution(entry_id)[0][0],
        )

    def reference_solution(self, entry_id: str, spec: dict | None = None) -> list[list[ChatMessage]]:
        """A known-good trajectory, per turn: run the reference program, then state its result."""
        ep = self.episode(entry_id, spec)
        call = ToolCall(id="ref-0", name="python", arguments=json.dumps({"code": ep.program}))
        return [
            [
                ChatMessage(role="assistant", tool_calls=[call]),
                ChatMessage(role="assistant", content=f"The answer is {ep.answer}."),
            ]
        ]
