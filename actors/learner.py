"""Learner: GRPO steps on judged groups -> a new weights version.

Judgement messages are held (not acked) until the step that uses them is checkpointed, so a
crash loses nothing and a redelivered judgement is never applied twice (applied ids are saved
with the checkpoint). Rollout groups whose outcomes are all equal carry no GRPO signal and are
acknowledged without training; rated live interactions are pooled into groups of
`learner.min_live_group`. The maths (advantages, clipped loss) is verl's, in `policies/grpo.py`.
After a rejection the learner restarts from the live version.
"""
from __future__ import annotations

import asyncio
import os
import time
import uuid

from actors.bus import HOLD, EventActor, heartbeat
from actors.events import (Judgement, LearnerStep, WeightsPromoted, WeightsPublished, WeightsRef, WeightsRejected,
                           WeightsRolledBack)
from config import telemetry
from opentelemetry import trace
from policies import adca, grpo
from policies.model_store import WeightsStore, ensure_base_model, version_name


def _step_event_id(kind: str, step: int) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"kaizen:{kind}:{step}"))


class Trainer:
    """Model + optimizer + checkpoint; plain torch, no Ray or NATS (testable alone)."""

    def __init__(self, settings, base_dir):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(max(1, settings.model.torch_threads))
        self.torch, self.s = torch, settings
        self.tok = AutoTokenizer.from_pretrained(str(base_dir))
        if self.tok.pad_token_id is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
        self.model.train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=settings.learner.lr, weight_decay=0.0)
        self.ckpt = settings.state / "learner" / "checkpoint.pt"
        self.step, self.version, self.applied = 0, "w-000000", set()
        self.boosted = 0  # guided samples trained with the boosted upper clip

    def load_checkpoint(self) -> bool:
        if not self.ckpt.exists():
            return False
        c = self.torch.load(self.ckpt, map_location="cpu", weights_only=False)
        self.model.load_state_dict(c["model"])
        self.opt.load_state_dict(c["optimizer"])
        self.step, self.version, self.applied = c["step"], c["version"], set(c["applied"])
        return True

    def save_checkpoint(self) -> None:
        self.ckpt.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.ckpt.with_name(".checkpoint.pt.tmp")
        self.torch.save({"model": self.model.state_dict(), "optimizer": self.opt.state_dict(), "step": self.step,
                         "version": self.version, "applied": sorted(self.applied)}, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, self.ckpt)

    def reset_to(self, weights_path: str | None, version: str, base_dir) -> None:
        from safetensors.torch import load_file

        if weights_path:
            sd = load_file(weights_path)
        else:
            from transformers import AutoModelForCausalLM
            sd = AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=self.torch.float32).state_dict()
        self.model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
        self.opt = self.torch.optim.AdamW(self.model.parameters(), lr=self.s.learner.lr, weight_decay=0.0)
        self.version = version

    def train_step(self, groups: list[Judgement]) -> dict:
        """One GRPO update over whole groups, micro-batched one sample at a time."""
        torch, L = self.torch, self.s.learner
        samples, scores, index, step_adv, scale, clip_high, guided = [], [], [], [], [], [], []
        for g in groups:
            p = adca.self_consistency(g.outcomes)
            use_adpo = L.adpo and g.source == "rollout"
            scale += [adca.adpo_scale(p) if use_adpo else 1.0] * len(g.samples)
            clip_high += [max(L.clip_ratio_high, adca.adpo_clip_high(p)) if use_adpo else L.clip_ratio_high] * len(g.samples)
            if L.adca_alpha > 0:  # step-level credit: each step's advantage goes to all its tokens
                step_adv.extend(adca.step_advantages(g.step_labels, g.outcomes, L.adca_alpha))
            for s, o in zip(g.samples, g.outcomes):
                samples.append(grpo.tokenize_sample(self.tok, s, L.max_seq_tokens, L.experience_mode == "keep"))
                guided.append(s.guided)
                scores.append(o)
                index.append(g.group_id)
        mask = grpo.pad([t.response_mask for t in samples], 0)
        if L.adca_alpha > 0:
            adv = adca.token_advantages([t.step_ids for t in samples], step_adv, mask.shape[1]) * mask
        else:
            adv = grpo.advantages(scores, index, mask)
        adv = adv * torch.tensor(scale).unsqueeze(1)  # ADPO: ambiguous tasks count less
        ids = grpo.pad([t.input_ids for t in samples], self.tok.pad_token_id)
        attn = grpo.pad([[1] * len(t.input_ids) for t in samples], 0)
        total_tokens = int(mask.sum())
        t0 = time.monotonic()
        with torch.no_grad():
            old = torch.cat([grpo.token_logprobs(self.model, ids[i:i + 1], attn[i:i + 1]) for i in range(len(samples))])
        self.opt.zero_grad(set_to_none=True)
        loss_sum, metrics, boosted0 = 0.0, {}, self.boosted
        for i in range(len(samples)):
            n_i = int(mask[i].sum())
            if n_i == 0 or float(adv[i].abs().sum()) == 0.0:
                continue
            lp = grpo.token_logprobs(self.model, ids[i:i + 1], attn[i:i + 1])
            loss, metrics = grpo.policy_loss(old[i:i + 1], lp, adv[i:i + 1], mask[i:i + 1], L.clip_ratio_low,
                                             self._clip_high(clip_high[i], guided[i], adv[i], mask[i]), L.loss_agg_mode)
            (loss * n_i / total_tokens).backward()  # token-mean over the whole batch
            loss_sum += float(loss.detach()) * n_i / total_tokens
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), L.grad_clip))
        self.opt.step()
        self.step += 1
        return {"loss": loss_sum, "grad_norm": grad_norm, "samples": len(samples), "tokens": total_tokens,
                "mean_reward": sum(scores) / len(scores), "seconds": time.monotonic() - t0,
                "guided_samples": sum(guided), "boosted_samples": self.boosted - boosted0, **metrics}

    def _clip_high(self, base: float, guided: bool, adv, mask) -> float:
        n = float(mask.sum())
        mean_adv = float((adv * mask).sum()) / n if n else 0.0
        c = grpo.sample_clip_high(base, guided, mean_adv, self.s.learner.boost_clip_high)
        self.boosted += c > base
        return c

    def export(self, dtype: str) -> dict:
        dt = getattr(self.torch, dtype)
        return {k: v.detach().to(dt) for k, v in self.model.state_dict().items() if k != "lm_head.weight"}


