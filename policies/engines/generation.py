"""What every engine shares: a generation's result, the engine protocol, constrained-decoding steps, and a
tokenizer safe to share between threads. No engine imports another; they all import this."""

from __future__ import annotations

import threading
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
    straddled: bool = False  # a weights swap happened mid-generation: `version` made only its first tokens


class Engine(Protocol):
    """What callers use of an engine (`engine.py` TransformersEngine, `vllm_engine.py` VllmEngine, both in this package)."""

    version: str
    call_tokens: bool  # its vocabulary has `<tool_call>` and `</tool_call>` as tokens of their own (`policies.grammar`)

    def generate(
        self,
        prompts: list[str],
        max_new_tokens: int,
        temperature: float = 0.0,
        top_p: float = 1.0,
        stream_cb=None,
        stops: tuple[str, ...] = (),
        grammar: str | None = None,
    ) -> list[Generation]:
        """`stops`: stop strings (a request's `stop`); a row ends once its text holds one (the text may go on past it
        within its last token: callers cut at the stop, `serve.wire.cut_at_stop`). `grammar`: every row's text follows
        it (a request's `response_format`, `policies.grammar.response_grammar`)."""

    def count_tokens(self, text: str) -> int: ...

    def choice_logprobs(self, prompts: list[str], choices: list[str]) -> list[list[float]]: ...

    def choose(self, prompt: str, options: list[str], temperature: float = 0.0) -> str:
        """One of `options`, by constrained decoding from `prompt` (a forced call's function name)."""

    def sequence_logprobs(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]: ...

    def load_weights(self, path: str | Path, version: str, shared: dict | None = None) -> float:
        """Swap to `version`'s weights (milliseconds taken): from `shared` (a SharedRef of that version,
        policies/weights/shared.py) where the engine can copy them from memory, else from the file at `path`."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def health(self) -> dict: ...


def trie_step(seqs: dict[str, list[int]], chosen: list[int]) -> tuple[list[str], list[int]]:
    """One step of constrained decoding over the options' tokenisations `seqs`, after the tokens
    `chosen`: the options already complete, and the tokens that may come next."""
    live = {o: s for o, s in seqs.items() if s[: len(chosen)] == chosen}
    done = [o for o, s in live.items() if len(s) == len(chosen)]
    return done, sorted({s[len(chosen)] for s in live.values() if len(s) > len(chosen)})


def walk_choice(torch, model, past, logits, seqs: dict[str, list[int]], temperature: float, device) -> str:
    """One of the options `seqs` (option -> its token ids), decoded token by token from a prompt's last-position
    `logits` and cache `past` (which the choice's tokens extend): greedy, or sampled at `temperature`."""
    chosen: list[int] = []
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
        out = model(input_ids=torch.tensor([[t]], device=device), past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1].float()


class KeptPrefill:
    """One prompt's prefill (key-value cache and last-position logits), kept by an engine under its lock: a forced
    call's name is chosen from a prompt (`choose`), a group's samples each choose from the same one, and the generation
    that follows a choice starts with it. `get` returns it for the same tokens on the same weights (else runs
    `prefill()` and keeps that); `take` hands it to a generation whose tokens start with part of it, cut to the part
    they share, and forgets it (the generation extends it). `enabled = False` keeps nothing."""

    def __init__(self):
        self.enabled, self.key, self.cache, self.logits = True, None, None, None

    def get(self, model, version: str, ids: list[int], prefill):
        key = (id(model), version, tuple(ids))
        if not self.enabled:
            out = prefill()
            return out.past_key_values, out.logits[0, -1].float()
        if self.key != key:
            out = prefill()
            self.key, self.cache, self.logits = key, out.past_key_values, out.logits[0, -1].float()
        return self.cache, self.logits

    def take(self, model, version: str, ids: list[int]):
        if not (self.enabled and self.key and self.key[:2] == (id(model), version)):
            return None
        kept, cache = self.key[2], self.cache
        n = 0
        while n < min(len(kept), len(ids) - 1) and kept[n] == ids[n]:
            n += 1
        self.key = self.cache = self.logits = None
        if n == 0:
            return None
        cache.crop(n)
        return cache


class LockedTokenizer:
    """A tokenizer shared by threads: a fast (Rust) tokenizer raises "Already borrowed" when two threads
    use it at once, so every call goes through one lock; attributes pass through."""

    def __init__(self, tok):
        self._tok, self._lock = tok, threading.RLock()

    def __call__(self, *a, **kw):
        with self._lock:
            return self._tok(*a, **kw)

    def __getattr__(self, name):
        attr = getattr(self._tok, name)
        if not callable(attr):
            return attr

        def locked(*a, **kw):
            with self._lock:
                return attr(*a, **kw)

        return locked

    def __setattr__(self, name, value):
        if name in ("_tok", "_lock"):
            object.__setattr__(self, name, value)
        else:
            setattr(self._tok, name, value)


def shared_prefix_logprobs(model, torch, pairs: list[tuple[list[int], list[int]]], device) -> list[tuple[float, int]]:
    """(sum of log P(continuation | prompt), continuation length) per pair of token-id lists, for one causal LM.

    Prompts that start alike (the same system prompt and tool documents) are run through the model once: the
    pairs go in sorted order, each reusing the KV cache of the one before up to their common prefix (at least
    the last prompt token is always run, since its logits score the first continuation token), and logits are
    computed for the continuation positions only, not the whole sequence."""
    from transformers import DynamicCache

    out: list[tuple[float, int] | None] = [None] * len(pairs)
    cache, cached = None, []
    for i in sorted(range(len(pairs)), key=lambda j: pairs[j][0] + pairs[j][1]):
        p, c = pairs[i]
        if not p:
            raise ValueError("a scored continuation needs a non-empty prompt")
        if not c:
            out[i] = (0.0, 0)
            continue
        ids = p + c
        common = 0
        while common < min(len(ids), len(cached)) and ids[common] == cached[common]:
            common += 1
        keep = min(common, len(p) - 1)
        if cache is None or keep == 0:
            cache, keep = DynamicCache(), 0
        else:
            cache.crop(keep)
        res = model(
            input_ids=torch.tensor([ids[keep:]], device=device), past_key_values=cache, use_cache=True, logits_to_keep=len(c) + 1
        )
        cache, cached = res.past_key_values, ids
        logits = res.logits[0, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(c, device=device).unsqueeze(-1))
        out[i] = (float(lp.sum()), len(c))
    return out  # type: ignore[return-value]
