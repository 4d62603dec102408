"""Learning from what users do next: unrated, multi-turn traffic with the client's own tools (CPU default, real `up`).

Scripted agent clients replay public function-calling requests through the OpenAI API: BFCL v4 `simple_python`,
`multiple` and `parallel` train entries (bfcl-eval's data), each with its declared functions as the client's
tools (dots in names escaped to `_`, as OpenAI clients do). The client asks for a call (`tool_choice: required`),
checks the calls it gets with BFCL's own AST checker (`envs/bfcl_single.py`) and behaves as a user does: a wrong
call gets the tool's error back, then "That is not what I asked." and the request again, in the same
conversation; a right one gets the tools' results and the next request. Per 10 minutes it counts the first requests,
those whose calls fit the declared tools (`envs/tool_fit.py`) and those that were right (`by_10min`). A conversation holds up to
`--requests-per-conversation` requests. No answer is rated unless `--rate-share` says so (then that share of
answers, drawn at random, gets +1 / -1 by the checker). The held-out split of those categories is never sent.
`--bfcl-categories simple_python` keeps the traffic, the held-out split and the guard's checks to that category
(`env.bfcl_single_categories`).

Everything else is bench_learning_curve's: `up` on a fresh state dir, `--minutes` of traffic, then the base and
the served versions scored on the held-out split (`--per-category bfcl_single=N`, avg@k with k = 16 here unless
`--k` says otherwise, paired sign-flip test),
the lineage, per-stage times, what each learner step learned from, the judgements that came from next turns by
rule, and the guard's checks (its suite is set to the same held-out split here). Writes JSON and a PNG.

    .venv/bin/python tests/benchmarks/bench_live_traffic.py --minutes 60 [--rate-share 0.1] [--bfcl-categories C,C]
        [--set learner.wait_for=live]
"""

import json
import random
import tempfile
import threading
import time
from pathlib import Path

import yaml

from _common import ROOT  # noqa: E402  (also puts the repository on sys.path)
from bench_learning_curve import parser, run  # noqa: E402
from config.overrides import apply_overrides  # noqa: E402
from config.settings import Settings  # noqa: E402
from envs.bfcl_single import CATEGORIES  # noqa: E402

NOT_WHAT_I_ASKED = "That is not what I asked."


def _tools(entry: dict) -> tuple[list[dict], dict[str, str]]:
    from envs.bfcl_single import to_tool_spec

    tools, names = [], {}
    for doc in entry["function"]:
        spec = to_tool_spec(doc).model_dump()
        names[spec["function"]["name"].replace(".", "_")] = spec["function"]["name"]
        spec["function"]["name"] = spec["function"]["name"].replace(".", "_")
        tools.append(spec)
    return tools, names


