"""Weight broadcaster: the promotion gate and the hot swap.

For each `evo.weights_published` it verifies the file's sha256, evaluates the candidate on the
fixed held-out tasks against the live version (greedy, scores cached per version), and either
promotes it (LIVE pointer written atomically, then `evo.weights_promoted`; every serving replica
and the explorer swap to it between requests and report `evo.weights_swapped`) or rejects it
(`evo.weights_rejected`). Older versions beyond `gate.keep_versions` are pruned, never the live
one or its predecessor.
"""
from __future__ import annotations

import asyncio
import json

from actors.bus import EventActor, Poison, heartbeat
from actors.events import WeightsPromoted, WeightsPublished, WeightsRejected
from envs.registry import make_envs
from policies.engine import make_engine
from policies.model_store import BASE_VERSION, WeightsStore, atomic_write_bytes, ensure_base_model, version_number
from policies.rollout import evaluate


class Broadcaster(EventActor):
    name = "broadcaster"
    kinds = ("weights_published",)
    batch = 1

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.store = WeightsStore(s.state)
        self.envs = make_envs(s.env)
        # a fixed held-out suite: the first gate.heldout_tasks entries of each environment's held-out split
        self.heldout = {name: env.entries("heldout")[: s.gate.heldout_tasks] for name, env in self.envs.items()}
        base = ensure_base_model(s.state, s.model.source, s.model.path, progress=False)
        self.engine = await asyncio.to_thread(make_engine, s, base)
        self.base_path = base
        self.cache_file = s.state / "broadcaster" / "evals.json"
        self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        self.scores: dict[str, float] = json.loads(self.cache_file.read_text()) if self.cache_file.exists() else {}
        self.weights_version = self.store.live()["version"]
        self.promoted = self.rejected = 0

    def _score(self, version: str, path: str | None) -> float:
        if version in self.scores:
            return self.scores[version]
        if path is None:  # the base model: reload its weights
            from transformers import AutoModelForCausalLM
            import torch
            sd = AutoModelForCausalLM.from_pretrained(str(self.base_path), dtype=torch.float32).state_dict()
            self.engine.load_state_dict(sd, version)
        else:
            self.engine.load_weights(path, version)
        per_env = [evaluate(self.engine, self.envs[name], entries, k=1,
                            max_new_tokens=self.settings.rollout.max_new_tokens,
                            call_prefix=self.settings.rollout.call_prefix)["avg"]
                   for name, entries in self.heldout.items()]
        score = sum(per_env) / len(per_env)
        self.scores[version] = score
        atomic_write_bytes(self.cache_file, json.dumps(self.scores).encode())
        return score

    async def handle_weights_published(self, ev: WeightsPublished, msg):
        w = ev.weights
        live = self.store.live()
        if version_number(w.version) <= version_number(live["version"]):
            self.log.info("candidate.stale", version=w.version, live=live["version"])
            return
        newest = self.store.latest_number()
        if newest > version_number(w.version) and self.store.manifest(f"w-{newest:06d}"):
            # a newer candidate is already waiting: evaluate that one instead (the learner is ahead of the gate)
            self.log.info("candidate.superseded", version=w.version, newest=newest)
            self.store.prune(self.settings.gate.keep_versions, protect={live["version"], BASE_VERSION})
            return
        if not await asyncio.to_thread(self.store.verify, w.path, w.sha256):
            raise Poison(f"{w.version}: file {w.path} is missing or its sha256 does not match")
        async with heartbeat([msg]):
            live_score = await asyncio.to_thread(self._score, live["version"], live["path"])
            cand_score = await asyncio.to_thread(self._score, w.version, w.path)
        tol = self.settings.gate.tolerance
        if cand_score + tol >= live_score:
            self.store.set_live(w.version, w.path, w.sha256)
            await self.bus.publish(WeightsPromoted(weights=w, candidate_score=cand_score, live_score=live_score,
                                                   previous=live["version"], trace_id=ev.trace_id),
                                   weights_version=w.version)
            self.weights_version = w.version
            self.promoted += 1
            self.store.prune(self.settings.gate.keep_versions, protect={w.version, live["version"], BASE_VERSION})
            self.log.info("weights.promoted", version=w.version, candidate=cand_score, live=live_score)
        else:
            await self.bus.publish(WeightsRejected(weights=w, candidate_score=cand_score, live_score=live_score,
                                                   reason=f"held-out {cand_score:.3f} < live {live_score:.3f} - {tol}",
                                                   trace_id=ev.trace_id), weights_version=live["version"])
            self.rejected += 1
            self.log.info("weights.rejected", version=w.version, candidate=cand_score, live=live_score)

    def health(self) -> dict:
        return {**super().health(), "promoted": getattr(self, "promoted", 0), "rejected": getattr(self, "rejected", 0),
                "scores": getattr(self, "scores", {})}

