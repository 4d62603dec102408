"""One synthetic task at a time, from a train entry to a verified record (`policies/tasks/synthesis.py`'s steps).

The questioner (`actors/questioner.py`) runs `TaskWriter.write` in a worker thread and publishes what it returns:
the base entry is like a recent live request half the time (top 5 by cosine over the env's train queries), the
exploration is logged to `explorations.jsonl`, the reference keeps the calls that worked up to the ladder's rung,
and the task is dropped when it is the same task again, rejected when Milvus finds a near duplicate or its replay
fails.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from policies.tasks import synthesis as syn
from policies.tasks.book import SyntheticTask, record_exploration


def draft(
    gen, exp: syn.Exploration, declared, live: list[str], env_name: str, trace: list[str], fallback=syn.describe, **extra
) -> SyntheticTask:
    """The record of a task written for an exploration's working calls (`exp.base_entry_id` is its start): the
    request the generator writes for them (or `fallback`'s, by default their plain description), its signature and
    entry id."""
    query, synthesizer = syn.write_query(gen, exp, declared, live, fallback)
    sig = syn.signature(env_name, exp.base_entry_id, exp.reference)
    entry = syn.task_entry_id(sig)
    return SyntheticTask(
        task_id=f"syn:{entry}",
        env=env_name,
        entry=entry,
        base=exp.base_entry_id,
        query=syn.normalise(query),
        reference=exp.reference,
        synthesizer=synthesizer,
        sig=sig,
        exploration=trace,
        **extra,
    )


class TaskWriter:
    def __init__(self, envs: dict, env_names: list[str], embedder, index, gen, visits: Counter, rng: random.Random, q):
        """`q` = the questioner settings; `visits` are the function visits across explorations (the caller keeps them)."""
        self.envs, self.env_names, self.embedder, self.index, self.gen = envs, env_names, embedder, index, gen
        self.visits, self.rng, self.q = visits, rng, q
        self._entry_vecs: dict[str, tuple[list[str], object]] = {}

    def _entry_vectors(self, env_name: str):
        if env_name not in self._entry_vecs:
            import torch

            env = self.envs[env_name]
            ids = env.entries("train")
            vecs = []
            for i in range(0, len(ids), 64):
                vecs.extend(self.embedder.embed([env.query_of(e)[:300] for e in ids[i : i + 64]]))
            self._entry_vecs[env_name] = (ids, torch.tensor(vecs))
        return self._entry_vecs[env_name]

    def pick_base(self, env_name: str, live: list[str]) -> str:
        """Half the time an entry like a recent live request (top 5 by cosine), else any train entry."""
        env = self.envs[env_name]
        if live and self.rng.random() < 0.5:
            import torch

            ids, mat = self._entry_vectors(env_name)
            q = torch.tensor(self.embedder.embed([live[-1]])[0])
            top = torch.topk(mat @ q, k=min(5, len(ids))).indices.tolist()
            return ids[self.rng.choice(top)]
        return self.rng.choice(env.entries("train"))

    def write(self, live: list[str], calls: Callable[[], int], sigs: set[str], log: Path, weights_version: str) -> dict:
        """Explore, write, dedup and verify one task. `live`: recent live requests; `calls()`: how many calls the
        reference may have (the ladder's rung, read once the exploration is done); `sigs`: the tasks proposed
        before. Returns the outcome: "empty", or the record "rejected" or "verified" with the reason."""
        env_name = self.rng.choice(self.env_names)
        env = self.envs[env_name]
        base = self.pick_base(env_name, live)
        exp = syn.explore(self.gen, env, base, self.q.explore_steps, self.visits, self.rng)
        trace = [f"{s.call} -> {'ok' if s.ok else 'error'}: {s.result[:160]}" for s in exp.steps]
        record_exploration(log, {"env": env_name, "base": base, "steps": trace, "weights_version": weights_version})
        exp.steps = [s for s in exp.steps if s.ok][: calls()]
        if not exp.reference:
            return {"outcome": "empty", "base": base, "tried": len(exp.steps)}
        rec = draft(self.gen, exp, env.probe(base).tools, live, env_name, trace)
        if rec.sig in sigs:  # the very same task again: nothing new to propose
            return {"outcome": "empty", "base": base}
        vec, dup = syn.near_duplicate(self.embedder, self.index, rec.query, self.q.dedup_threshold)
        if dup:
            return {"task": rec, "outcome": "rejected", "reason": dup}
        ok, why = syn.verify(env, rec.entry, {"base_entry_id": base, "query": rec.query, "reference": exp.reference})
        if not ok:
            return {"task": rec, "outcome": "rejected", "reason": why}
        self.index.add(rec.task_id, vec, rec.query)
        return {"task": rec, "outcome": "verified", "reason": why}
