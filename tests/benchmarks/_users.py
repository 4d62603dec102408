"""bench_learning_curve's scripted users: an agent client that asks arithmetic questions with the `python` tool
declared, runs the tool calls it gets back in the sandbox, and rates every answer by a verifiable rule (+1 when the
number is right, -1 otherwise). The questions are drawn fresh (not the environments' held-out entries)."""

import json
import random
import re
import threading
from pathlib import Path

PYTHON_TOOL = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python 3 code in a sandbox; returns what it prints, or the value of its last expression.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]},
    },
}


def question(rng: random.Random) -> tuple[str, int]:
    a, b = rng.randint(100, 99999), rng.randint(100, 99999)
    if rng.random() < 0.5:
        return f"Please compute {a} + {b}.", a + b
    c = rng.randint(1, 999)
    a, b = a % 1000, b % 1000
    return f"How much is {a} * {b} + {c}?", a * b + c


def right(text: str, truth: int) -> bool:
    nums = re.findall(r"-?\d+(?:\.\d+)?", (text or "").replace(",", ""))
    try:
        return bool(nums) and abs(float(nums[-1]) - truth) < 1e-6
    except ValueError:
        return False


def users(run: dict, stop: threading.Event, stats: dict, pause_s: float, seed: int) -> None:
    """One scripted agent client: ask, run the tool call it gets (sandboxed), rate every answer."""
    import httpx
    import openai

    from envs.code import notebook_cell
    from envs.sandbox import run_python

    key = Path(run["api_key_file"]).read_text().strip()
    c = openai.OpenAI(base_url=run["endpoint"], api_key=key, max_retries=0, timeout=300)
    rng = random.Random(seed)

    def rate(r, score):
        httpx.post(
            run["endpoint"] + "/feedback",
            headers={"Authorization": f"Bearer {key}"},
            json={"interaction_id": r.id, "score": score},
            timeout=60,
        )
        stats["rated"] += 1

    while not stop.is_set():
        q, truth = question(rng)
        msgs = [{"role": "user", "content": q}]
        try:
            # an agent client that wants its sums run: the first turn must call the tool
            r = c.chat.completions.create(
                model=run["model"], messages=msgs, tools=[PYTHON_TOOL], max_tokens=48, tool_choice="required"
            )
            stats["requests"] += 1
            m = r.choices[0].message
            if m.tool_calls:
                tc = m.tool_calls[0]
                try:
                    code = json.loads(tc.function.arguments).get("code", "")
                except (ValueError, AttributeError):
                    code = ""
                out = run_python(notebook_cell(code)).stdout if isinstance(code, str) and code else ""
                stats["tool_right"] += right(out, truth)
                rate(r, 1.0 if right(out, truth) else -1.0)
                msgs += [
                    m.model_dump(exclude_none=True),
                    {"role": "tool", "tool_call_id": tc.id, "content": out or "(no output)"},
                ]
                r = c.chat.completions.create(model=run["model"], messages=msgs, tools=[PYTHON_TOOL], max_tokens=32)
                stats["requests"] += 1
            ok = right(r.choices[0].message.content, truth)
            stats["right"] += ok
            rate(r, 1.0 if ok else -1.0)
        except Exception as exc:  # counted, never fatal: the benchmark measures learning, bench_load measures serving
            stats["failed"] += 1
            stats["last_error"] = repr(exc)[:200]
        stop.wait(pause_s)
