"""The vLLM adapter's weight-update protocol (pause in keep mode, load, reset the prefix cache, resume) with a
stand-in AsyncLLM, its worker extension, and the standby engine (the real vLLM path runs in tests/gpu)."""

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest
import torch

# ---------------------------------------------------------------------------- the vLLM adapter


class FakeAsyncLLM:
    """Stand-in with AsyncLLM's coroutine methods; generations take `delay` seconds."""

    def __init__(self, delay=0.2, reset_ok=True):
        self.calls, self.delay, self.reset_ok, self.paused = [], delay, reset_ok, False

    async def generate(self, prompt, params, request_id):
        self.calls.append(("generate", params))
        while self.paused:
            await asyncio.sleep(0.01)
        await asyncio.sleep(self.delay)
        if isinstance(prompt, dict):  # token prompt: scoring or constrained choice
            ids = prompt["prompt_token_ids"]
            lps = [None] + [{t: SimpleNamespace(logprob=-0.5)} for t in ids[1:]]
            allowed = params.get("allowed_token_ids") or [7]
            yield SimpleNamespace(
                prompt_token_ids=ids,
                prompt_logprobs=lps,
                outputs=[SimpleNamespace(text="", token_ids=[allowed[-1]], finish_reason="length")],
            )
            return
        yield SimpleNamespace(
            prompt_token_ids=[1, 2, 3],
            prompt_logprobs=None,
            outputs=[SimpleNamespace(text="hel", token_ids=[4], finish_reason=None)],
        )
        yield SimpleNamespace(
            prompt_token_ids=[1, 2, 3],
            prompt_logprobs=None,
            outputs=[SimpleNamespace(text="hello", token_ids=[4, 5], finish_reason="stop")],
        )

    async def pause_generation(self, mode="abort", clear_cache=True):
        self.calls.append(("pause", mode, clear_cache))
        self.paused = True

    async def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method, args))
        return [1]

    async def reset_prefix_cache(self, reset_running_requests=False):
        self.calls.append(("reset", reset_running_requests))
        return self.reset_ok

    async def resume_generation(self):
        self.calls.append(("resume",))
        self.paused = False


class FakeTokenizer:
    eos_token_id = 2

    def convert_tokens_to_ids(self, t):
        return 3

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [10 + (ord(c) % 50) for c in text]}


def _engine(**kw):
    from policies.engines.vllm_engine import VllmEngine

    return VllmEngine("unused", engine=FakeAsyncLLM(**kw), tokenizer=FakeTokenizer(), sampling_params=dict)


def test_vllm_update_is_pause_keep_load_reset_resume_with_requests_in_flight():
    eng = _engine(delay=0.3)
    results = {}
    t = threading.Thread(target=lambda: results.update(g=eng.generate(["p1", "p2"], 8, temperature=0.7)))
    t.start()
    time.sleep(0.1)  # both requests are running
    ms = eng.load_weights("/weights/w-000001.safetensors", "w-000001")
    t.join(5)
    ops = [c[0] for c in eng.llm.calls if c[0] != "generate"]
    assert ops == ["pause", "rpc", "reset", "resume"] and ms > 0
    assert ("pause", "keep", False) in eng.llm.calls and ("reset", True) in eng.llm.calls
    assert ("rpc", "kaizen_load_weights", ("/weights/w-000001.safetensors",)) in eng.llm.calls
    g = results["g"]
    assert [x.text for x in g] == ["hello", "hello"] and all(x.finish_reason == "stop" for x in g)
    # begun on w-000000, finished on w-000001: labelled with where they began, and marked as mixed
    assert eng.version == "w-000001" and {x.version for x in g} == {"w-000000"} and all(x.straddled for x in g)
    after = eng.generate(["p3"], 8)[0]
    assert after.version == "w-000001" and not after.straddled
    params = eng.llm.calls[0][1]
    assert params["stop_token_ids"] and params["temperature"] == 0.7


