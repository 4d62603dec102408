"""One inference-engine interface, chosen by injection.

`Engine` is what serving replicas, the explorer and the broadcaster's evaluator use:
`generate`, `load_weights`, `pause`, `resume`, `health` (plus the scoring helpers the judge and
the gate use). `TransformersEngine` runs on CPU or GPU; `VllmEngine` (`policies/vllm_engine.py`,
GPU, `gpu` extra) implements the same protocol and is imported only by `make_engine()` for the
roles configured in `model.vllm_roles`, so the CPU path never imports vllm (a test pins that).
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass
class Generation:
    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length"
    version: str = ""  # the weights version that produced it (read under the engine lock)


class Engine(Protocol):
    version: str

    def generate(self, prompts: list[str], max_new_tokens: int, temperature: float = 0.0, top_p: float = 1.0,
                 stream_cb=None) -> list[Generation]: ...

    def count_tokens(self, text: str) -> int: ...

    def choice_logprobs(self, prompts: list[str], choices: list[str]) -> list[list[float]]: ...

    def choose(self, prompt: str, options: list[str], temperature: float = 0.0) -> str: ...

    def sequence_logprobs(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]: ...

    def load_weights(self, path: str | Path, version: str) -> float: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def health(self) -> dict: ...


def trie_step(seqs: dict[str, list[int]], chosen: list[int]) -> tuple[list[str], list[int]]:
    """One step of constrained decoding over the options' tokenisations `seqs`, after the tokens
    `chosen`: the options already complete, and the tokens that may come next."""
    live = {o: s for o, s in seqs.items() if s[: len(chosen)] == chosen}
    done = [o for o, s in live.items() if len(s) == len(chosen)]
    return done, sorted({s[len(chosen)] for s in live.values() if len(s) > len(chosen)})


class TransformersEngine:
    """HF transformers generation, one call at a time (the engine lock).

    Weight updates are copied in place between calls; or, with `standby=True` (serving replicas), into a
    second copy of the model while calls run, after which the model pointer flips: calls already running
    finish on the weights they started with, new calls get the new ones, and nobody waits for the copy.
    A reference count keeps the next update from overwriting a copy that a call still uses."""

    def __init__(self, model_dir: str | Path, dtype: str = "bfloat16", device: str = "cpu", threads: int = 1,
                 version: str = "w-000000", standby: bool = False):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        self.tok = AutoTokenizer.from_pretrained(str(model_dir))
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype)).to(device)
        self.model.eval()
        self.version = version
        self._lock = threading.Lock()  # one model call at a time
        self._cv = threading.Condition()  # guards model/version/_users and the flip
        self._users: dict[int, int] = {}  # id(model) -> calls using it
        self.standby, self._standby, self._swapping = standby, None, threading.Lock()
        self._paused = threading.Event()
        self._paused.set()  # set = running
        self.generated_tokens = 0
        self.im_end = self.tok.convert_tokens_to_ids("<|im_end|>")

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    @contextlib.contextmanager
    def _using(self):
        """(model, version) for one call, held until it ends."""
        self._paused.wait()
        with self._lock:
            with self._cv:
                model, version = self.model, self.version
                self._users[id(model)] = self._users.get(id(model), 0) + 1
            try:
                yield model, version
            finally:
                with self._cv:
                    self._users[id(model)] -= 1
                    self._cv.notify_all()

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stream_cb=None):
        torch = self.torch
        with self._using() as (model, version), torch.inference_mode():
            enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            kwargs = dict(max_new_tokens=max_new_tokens, pad_token_id=self.tok.pad_token_id,
                          eos_token_id=[self.im_end, self.tok.eos_token_id])
            if temperature and temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            if stream_cb is not None:
                kwargs["streamer"] = _CallbackStreamer(self.tok, stream_cb)
            out = model.generate(**enc, **kwargs)
        n_prompt = enc["input_ids"].shape[1]
        gens = []
        for i in range(len(prompts)):
            ids = out[i, n_prompt:].tolist()
            finish = "length"
            if self.im_end in ids or self.tok.eos_token_id in ids:
                cut = min(ids.index(t) for t in (self.im_end, self.tok.eos_token_id) if t in ids)
                ids, finish = ids[:cut], "stop"
            ids = [t for t in ids if t != self.tok.pad_token_id]
            self.generated_tokens += len(ids)
            gens.append(Generation(self.tok.decode(ids, skip_special_tokens=True), int(enc["attention_mask"][i].sum()),
                                   len(ids), finish, version))
        return gens

    def choice_logprobs(self, prompts: list[str], choices: list[str]) -> list[list[float]]:
        """log P(first token of each choice | prompt), one forward pass per prompt (batched).

        Used by the policy-as-judge: a verdict is a choice between words, so it can never be
        malformed. The choices must start with different tokens."""
        torch = self.torch
        first = [self.tok(c, add_special_tokens=False)["input_ids"][0] for c in choices]
        if len(set(first)) != len(first):
            raise ValueError(f"choices {choices!r} share their first token")
        out: list[list[float]] = []
        with self._using() as (model, _), torch.inference_mode():
            for i in range(0, len(prompts), 4):  # small batches keep CPU memory flat on long prompts
                enc = self.tok(prompts[i:i + 4], return_tensors="pt", padding=True,
                               add_special_tokens=False).to(self.device)
                logits = model(**enc).logits[:, -1, :].float()
                lp = torch.log_softmax(logits, dim=-1)[:, first]
                out.extend(lp.tolist())
        return out

    def sequence_logprobs(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """(sum of log P(continuation tokens | prompt), number of continuation tokens) per (prompt,
        continuation) pair. The promotion gate scores held-out reference actions with it: a continuous
        measure that damage to the weights moves at once, where task success on a few tasks is coarse."""
        torch = self.torch
        out = []
        with self._using() as (model, _), torch.inference_mode():
            for prompt, cont in pairs:
                p = self.tok(prompt, add_special_tokens=False)["input_ids"]
                c = self.tok(cont, add_special_tokens=False)["input_ids"]
                ids = torch.tensor([p + c], device=self.device)
                logits = model(input_ids=ids).logits[0, len(p) - 1:-1].float()
                lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c, device=self.device).unsqueeze(-1))
                out.append((float(lp.sum()), len(c)))
        return out

    def choose(self, prompt: str, options: list[str], temperature: float = 0.0) -> str:
        """Constrained decoding: continue `prompt` with exactly one of `options` (token by token over a
        trie of the options' tokenisations, KV cache reused), greedy or sampled. Used to force a
        declared function name (tool_choice="required"), as JSON-schema-guided decoding does."""
        torch = self.torch
        seqs = {o: self.tok(o, add_special_tokens=False)["input_ids"] for o in dict.fromkeys(options)}
        if not seqs:
            raise ValueError("no options to choose from")
        with self._using() as (model, _), torch.inference_mode():
            ids = self.tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"].to(self.device)
            out = model(input_ids=ids, use_cache=True)
            past, chosen = out.past_key_values, []
            logits = out.logits[0, -1].float()
            while True:
                done, nxt = trie_step(seqs, chosen)
                if done and not nxt:
                    return done[0]
                allowed = torch.tensor(nxt, device=logits.device)
                sub = logits[allowed]
                if temperature and temperature > 0:
                    t = int(allowed[torch.multinomial(torch.softmax(sub / temperature, -1), 1)])
                else:
                    t = int(allowed[int(torch.argmax(sub))])
                chosen.append(t)
                out = model(input_ids=torch.tensor([[t]], device=self.device), past_key_values=past, use_cache=True)
                past, logits = out.past_key_values, out.logits[0, -1].float()

    def load_state_dict(self, sd: dict, version: str) -> None:
        with self._swapping:
            if not self.standby:
                with self._lock:
                    self._copy_into(self.model, sd)
                    with self._cv:
                        self.version = version
                return
            with self._cv:  # the standby copy may still serve a call that started before the last flip
                target = self._standby
                self._cv.wait_for(lambda: target is None or self._users.get(id(target), 0) == 0)
            if target is None:
                import copy

                target = copy.deepcopy(self.model)
            self._copy_into(target, sd)
            with self._cv:
                self._standby, self.model, self.version = self.model, target, version

    def _copy_into(self, model, sd: dict) -> None:
        with self.torch.no_grad():
            params = model.state_dict()  # tensors share storage with the live parameters
            missing = [k for k in params if k not in sd and not k.endswith("lm_head.weight")]
            if missing:
                raise ValueError(f"weights file lacks {len(missing)} tensors, e.g. {missing[:3]}")
            for k, v in sd.items():
                if k in params:
                    params[k].copy_(v.to(params[k].dtype))

    def load_weights(self, path, version) -> float:
        """Copy a safetensors file into the live model in place; returns milliseconds."""
        from safetensors.torch import load_file

        t0 = time.perf_counter()
        sd = load_file(str(path))
        self.load_state_dict(sd, version)
        return (time.perf_counter() - t0) * 1000

    def pause(self) -> None:
        self._paused.clear()

    def resume(self) -> None:
        self._paused.set()

    def health(self) -> dict:
        return {"engine": "transformers", "version": self.version, "device": self.device,
                "generated_tokens": self.generated_tokens, "paused": not self._paused.is_set()}


class _CallbackStreamer:
    """Minimal streamer: decodes incrementally and hands new text to a callback."""

    def __init__(self, tok, cb):
        self.tok, self.cb, self.ids, self.sent, self.first = tok, cb, [], "", True

    def put(self, value):
        if self.first:  # the prompt comes first
            self.first = False
            return
        self.ids.extend(value.reshape(-1).tolist())
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if len(text) > len(self.sent) and not text.endswith("\ufffd"):
            self.cb(text[len(self.sent):])
            self.sent = text

    def end(self):
        pass


ROLES = ("serve", "canary", "explorer", "gate", "judge", "questioner", "eval")


def make_engine(settings, model_dir: str | Path, version: str = "w-000000", role: str = "serve") -> Engine:
    """The engine for one role: vLLM when `model.engine` is vllm and the role is in `model.vllm_roles`
    (vLLM engines reserve GPU memory each, so only the high-throughput roles get one), else transformers."""
    if role not in ROLES:
        raise ValueError(f"unknown engine role {role!r}; known: {ROLES}")
    m = settings.model
    if m.engine == "vllm" and role in m.vllm_roles:
        from policies.vllm_engine import VllmEngine

        return VllmEngine(model_dir, dtype=m.serve_dtype, gpu_memory_utilization=m.gpu_memory_utilization,
                          max_model_len=m.max_model_len, enforce_eager=m.enforce_eager, version=version)
    return TransformersEngine(model_dir, dtype=m.serve_dtype, device=m.device, threads=m.torch_threads, version=version,
                              standby=role in ("serve", "canary"))
