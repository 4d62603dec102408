"""The transformers engine on CUDA: generation and in-place hot swap. Skipped without a GPU."""

import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def test_cuda_generate_and_swap(model_dir, tmp_path):
    from actors.events import ChatMessage
    from policies.chat import render
    from policies.engines.engine import TransformersEngine
    from policies.weights.model_store import WeightsStore

    e = TransformersEngine(model_dir, dtype="bfloat16", device="cuda", threads=0)
    g = e.generate([render([ChatMessage(role="user", content="What is the capital of France?")])], 12)[0]
    assert g.completion_tokens > 0
    sd = {k: v.detach().cpu().clone() for k, v in e.model.state_dict().items() if k != "lm_head.weight"}
    path, _ = WeightsStore(tmp_path).save(sd, "w-000001")
    assert e.load_weights(path, "w-000001") > 0 and e.version == "w-000001"