def test_vllm_update_that_cannot_reset_the_prefix_cache_fails_and_resumes():
    eng = _engine(reset_ok=False)
    with pytest.raises(RuntimeError, match="prefix cache"):
        eng.load_weights("/w.safetensors", "w-000009")
    assert eng.version == "w-000000" and eng.llm.calls[-1] == ("resume",) and not eng.llm.paused


def test_vllm_update_from_shared_weights_reads_no_file_unless_the_copy_fails():
    eng = _engine(delay=0.0)
    replies = {"kaizen_load_shared": [{"ok": True, "tensors": 339}]}

    async def rpc(method, args=()):
        eng.llm.calls.append(("rpc", method, args))
        return replies.get(method, [1])

    eng.llm.collective_rpc = rpc
    ref = {"version": "w-000001", "seq": 2, "layout": "/state/weights/shared-layout.json", "owner": 7}
    eng.load_weights("/weights/w-000001.safetensors", "w-000001", shared=ref)
    ops = [c[:2] for c in eng.llm.calls]
    assert ops == [("pause", "keep"), ("rpc", "kaizen_load_shared"), ("reset", True), ("resume",)]
    assert eng.llm.calls[1][2] == (ref,) and eng.last_load == "shared" and eng.version == "w-000001"
    eng.llm.calls.clear()
    replies["kaizen_load_shared"] = [{"ok": False, "error": "SharedChanged: rewritten"}]
    eng.load_weights("/weights/w-000002.safetensors", "w-000002", shared={**ref, "version": "w-000002"})
    rpcs = [c[1:] for c in eng.llm.calls if c[0] == "rpc"]  # the partial copy is overwritten whole, still paused
    assert [m for m, _ in rpcs] == ["kaizen_load_shared", "kaizen_load_weights"]
    assert [c[0] for c in eng.llm.calls] == ["pause", "rpc", "rpc", "reset", "resume"]
    assert eng.last_load.startswith("file (SharedChanged") and eng.version == "w-000002"
    eng.llm.calls.clear()
    eng.load_weights("/weights/w-000003.safetensors", "w-000003", shared=ref)  # a ref of another version
    assert [c[1] for c in eng.llm.calls if c[0] == "rpc"] == ["kaizen_load_weights"] and eng.last_load == "file"


def test_vllm_scoring_choice_and_streaming():
    eng = _engine(delay=0.0)
    ((lp, n),) = eng.sequence_logprobs([("ab", "cd")])
    assert n == 2 and lp == pytest.approx(-1.0)
    assert eng.choose("q", ["x", "y"]) in ("x", "y")
    pieces = []
    eng.generate(["p"], 8, stream_cb=pieces.append)
    assert "".join(pieces) == "hello"


def test_vllm_worker_extension_loads_a_file_in_place(tmp_path):
    from safetensors.torch import save_file

    from policies.engines.vllm_worker import WeightLoader

    save_file({"model.layers.0.w": torch.ones(2), "model.norm.weight": torch.zeros(3)}, str(tmp_path / "w.safetensors"))
    seen = {}
    model = SimpleNamespace(load_weights=lambda weights: seen.update({k: v.clone() for k, v in weights}))
    worker = WeightLoader()
    worker.model_runner, worker.device = SimpleNamespace(model=model), "cpu"
    assert worker.kaizen_load_weights(str(tmp_path / "w.safetensors")) == 2
    assert sorted(seen) == ["model.layers.0.w", "model.norm.weight"] and float(seen["model.layers.0.w"].sum()) == 2


def test_standby_engine_swaps_without_waiting_for_a_running_generation(model_dir):
    from safetensors.torch import load_file

    from actors.events import ChatMessage
    from policies.chat import render
    from policies.engines.engine import TransformersEngine

    eng = TransformersEngine(model_dir, standby=True)
    prompt = render([ChatMessage(role="user", content="Tell me about Paris.")])
    greedy = eng.generate([prompt], 12)[0]
    base = load_file(str(model_dir / "model.safetensors"))
    torch.manual_seed(0)
    other = {k: v * (1 + 0.05 * torch.randn_like(v)) for k, v in base.items()}
    running, done = {}, threading.Event()
    t = threading.Thread(target=lambda: (running.update(g=eng.generate([prompt], 96, temperature=0.0)[0]), done.set()))
    t.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    eng.load_state_dict(other, "w-000001")
    swap_s = time.perf_counter() - t0
    assert not done.is_set(), "the swap waited for the running generation"
    t.join(120)
    assert running["g"].version == "w-000000" and eng.version == "w-000001"  # it finished on its own weights
    assert eng.generate([prompt], 12)[0].version == "w-000001" and swap_s < 30
    eng.load_state_dict(base, "w-000000")  # into the previous copy: the original answer comes back
    assert eng.generate([prompt], 12)[0].text == greedy.text