def live_users(rate_share: float, per_conversation: int, categories: list[str], max_tokens: int = 96):
    def users(run_info: dict, stop: threading.Event, stats: dict, pause_s: float, seed: int) -> None:
        import httpx
        import openai

        from actors.events import ToolCall, ToolSpec
        from envs.bfcl_single import SingleTurnEnvironment, check, load
        from envs.tool_fit import misfit

        env = SingleTurnEnvironment(categories=categories)
        train = env.entries("train")  # the held-out split is never sent
        entries = {e: load(env.category_of(e))[0][e] for e in train}
        key = Path(run_info["api_key_file"]).read_text().strip()
        c = openai.OpenAI(base_url=run_info["endpoint"], api_key=key, max_retries=0, timeout=300)
        rng = random.Random(seed)
        stats.update(conversations=0, right=0, wrong=0, retries=0, retry_right=0, by_10min={})
        t0 = time.monotonic()

        def tally(m, tools, ok):
            """First requests per 10 minutes: [asked, calls that fit the declared tools, right]."""
            row = stats["by_10min"].setdefault(str(int((time.monotonic() - t0) // 600) * 10), [0, 0, 0])
            calls = [ToolCall(id=t.id, name=t.function.name, arguments=t.function.arguments) for t in (m.tool_calls or [])]
            row[0] += 1
            row[1] += bool(calls) and misfit(calls, [ToolSpec.model_validate(t) for t in tools]) is None
            row[2] += ok

        def ask(msgs, tools):
            r = c.chat.completions.create(
                model=run_info["model"], messages=msgs, tools=tools, tool_choice="required", max_tokens=max_tokens
            )
            stats["requests"] += 1
            return r, r.choices[0].message

        def judge(eid, m, names):
            calls = [
                ToolCall(id=t.id, name=names.get(t.function.name, t.function.name), arguments=t.function.arguments)
                for t in (m.tool_calls or [])
            ]
            return check(eid, calls) if calls else (False, "no function call")

        def maybe_rate(r, ok):
            if rng.random() < rate_share:
                httpx.post(
                    run_info["endpoint"] + "/feedback",
                    headers={"Authorization": f"Bearer {key}"},
                    json={"interaction_id": r.id, "score": 1.0 if ok else -1.0},
                    timeout=60,
                )
                stats["rated"] += 1

        while not stop.is_set():
            msgs, tools, names = [], [], {}
            stats["conversations"] += 1
            try:
                for _ in range(per_conversation):
                    eid = rng.choice(train)
                    more, more_names = _tools(entries[eid])
                    tools += [t for t in more if t["function"]["name"] not in names]
                    names.update(more_names)
                    question = entries[eid]["question"][0][-1]["content"]
                    msgs.append({"role": "user", "content": question})
                    r, m = ask(msgs, tools)
                    ok, why = judge(eid, m, names)
                    stats["right" if ok else "wrong"] += 1
                    tally(m, tools, ok)
                    maybe_rate(r, ok)
                    msgs.append(m.model_dump(exclude_none=True))
                    results = [
                        {
                            "role": "tool",
                            "tool_call_id": t.id,
                            "content": json.dumps({"status": "ok"})
                            if ok
                            else f"Error: {why or 'the call does not match the request'}",
                        }
                        for t in (m.tool_calls or [])
                    ]
                    msgs += results
                    if not ok:  # what a user does next: say so, ask again
                        msgs.append({"role": "user", "content": f"{NOT_WHAT_I_ASKED} {question}"})
                        r, m = ask(msgs, tools)
                        ok, why = judge(eid, m, names)
                        stats["retries"] += 1
                        stats["retry_right"] += ok
                        maybe_rate(r, ok)
                        msgs.append(m.model_dump(exclude_none=True))
                        msgs += [
                            {
                                "role": "tool",
                                "tool_call_id": t.id,
                                "content": json.dumps({"status": "ok"})
                                if ok
                                else f"Error: {why or 'the call does not match the request'}",
                            }
                            for t in (m.tool_calls or [])
                        ]
            except Exception as exc:  # counted, never fatal
                stats["failed"] += 1
                stats["last_error"] = repr(exc)[:200]
            stop.wait(pause_s)

    return users


def main():
    ap = parser()
    ap.set_defaults(
        per_category="bfcl_single=16",
        categories="",
        k=16,  # one version at avg@4 on 48 entries has ~2 points of scoring noise alone; avg@16 halves it (LOG.md)
        max_versions=3,
        user_pause_s=10.0,
        out=str(ROOT / "tests" / "benchmarks" / "results" / "live_traffic_cpu"),
    )
    ap.add_argument("--rate-share", type=float, default=0.0, help="share of answers rated (+1/-1 by the checker)")
    ap.add_argument("--requests-per-conversation", type=int, default=3)
    ap.add_argument(
        "--user-max-tokens",
        type=int,
        default=96,
        help="the users' max_tokens; a `parallel` entry's calls take a median 105 tokens (held-out references, SmolLM2's "
        "tokenizer), past 96 for 26 of 44; the held-out split is scored at the config's rollout.max_new_tokens",
    )
    ap.add_argument(
        "--bfcl-categories",
        default=",".join(CATEGORIES),
        help="the single-turn categories of the traffic, the held-out split and the guard's checks (comma-separated)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a dotted setting over --config (e.g. learner.wait_for=live): one change, no copy of the config",
    )
    a = ap.parse_args()
    cats = a.bfcl_categories.split(",")
    cfg = yaml.safe_load(Path(a.config).read_text()) or {}
    apply_overrides(cfg, {k: yaml.safe_load(v) for k, v in (kv.split("=", 1) for kv in a.set)})
    Settings.model_validate(cfg)  # a misspelt key fails here, not an hour in
    cfg.setdefault("env", {})["bfcl_single_categories"] = cats
    per = int(a.per_category.split("=")[1])
    cfg.setdefault("guard", {}).update(suite={"bfcl_single": []}, per_category=per)  # the guard checks this split
    path = Path(tempfile.mkdtemp(prefix="kz-live-")) / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    a.config = str(path)
    a.users_fn = live_users(a.rate_share, a.requests_per_conversation, cats, a.user_max_tokens)
    run(a)


if __name__ == "__main__":
    main()
