"""The vLLM engine (GPU, `pip install -e '.[gpu]'`) behind the same interface as the transformers one.

vLLM's `AsyncLLM` runs on its own event-loop thread; the synchronous `Engine` methods submit
coroutines to it, so concurrent callers (Serve requests, a rollout group) are batched by vLLM's
scheduler. A weight update (`load_weights`) is vLLM's in-place protocol:

    pause_generation(mode="keep")   running requests freeze, nothing is aborted
    collective_rpc("kaizen_load_shared", ref)   every worker copies the gate engine's weights over CUDA IPC
                                    (`vllm_worker.py`); or, without a ref or when that fails,
    collective_rpc("kaizen_load_weights", path)   every worker loads the file
    reset_prefix_cache(reset_running_requests=True)   no prefix cached under the old weights is
                                    reused; running requests are recomputed under the new ones.
                                    vLLM returns False when it could not reset: that is an error.
    resume_generation()             frozen requests continue with the new weights

so clients see a slower stream, never an error. `engine` may be injected (tests use a stand-in
with the same coroutine methods, and a plain `sampling_params` class); otherwise vllm is imported
here, and only here.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from pathlib import Path

from policies.engines.generation import Generation, LockedTokenizer, trie_step
from policies.grammar import has_call_tokens


class VllmEngine:
    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: str = "bfloat16",
        gpu_memory_utilization: float = 0.3,
        max_model_len: int = 8192,
        enforce_eager: bool = False,
        load_format: str = "auto",
        version: str = "w-000000",
        engine=None,
        tokenizer=None,
        sampling_params=None,
    ):
        from transformers import AutoTokenizer

        self.version = version
        self.tok = tokenizer or LockedTokenizer(AutoTokenizer.from_pretrained(str(model_dir)))
        self.stop_ids = [t for t in {self.tok.convert_tokens_to_ids("<|im_end|>"), self.tok.eos_token_id} if t is not None]
        self.call_tokens = has_call_tokens(self.tok)  # Qwen's `<tool_call>` is a token of its own (`policies/grammar.py`)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="vllm-loop", daemon=True)
        self._thread.start()
        self._swap = threading.Lock()  # one weight update at a time
        self._paused = False
        self.generated_tokens = 0
        self.swap_ms: list[float] = []
        self.swaps = 0
        self.last_load = ""
        self._sampling = sampling_params
        if engine is None:
            engine = self._run(
                self._make(str(model_dir), dtype, gpu_memory_utilization, max_model_len, enforce_eager, load_format)
            )
        self.llm = engine

    @staticmethod
    async def _make(model_dir, dtype, gpu_memory_utilization, max_model_len, enforce_eager, load_format):
        from vllm import AsyncEngineArgs
        from vllm.config import StructuredOutputsConfig
        from vllm.v1.engine.async_llm import AsyncLLM

        args = AsyncEngineArgs(
            model=model_dir,
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=enforce_eager,
            load_format=load_format,
            enable_prefix_caching=True,
            worker_extension_cls="policies.engines.vllm_worker.WeightLoader",
            # response_format grammars are llguidance's (`%json` with its x-guidance spacing): `auto` would hand them to
            # xgrammar, which reads `%json` too but strictly (an object of no listed properties takes no keys)
            structured_outputs_config=StructuredOutputsConfig(backend="guidance"),
        )
        return AsyncLLM.from_engine_args(args)

    def _run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def _params(self, **kw):
        if self._sampling is None:
            from vllm import SamplingParams

            self._sampling = SamplingParams
        return self._sampling(**kw)

    @staticmethod
    def _prompt(ids: list[int]):
        return {"prompt_token_ids": ids}  # a TokensPrompt

    # ------------------------------------------------------------------ generation
    async def _one(self, prompt: str, params, stream_cb) -> Generation:
        version, swaps = self.version, self.swaps  # a request that straddles a swap keeps the version it began on
        final, sent = None, ""
        async for out in self.llm.generate(prompt, params, f"kz-{uuid.uuid4().hex}"):
            final = out
            if stream_cb is not None:
                text = out.outputs[0].text
                if len(text) > len(sent) and not text.endswith("\ufffd"):
                    stream_cb(text[len(sent) :])
                    sent = text
        c = final.outputs[0]
        self.generated_tokens += len(c.token_ids)
        return Generation(
            c.text,
            len(final.prompt_token_ids or []),
            len(c.token_ids),
            "length" if c.finish_reason == "length" else "stop",
            version,
            straddled=self.swaps != swaps,
        )

    def generate(
        self, prompts, max_new_tokens, temperature=0.0, top_p=1.0, stream_cb=None, stops=(), grammar=None
    ) -> list[Generation]:
        params = self._params(
            max_tokens=max_new_tokens,
            temperature=temperature or 0.0,
            top_p=top_p if temperature else 1.0,
            stop_token_ids=self.stop_ids,
            stop=list(stops) or None,  # vLLM ends the row there and leaves the stop string out of the text
            skip_special_tokens=True,
            **structured(grammar),
        )

        async def all_():
            return await asyncio.gather(*(self._one(p, params, stream_cb) for p in prompts))

        return self._run(all_())

    def count_tokens(self, text: str) -> int:
        return len(self.tok(text, add_special_tokens=False)["input_ids"])

    async def _prompt_logprobs(self, ids: list[int]) -> list:
        out = None
        async for o in self.llm.generate(
            self._prompt(ids), self._params(max_tokens=1, prompt_logprobs=0), f"kz-lp-{uuid.uuid4().hex}"
        ):
            out = o
        return out.prompt_logprobs

    def sequence_logprobs(self, pairs: list[tuple[str, str]]) -> list[tuple[float, int]]:
        async def one(prompt, cont):
            p = self.tok(prompt, add_special_tokens=False)["input_ids"]
            c = self.tok(cont, add_special_tokens=False)["input_ids"]
            lps = await self._prompt_logprobs(p + c)
            return sum(lps[len(p) + i][t].logprob for i, t in enumerate(c)), len(c)

        async def all_():
            return await asyncio.gather(*(one(p, c) for p, c in pairs))

        return self._run(all_())

    def choice_logprobs(self, prompts: list[str], choices: list[str]) -> list[list[float]]:
        first = [self.tok(c, add_special_tokens=False)["input_ids"][0] for c in choices]
        if len(set(first)) != len(first):
            raise ValueError(f"choices {choices!r} share their first token")

        async def one(prompt):
            p = self.tok(prompt, add_special_tokens=False)["input_ids"]
            lps = await asyncio.gather(*(self._prompt_logprobs(p + [t]) for t in first))
            return [lp[-1][t].logprob for lp, t in zip(lps, first)]

        async def all_():
            return await asyncio.gather(*(one(p) for p in prompts))

        return self._run(all_())

    def choose(self, prompt: str, options: list[str], temperature: float = 0.0) -> str:
        """Constrained decoding over the options' tokenisations: one token at a time, restricted with
        `allowed_token_ids` (the prompt prefix is cached, so each step costs one decode)."""
        seqs = {o: self.tok(o, add_special_tokens=False)["input_ids"] for o in dict.fromkeys(options)}
        if not seqs:
            raise ValueError("no options to choose from")
        base = self.tok(prompt, add_special_tokens=False)["input_ids"]

        async def walk():
            chosen: list[int] = []
            while True:
                done, nxt = trie_step(seqs, chosen)
                if done and not nxt:
                    return done[0]
                params = self._params(max_tokens=1, temperature=temperature or 0.0, allowed_token_ids=nxt)
                out = None
                async for o in self.llm.generate(self._prompt(base + chosen), params, f"kz-ch-{uuid.uuid4().hex}"):
                    out = o
                chosen.append(out.outputs[0].token_ids[0])

        return self._run(walk())

    # ------------------------------------------------------------------ weights
    async def _update(self, path: str, version: str, shared: dict | None) -> None:
        await self.llm.pause_generation(mode="keep", clear_cache=False)
        try:
            how = "file"
            if shared is not None and shared.get("version") == version:  # the gate engine's memory, over CUDA IPC
                res = await self.llm.collective_rpc("kaizen_load_shared", args=(shared,))
                bad = [r for r in res if not (isinstance(r, dict) and r.get("ok"))]
                how = "shared" if not bad else f"file ({bad[0].get('error') if isinstance(bad[0], dict) else bad[0]})"
            if how != "shared":  # a partial shared copy is overwritten whole, still paused
                await self.llm.collective_rpc("kaizen_load_weights", args=(path,))
            if not await self.llm.reset_prefix_cache(reset_running_requests=True):
                raise RuntimeError(
                    "vLLM did not reset its prefix cache after a weight update; refusing to serve "
                    "prefixes computed with the old weights"
                )
            self.version = version  # requests that start from here on are the new version's alone
            self.swaps += 1  # running ones continue under the new weights: they are marked straddled
            self.last_load = how
        finally:
            await self.llm.resume_generation()

    def load_weights(self, path, version, shared: dict | None = None) -> float:
        """In-place update with requests in flight (see the module docstring); returns milliseconds. `shared`:
        a `SharedRef` of this version (then no file is read unless it fails)."""
        with self._swap:
            t0 = time.perf_counter()
            self._run(self._update(str(path), version, shared))
            ms = (time.perf_counter() - t0) * 1000
            self.swap_ms.append(ms)
            return ms

    def pause(self) -> None:
        self._run(self.llm.pause_generation(mode="keep", clear_cache=False))
        self._paused = True

    def resume(self) -> None:
        self._run(self.llm.resume_generation())
        self._paused = False

    def health(self) -> dict:
        return {
            "engine": "vllm",
            "version": self.version,
            "generated_tokens": self.generated_tokens,
            "paused": self._paused,
            "swaps": len(self.swap_ms),
            "last_load": self.last_load,
        }

    def shutdown(self) -> None:
        shut = getattr(self.llm, "shutdown", None)
        if shut:
            shut()
        self._loop.call_soon_threadsafe(self._loop.stop)


def structured(grammar: str | None) -> dict:
    """SamplingParams' structured-output argument for a response_format's Lark grammar (`policies.grammar`), which
    the engine's `guidance` backend (llguidance, `_make`) compiles. Older releases named the field `guided_decoding`."""
    if not grammar:
        return {}
    try:
        from vllm.sampling_params import StructuredOutputsParams
    except ImportError:
        from vllm.sampling_params import GuidedDecodingParams

        return {"guided_decoding": GuidedDecodingParams(grammar=grammar)}
    return {"structured_outputs": StructuredOutputsParams(grammar=grammar)}