def test_vllm_worker_refuses_a_file_that_leaves_parameters_unchanged(tmp_path):
    from safetensors.torch import save_file

    from policies.engines.vllm_worker import WeightLoader

    save_file({"model.norm.weight": torch.zeros(3)}, str(tmp_path / "w.safetensors"))
    params = [("model.norm.weight", None), ("lm_head.weight", None)]  # an untied head the file lacks
    model = SimpleNamespace(load_weights=lambda weights: {k for k, _ in weights}, named_parameters=lambda: params)
    worker = WeightLoader()
    worker.model_runner, worker.device = SimpleNamespace(model=model), "cpu"
    with pytest.raises(RuntimeError, match="lm_head"):
        worker.kaizen_load_weights(str(tmp_path / "w.safetensors"))


@pytest.mark.parametrize("which", ["untied", "tied"])
def test_every_trained_parameter_reaches_the_serving_engine(which, untied_dir, model_dir, settings):
    from policies.engines.engine import TransformersEngine
    from policies.learning.trainer import Trainer

    d = untied_dir if which == "untied" else model_dir
    t = Trainer(settings, d)
    with torch.no_grad():
        for p in t.model.parameters():  # what a training step does: every parameter moves
            p.add_(0.01 * torch.randn_like(p))
    sd = t.export("float32")
    assert ("lm_head.weight" in sd) == (which == "untied")
    eng = TransformersEngine(d, dtype="float32")
    eng.load_state_dict(sd, "w-000001")
    served = eng.model.state_dict()
    for k, v in t.model.state_dict().items():
        assert torch.equal(served[k], v.detach()), k
    if which == "untied":
        with pytest.raises(ValueError, match="lm_head"):  # a file without the head is refused, not half-loaded
            eng.load_state_dict({k: v for k, v in sd.items() if k != "lm_head.weight"}, "w-000002")


def test_vllm_gets_a_response_format_grammar_as_its_structured_output_and_free_text_gets_none(monkeypatch):
    import sys
    import types
    from dataclasses import dataclass

    @dataclass
    class StructuredOutputsParams:  # vLLM's, as 0.31 names it
        grammar: str | None = None

    @dataclass
    class StructuredOutputsConfig:
        backend: str = "auto"

    made = {}
    vllm = types.SimpleNamespace(AsyncEngineArgs=lambda **kw: made.update(kw) or kw)
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.config", types.SimpleNamespace(StructuredOutputsConfig=StructuredOutputsConfig))
    monkeypatch.setitem(
        sys.modules, "vllm.v1.engine.async_llm", types.SimpleNamespace(AsyncLLM=types.SimpleNamespace(from_engine_args=dict))
    )
    monkeypatch.setitem(
        sys.modules, "vllm.sampling_params", types.SimpleNamespace(StructuredOutputsParams=StructuredOutputsParams)
    )
    from policies.engines.vllm_engine import VllmEngine

    asyncio.run(VllmEngine._make("m", "bfloat16", 0.5, 2048, True, "auto"))  # the engine's backend is llguidance's
    assert made["structured_outputs_config"] == StructuredOutputsConfig(backend="guidance")
    eng = _engine(delay=0.0)
    eng.generate(["p"], 8, grammar='start: %json {"type": "object"}')
    eng.generate(["p"], 8)
    with_grammar, free = [c[1] for c in eng.llm.calls if c[0] == "generate"]
    assert with_grammar["structured_outputs"] == StructuredOutputsParams(grammar='start: %json {"type": "object"}')
    assert "structured_outputs" not in free
