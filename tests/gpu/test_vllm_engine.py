"""The vLLM engine on CUDA: generation, and in-place weight updates with requests in flight (no request
fails, the output follows the weights, the original weights give back the original greedy output, so no
prefix computed under other weights is reused). Skipped without a GPU or without the `gpu` extra."""

import importlib.util
import threading

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("vllm") is None,
    reason="needs CUDA and vllm (pip install -e '.[gpu]')",
)


def test_vllm_swaps_in_place_with_requests_in_flight(model_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    from actors.events import ChatMessage
    from policies.chat import render
    from policies.engines.vllm_engine import VllmEngine

    eng = VllmEngine(model_dir, gpu_memory_utilization=0.3, max_model_len=2048)
    prompt = render([ChatMessage(role="user", content="What is the capital of France?")])
    before = eng.generate([prompt], 16)[0].text
    assert before
    base = load_file(str(model_dir / "model.safetensors"))
    broken = {k: (torch.zeros_like(v) if k.endswith("norm.weight") else v) for k, v in base.items()}
    save_file(broken, str(tmp_path / "broken.safetensors"))
    results, errors = [], []

    def client():
        try:
            results.extend(eng.generate([prompt] * 4, 64, temperature=0.8))
        except Exception as exc:  # noqa: BLE001 - any failure counts
            errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    ms = eng.load_weights(tmp_path / "broken.safetensors", "w-000001")
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 16 and eng.version == "w-000001" and ms > 0
    assert eng.generate([prompt], 16)[0].text != before  # the new weights answer
    eng.load_weights(model_dir / "model.safetensors", "w-000000")
    assert eng.generate([prompt], 16)[0].text == before  # and the old ones give the old answer back
    eng.shutdown()