class Learner(EventActor):
    name = "learner"
    kinds = ("judgement", "weights_promoted", "weights_rejected", "weights_rolled_back")
    batch = 16

    async def start(self) -> None:
        await super().start()
        s = self.settings
        self.base = ensure_base_model(s.state, s.model.source, s.model.path, progress=False)
        self.store = WeightsStore(s.state)
        self.trainer = await asyncio.to_thread(Trainer, s, self.base)
        if not await asyncio.to_thread(self.trainer.load_checkpoint):
            live = self.store.live()
            if live["path"]:
                await asyncio.to_thread(self.trainer.reset_to, live["path"], live["version"], self.base)
        self.weights_version = self.store.live()["version"]
        self.ready: list[Judgement] = []  # informative groups waiting for a step
        self.live: list[Judgement] = []  # rated interactions, pooled until a live group forms
        self.held: dict[str, object] = {}  # event_id -> unacked message
        self._last_beat = time.monotonic()
        self.steps_done = 0
        await self._republish_last()

    async def _republish_last(self) -> None:
        """After a crash between checkpoint and publish, the last version goes out again (same event id)."""
        if self.trainer.step and self.store.manifest(self.trainer.version):
            await self._publish_weights(self.trainer.version, self.trainer.step)

    async def handle_judgement(self, j: Judgement, msg):
        if j.event_id in self.trainer.applied:
            return None  # already in a checkpointed step: ack
        if j.event_id in self.held:  # redelivered while held: keep the newest delivery
            self.held[j.event_id] = msg
            return HOLD
        if j.source == "live":
            self.held[j.event_id] = msg
            self.live.append(j)
            if len(self.live) >= self.settings.learner.min_live_group:
                pooled, self.live = self.live, []
                group = Judgement(group_id=f"live-{j.event_id[:8]}", source="live", task_id="live",
                                  samples=[s for x in pooled for s in x.samples],
                                  outcomes=[o for x in pooled for o in x.outcomes],
                                  step_labels=[lab for x in pooled for lab in x.step_labels],
                                  source_event_ids=[x.event_id for x in pooled], origin="live")
                if len(set(group.outcomes)) > 1:
                    self.ready.append(group)
                else:
                    await self._ack([x.event_id for x in pooled])
            return HOLD
        if len(set(j.outcomes)) <= 1:
            self.log.info("group.skipped_no_signal", group_id=j.group_id, outcome=j.outcomes[:1])
            return None
        self.held[j.event_id] = msg
        self.ready.append(j.model_copy(update={"source_event_ids": [j.event_id]}))
        return HOLD

    async def _ack(self, event_ids) -> None:
        for i in event_ids:
            m = self.held.pop(i, None)
            if m is not None:
                await m.ack_sync()
            self.applied.add(i)

    async def tick(self) -> None:
        now = time.monotonic()
        if self.held and now - self._last_beat > 15:
            self._last_beat = now
            for m in list(self.held.values()):
                try:
                    await m.in_progress()
                except Exception:
                    pass
        n = self.settings.learner.groups_per_step
        if len(self.ready) < n:
            return
        groups = self.ready[:n]  # popped only after the step is checkpointed
        ids = sorted({i for g in groups for i in g.source_event_ids})
        async with heartbeat([self.held[i] for i in ids if i in self.held]):
            # the step links to the trace of every event it learned from: HTTP request -> weights version
            links = [trace.Link(trace.get_current_span(telemetry.context_from_headers(self.held[i].headers)).get_span_context())
                     for i in ids if i in self.held and self.held[i].headers]
            with self.tracer.start_as_current_span("learner.step", links=links):
                stats = await asyncio.to_thread(self.trainer.train_step, groups)
                version = version_name(max(self.store.latest_number() + 1, self.trainer.step))
                path, digest = await asyncio.to_thread(
                    self.store.save, self.trainer.export(self.settings.model.serve_dtype), version,
                    {"parent": self.weights_version, "step": self.trainer.step})
                self.trainer.version = version
                self.trainer.applied |= set(ids)
                await asyncio.to_thread(self.trainer.save_checkpoint)
                await self.bus.publish(LearnerStep(
                    event_id=_step_event_id("learner_step", self.trainer.step), step=self.trainer.step,
                    groups=len(groups), samples=stats["samples"], loss=stats["loss"], mean_reward=stats["mean_reward"],
                    grad_norm=stats["grad_norm"], duration_s=stats["seconds"], source_event_ids=ids,
                    metrics={**{k: float(v) for k, v in stats.items() if isinstance(v, (int, float))},
                             **{f"groups_{o}": float(sum(g.origin == o for g in groups))
                                for o in ("env", "synthetic", "live")}}),
                    weights_version=version)
                await self._publish_weights(version, self.trainer.step)
        self.ready = self.ready[n:]
        await self._ack(ids)
        self.steps_done += 1
        self.log.info("learner.step", version=version, **{k: round(v, 4) for k, v in stats.items()})

    async def _publish_weights(self, version: str, step: int) -> None:
        man = self.store.manifest(version)
        ref = WeightsRef(version=version, path=man["path"], sha256=man["sha256"], parent=man.get("parent", ""), step=step)
        await self.bus.publish(WeightsPublished(event_id=_step_event_id("weights_published", step), weights=ref),
                               weights_version=version)

    async def handle_weights_promoted(self, ev: WeightsPromoted, msg):
        self.weights_version = ev.weights.version

    async def handle_weights_rolled_back(self, ev: WeightsRolledBack, msg):
        self.weights_version = ev.to.version
        await asyncio.to_thread(self.trainer.reset_to, ev.to.path, ev.to.version, self.base)

    async def handle_weights_rejected(self, ev: WeightsRejected, msg):
        live = self.store.live()
        if self.trainer.version == ev.weights.version:  # continue from what users are served
            await asyncio.to_thread(self.trainer.reset_to, live["path"], live["version"], self.base)
            self.log.info("learner.reset_to_live", rejected=ev.weights.version, live=live["version"])

    def health(self) -> dict:
        t = getattr(self, "trainer", None)
        return {**super().health(), "step": t.step if t else 0, "held_groups": len(getattr(self, "ready", [])),
                "held_live": len(getattr(self, "live", [])),
                "held_messages": len(getattr(self, "held", {}))}
