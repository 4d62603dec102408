"""Run a group of episodes in lockstep with one engine (batched generation per step).

Used by the explorer (training groups, half guided by experiences), the broadcaster's
promotion gate and `main.py eval` (greedy, held-out). The training view of each sample keeps
the unguided system prompt: experience text is stripped before anything is trained on.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

from actors.events import ChatMessage, Sample
from envs.base import Environment
from policies.chat import CALL_PREFIX, call_opening, parse_assistant, render, served_answer


def forced_prefix(tools, engine=None, prompt: str = "", temperature: float = 0.0) -> str:
    """The start of a forced tool call (tool_choice="required"); with a single tool its name and first
    required argument are forced too. Given an engine, the name is chosen among the declared ones by
    constrained decoding (sampled at `temperature`), as Serve does for tool_choice="required": the
    explorer uses this so the samples of a group try different functions, and held-out scoring (`evaluate`)
    so that it measures what a client asking for a call gets from Serve: the policy's own choice of name, among
    the declared ones."""
    if len(tools) == 1:
        return call_opening(tools[0])
    if engine is not None and tools:
        names = {t.function.name + '"': t for t in tools}
        return call_opening(names[engine.choose(prompt + CALL_PREFIX, list(names), temperature)])
    return CALL_PREFIX


@dataclass
class GroupResult:
    samples: list[Sample]
    duration_s: float
    tokens: int


def run_group(
    engine,
    env: Environment,
    entry_id: str,
    n: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    experiences: list[str] | None = None,
    guided: int = 0,
    experience_ids: list[str] | None = None,
    on_step=None,
    call_prefix: bool = False,
    spec: dict | None = None,
    choose_names: bool = False,
) -> GroupResult:
    """Roll out `n` episodes of one entry; the first `guided` get `experiences` in their context.

    With `call_prefix`, the first action of each turn starts from `<tool_call>[{"name": "` (a forced
    tool call, like tool_choice="required"), so that a small policy explores the tools at all.
    With `choose_names` that forced call also gets one of the declared function names, sampled by
    constrained decoding. `spec` describes a synthetic task (see the environment's `episode()`)."""
    t0 = time.monotonic()
    eps = []
    try:
        for _ in range(n):
            eps.append(env.episode(entry_id, spec))
        return _run(
            engine,
            eps,
            n,
            t0,
            max_new_tokens,
            temperature,
            top_p,
            experiences,
            guided,
            experience_ids,
            on_step,
            call_prefix,
            choose_names,
        )
    finally:
        for ep in eps:  # pooled episodes hold a slot and remote state until released
            release = getattr(ep, "release", None)
            if release:
                release()


def _run(
    engine,
    eps,
    n,
    t0,
    max_new_tokens,
    temperature,
    top_p,
    experiences,
    guided,
    experience_ids,
    on_step,
    call_prefix,
    choose_names=False,
    as_served=False,
) -> GroupResult:
    msgs = [[ChatMessage(role="system", content=ep.system_prompt)] for ep in eps]
    steps: list[list[int]] = [[] for _ in eps]
    signals: list[list[float]] = [[] for _ in eps]
    errors: list[str | None] = [None] * n
    tokens = 0
    active = list(range(n))  # episodes of different entries may have different numbers of turns
    while True:
        users = {i: eps[i].next_user_message() for i in active}
        active = [i for i in active if users[i] is not None]
        if not active:
            break
        for i in active:
            msgs[i].append(ChatMessage(role="user", content=users[i]))
        open_ = set(active)
        first = True
        while open_:
            idx = sorted(open_)
            contexts = {i: render(msgs[i], eps[i].tools, experiences if i < guided else None) for i in idx}
            prefixes = {
                i: forced_prefix(eps[i].tools, engine if choose_names else None, contexts[i], temperature)
                if (call_prefix and first)
                else ""
                for i in idx
            }
            prompts = [contexts[i] + prefixes[i] for i in idx]
            gens = engine.generate(prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)
            first = False
            for i, g in zip(idx, gens):
                tokens += g.completion_tokens
                if as_served and prefixes[i]:  # as Serve sends it; the explorer trains on the text as written
                    action = served_answer(prefixes[i], g.text, eps[i].tools, g.finish_reason == "length")
                else:
                    action = parse_assistant(prefixes[i] + g.text)
                steps[i].append(len(msgs[i]))
                msgs[i].append(action)
                r = eps[i].step(action)
                signals[i].append(r.signal)
                msgs[i].extend(r.observations)
                if r.errors:
                    errors[i] = r.errors[-1][:300]
                if r.turn_done:
                    open_.discard(i)
            if on_step:
                on_step()
    outcomes = [ep.outcome() for ep in eps]
    final_tools = [ep.tools for ep in eps]
    samples = [
        Sample(
            sample_id=str(uuid.uuid4()),
            messages=msgs[i],
            tools=final_tools[i],
            step_indices=steps[i],
            step_signals=signals[i],
            outcome=outcomes[i],
            guided=i < guided,
            experience_ids=list(experience_ids or []) if i < guided else [],
            experiences=list(experiences or []) if i < guided else [],
            error=errors[i],
        )
        for i in range(n)
    ]
    return GroupResult(samples, time.monotonic() - t0, tokens)


def reference_sample(env: Environment, entry_id: str, spec: dict | None = None) -> Sample | None:
    """The environment's reference solution replayed in a fresh episode, as an off-policy sample
    (`off_policy=True`) in the same training view as the policy's own samples; None when the
    environment has no reference for the entry or the replay does not fully succeed (only verified
    trajectories are ever trained on)."""
    solve = getattr(env, "reference_solution", None)
    turns = solve(entry_id, spec) if solve else None
    if not turns:
        return None
    ep = env.episode(entry_id, spec)
    try:
        msgs = [ChatMessage(role="system", content=ep.system_prompt)]
        steps, signals = [], []
        for actions in turns:
            user = ep.next_user_message()
            if user is None:
                break
            msgs.append(ChatMessage(role="user", content=user))
            for action in actions:
                steps.append(len(msgs))
                msgs.append(action)
                r = ep.step(action)
                signals.append(r.signal)
                msgs.extend(r.observations)
                if r.turn_done:
                    break
        while ep.next_user_message() is not None:  # close the last turn so it is scored
            pass
        outcome = ep.outcome()
        if outcome < 1.0:
            return None
        return Sample(
            sample_id=str(uuid.uuid4()),
            messages=msgs,
            tools=ep.tools,
            step_indices=steps,
            step_signals=signals,
            outcome=outcome,
            off_policy=True,
        )
    finally:
        release = getattr(ep, "release", None)
        if release:
            release()


def run_episodes(
    engine,
    env: Environment,
    entry_ids: list[str],
    n: int,
    *,
    max_new_tokens: int,
    temperature: float,
    top_p: float = 1.0,
    call_prefix: bool = False,
) -> list[list[Sample]]:
    """`n` episodes of each of several entries in one lockstep batch (unguided): per entry, its samples. One
    batched generation serves every entry's episodes at once, which is what makes held-out scoring cheap. A forced
    call (`call_prefix`) names one of the declared functions, chosen by the engine at `temperature` as Serve
    chooses it for tool_choice="required" (`forced_prefix`): left to write the name freely, SmolLM2-135M named
    an undeclared function in every sample of BFCL `multiple`, a score no client of the endpoint ever sees. The
    forced answer is then read as Serve sends it (`served_answer`)."""
    t0 = time.monotonic()
    eps = []
    try:
        for eid in entry_ids:
            eps.extend(env.episode(eid) for _ in range(n))
        args = (engine, eps, len(eps), t0, max_new_tokens, temperature, top_p, None, 0, None, None, call_prefix)
        res = _run(*args, choose_names=call_prefix, as_served=True)
    finally:
        for ep in eps:
            release = getattr(ep, "release", None)
            if release:
                release()
    return [res.samples[j * n : (j + 1) * n] for j in range(len(entry_ids))]


def evaluate(
    engine,
    env: Environment,
    entry_ids: list[str],
    k: int = 1,
    max_new_tokens: int = 96,
    temperature: float = 0.0,
    progress=None,
    call_prefix: bool = False,
    batch: int = 1,
) -> dict:
    """avg@k and best@k over entries (k samples each; greedy when temperature == 0). `batch` episodes run
    together (whole entries: at least one entry's k); 1 runs one entry's k episodes at a time."""
    per_entry = {}
    chunk = max(1, batch // max(1, k))
    for j in range(0, len(entry_ids), chunk):
        ids = entry_ids[j : j + chunk]
        for eid, samples in zip(
            ids,
            run_episodes(
                engine, env, ids, k, max_new_tokens=max_new_tokens, temperature=temperature, top_p=0.95, call_prefix=call_prefix
            ),
        ):
            per_entry[eid] = [s.outcome for s in samples]
            if progress:
                progress(len(per_entry), len(entry_ids), eid, per_entry[eid])
    avg = sum(sum(s) / len(s) for s in per_entry.values()) / max(1, len(per_entry))
    best = sum(max(s) for s in per_entry.values()) / max(1, len(per_entry))
    return {"avg": avg, "best": best, "k": k, "entries": per_entry}
