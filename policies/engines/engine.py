"""One inference-engine interface, chosen by injection.

`Engine` (`policies/engines/generation.py`) is what serving replicas, the explorer and the broadcaster's evaluator use:
`generate`, `load_weights`, `pause`, `resume`, `health` (plus the scoring helpers the judge and
the gate use). `TransformersEngine` runs on CPU or GPU; `VllmEngine` (`policies/engines/vllm_engine.py`,
GPU, `gpu` extra) implements the same protocol and is imported only by `make_engine()` (`policies/engines/roles.py`) for the
roles configured in `model.vllm_roles`, so the CPU path never imports vllm (a test pins that).
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from policies.engines.batching import Batcher, Request, RowBudget, RowStops, RowStreamer
from policies.engines.generation import Generation, KeptPrefill, LockedTokenizer, shared_prefix_logprobs, walk_choice
from policies.grammar import Grammars, has_call_tokens


class TransformersEngine:
    """HF transformers generation, one call at a time (the engine lock).

    Weight updates are copied in place between calls; or, with `standby=True` (serving replicas), into a
    second copy of the model while calls run, after which the model pointer flips: calls already running
    finish on the weights they started with, new calls get the new ones, and nobody waits for the copy.
    A reference count keeps the next update from overwriting a copy that a call still uses."""

    def __init__(
        self,
        model_dir: str | Path,
        dtype: str = "bfloat16",
        device: str = "cpu",
        threads: int = 1,
        version: str = "w-000000",
        standby: bool = False,
        max_batch: int = 1,
        batch_window_ms: float = 0.0,
        share_prefill: bool = False,
        attention: str | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads:
            torch.set_num_threads(threads)
        self.torch = torch
        self.device = device
        self.tok = LockedTokenizer(AutoTokenizer.from_pretrained(str(model_dir)))
        self.tok.padding_side = "left"
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token
        extra = {"attn_implementation": attention} if attention else {}  # None: transformers' default (sdpa)
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype), **extra).to(device)
        self.model.eval()
        self.version = version
        self._lock = threading.Lock()  # one model call at a time
        self._cv = threading.Condition()  # guards model/version/_users and the flip
        self._users: dict[int, int] = {}  # id(model) -> calls using it
        self.standby, self._standby, self._swapping = standby, None, threading.Lock()
        self.shared = None  # SharedWeights once `share()` exported this engine's parameters
        self.last_load = ""  # how the last update arrived: "shared", "file", or "file (why shared failed)"
        self._paused = threading.Event()
        self._paused.set()  # set = running
        self.generated_tokens = 0
        self.share_prefill = share_prefill  # batches via policies/engines/shared_decode.py (the scorers' and the explorer's)
        self.kept = KeptPrefill()  # `choose`'s last prompt, for the next choice on it and the generation after it
        self.im_end = self.tok.convert_tokens_to_ids("<|im_end|>")
        self.grammars, self.call_tokens = Grammars(self.tok, self.im_end), has_call_tokens(self.tok)  # structured output
        # concurrent single-prompt calls (serving threads) are answered in batches of up to max_batch
        self.batcher = Batcher(self._run_batch, max_batch, batch_window_ms / 1000) if max_batch > 1 else None

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

    def generate(self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stream_cb=None, stops=(), grammar=None):
        if not prompts:  # the tokenizer fails on an empty batch
            return []
        ms = [self.grammars.matcher(grammar) if grammar else None for _ in prompts]  # here: a bad one fails this call only
        if self.batcher is not None and len(prompts) == 1:
            return [self.batcher.submit(prompts[0], max_new_tokens, temperature, top_p, stream_cb, stops, ms[0])]
        cbs = [stream_cb] * len(prompts) if stream_cb is not None else None
        n = len(prompts)
        return self._generate(prompts, [max_new_tokens] * n, temperature, top_p, cbs, [tuple(stops)] * n, ms)

    def _run_batch(self, reqs: list[Request]) -> list[Generation]:
        r = reqs[0]  # the batcher groups requests with the same sampling parameters
        cbs = [x.stream_cb for x in reqs]
        return self._generate(
            [x.prompt for x in reqs],
            [x.max_new_tokens for x in reqs],
            r.temperature,
            r.top_p,
            cbs if any(cbs) else None,
            [x.stops for x in reqs],
            [x.matcher for x in reqs],
        )

    def _generate(self, prompts, max_new, temperature, top_p, stream_cbs, row_stops=None, matchers=None) -> list[Generation]:
        """One padded batch; each row stops at its own token budget, at an end token or at one of its stop strings, and
        follows its own grammar's matcher (a request's `response_format`) where it has one."""
        torch = self.torch
        stops = (self.im_end, self.tok.eos_token_id)
        with self._using() as (model, version), torch.inference_mode():
            plain = not any(row_stops or ()) and not any(m is not None for m in matchers or ())
            if self.share_prefill and stream_cbs is None and plain:  # held-out scoring: shared prefixes
                from policies.engines.shared_decode import decode

                rows = self.tok(prompts, add_special_tokens=False)["input_ids"]
                news = decode(model, torch, rows, max_new, temperature, top_p, stops, self.tok.pad_token_id, self.device)
                return [self._finish(ids, len(r), stops, version) for ids, r in zip(news, rows)]
            enc = self.tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
            n_prompt = enc["input_ids"].shape[1]
            kwargs = dict(max_new_tokens=max(max_new), pad_token_id=self.tok.pad_token_id, eos_token_id=list(stops))
            if temperature and temperature > 0:
                kwargs.update(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
            else:
                kwargs.update(do_sample=False, temperature=None, top_p=None, top_k=None)
            criteria = [RowBudget(torch, n_prompt, max_new, self.device)] if len(set(max_new)) > 1 else []
            criteria += [RowStops(torch, self.tok, n_prompt, row_stops)] if any(row_stops or ()) else []
            if criteria:
                from transformers import StoppingCriteriaList

                kwargs["stopping_criteria"] = StoppingCriteriaList(criteria)
            if stream_cbs is not None:
                kwargs["streamer"] = RowStreamer(self.tok, stream_cbs, max_new, stops)
            if any(m is not None for m in matchers or ()):
                from transformers import LogitsProcessorList

                kwargs["logits_processor"] = LogitsProcessorList([self.grammars.rows(torch, matchers, n_prompt)])
            if len(prompts) == 1 and (kept := self.kept.take(model, version, enc["input_ids"][0].tolist())) is not None:
                kwargs["past_key_values"] = kept  # a forced call's prompt: its name was just chosen from most of it
            out = model.generate(**enc, **kwargs)
        return [
            self._finish(out[i, n_prompt : n_prompt + max_new[i]].tolist(), int(enc["attention_mask"][i].sum()), stops, version)
            for i in range(len(prompts))
        ]

    def _finish(self, ids: list[int], prompt_tokens: int, stops: tuple, version: str) -> Generation:
        finish = "length"
        if any(t in ids for t in stops):
            ids, finish = ids[: min(ids.index(t) for t in stops if t in ids)], "stop"
        ids = [t for t in ids if t != self.tok.pad_token_id]
        self.generated_tokens += len(ids)
        return Generation(self.tok.decode(ids, skip_special_tokens=True), prompt_tokens, len(ids), finish, version)

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
                enc = self.tok(prompts[i : i + 4], return_tensors="pt", padding=True, add_special_tokens=False).to(self.device)
                logits = model(**enc).logits[:, -1, :].float()
                lp = torch.log_softmax(logits, dim=-1)[:, first]
                out.extend(lp.tolist())
        return out

    def sequence_logprobs(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        """(sum of log P(continuation tokens | prompt), number of continuation tokens) per (prompt,
        continuation) pair. The promotion gate scores held-out reference actions with it: a continuous
        measure that damage to the weights moves at once, where task success on a few tasks is coarse."""
        ids = [
            (self.tok(p, add_special_tokens=False)["input_ids"], self.tok(c, add_special_tokens=False)["input_ids"])
            for p, c in pairs
        ]
        with self._using() as (model, _), self.torch.inference_mode():
            return shared_prefix_logprobs(model, self.torch, ids, self.device)

    def choose(self, prompt: str, options: list[str], temperature: float = 0.0) -> str:
        """Constrained decoding: continue `prompt` with exactly one of `options` (token by token over a
        trie of the options' tokenisations, KV cache reused), greedy or sampled. Used to force a
        declared function name (tool_choice="required"), as JSON-schema-guided decoding does. The prompt's
        prefill is kept (`KeptPrefill`) for the next choice on it, and for the generation that follows."""
        torch = self.torch
        seqs = {o: self.tok(o, add_special_tokens=False)["input_ids"] for o in dict.fromkeys(options)}
        if not seqs:
            raise ValueError("no options to choose from")
        with self._using() as (model, version), torch.inference_mode():
            ids = self.tok(prompt, add_special_tokens=False)["input_ids"]
            past, logits = self.kept.get(model, version, ids, lambda: model(input_ids=torch.tensor([ids], device=self.device)))
            try:
                return walk_choice(torch, model, past, logits, seqs, temperature, self.device)
            finally:
                past.crop(len(ids))  # the prompt's cache again, without this choice's tokens

    def load_state_dict(self, sd: dict, version: str) -> None:
        self._load(lambda model: self._copy_into(model, sd), version)

    def _load(self, fill, version: str) -> None:
        """`fill(model)` writes the new weights: in place (between calls), or into the standby copy, then flip."""
        with self._swapping:
            if not self.standby:
                with self._lock:
                    ok = False
                    if self.shared is not None:
                        self.shared.begin()  # readers of the shared weights see a write in progress
                    try:
                        fill(self.model)
                        ok = True
                    finally:
                        if self.shared is not None:
                            self.shared.end(version if ok else "?")
                    with self._cv:
                        self.version = version
                return
            with self._cv:  # the standby copy may still serve a call that started before the last flip
                target = self._standby
                self._cv.wait_for(lambda: target is None or self._users.get(id(target), 0) == 0)
            if target is None:
                import copy

                target = copy.deepcopy(self.model)
            fill(target)
            with self._cv:
                self._standby, self.model, self.version = self.model, target, version

    def share(self, layout_path):
        """Export this engine's parameters for other processes to copy (`policies.weights.shared`); in-place
        engines only (a standby engine's weights move between two copies)."""
        from policies.weights.shared import SharedWeights

        if self.standby:
            raise ValueError("a standby engine cannot share its weights: they flip between two copies")
        with self._swapping, self._lock:
            if self.shared is None:
                self.shared = SharedWeights(self.model, self.version, layout_path)
        return self.shared

    def _copy_into(self, model, sd: dict) -> None:
        from policies.weights.model_store import aliases

        with self.torch.no_grad():
            params = model.state_dict()  # tensors share storage with the live parameters
            tied = aliases(params)
            missing = [k for k in params if k not in sd and k not in tied]
            if missing:
                raise ValueError(f"weights file lacks {len(missing)} tensors, e.g. {missing[:3]}")
            for k, v in sd.items():
                if k in params:
                    params[k].copy_(v.to(params[k].dtype))

    def load_weights(self, path, version, shared: dict | None = None) -> float:
        """Copy a version into the model (in place, or standby then flip); returns milliseconds. With `shared`
        (a `SharedRef` of this version) the weights come from another engine's memory, else, or when that
        fails, from the safetensors file."""
        from policies.weights.model_store import read_weights
        from policies.weights.shared import read_shared

        t0 = time.perf_counter()
        if shared is not None and shared.get("version") == version:
            try:
                self._load(lambda m: read_shared(shared, lambda views: self._copy_into(m, dict(views))), version)
                self.last_load = "shared"
                return (time.perf_counter() - t0) * 1000
            except Exception as exc:  # rewritten meanwhile, or its producer is gone: the file is the record
                self.last_load = f"file ({type(exc).__name__}: {str(exc)[:160]})"
        else:
            self.last_load = "file"
        self.load_state_dict(read_weights(path), version)  # a file, or a shard index (the base of a 7B)
        return (time.perf_counter() - t0) * 1000

    def pause(self) -> None:
        self._paused.clear()

    def resume(self) -> None:
        self._paused.set()

    def health(self) -> dict:
        return {
            "engine": "transformers",
            "version": self.version,
            "device": self.device,
            "generated_tokens": self.generated_tokens,
            "paused": not self._paused.is_set(),
            "last_load": self.last_load,
            "shares": self.shared is not None,
        }
