"""Swaps from memory (policies/weights/shared.py): the gate engine's weights exported once and copied by other
processes, and the seqlock that sends a reader racing a rewrite to the file. Shared memory on a CPU here (the
same protocol as CUDA IPC: tests/gpu/test_shared_cuda.py runs that one)."""

import json
import multiprocessing as mp
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file, save_file

from policies.weights.shared import SharedChanged, SharedWeights, read_shared


def _reader(requests, replies):
    """Another process: copies what each ref it is sent names, or says why it could not."""
    from policies.weights.shared import SharedChanged, read_shared

    for ref in iter(requests.get, None):
        try:
            out = read_shared(json.loads(ref), lambda views: {n: t.clone().tolist() for n, t in views})
            replies.put(("ok", out))
        except SharedChanged as exc:
            replies.put(("changed", str(exc)))


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.head = torch.nn.Linear(3, 5, bias=False)
        self.head.weight = self.embed.weight  # tied: one entry
        self.norm = torch.nn.Linear(3, 3)


def test_another_process_copies_the_weights_and_a_rewrite_sends_it_to_the_file(tmp_path):
    m = Tied()
    shared = SharedWeights(m, "w-000001", tmp_path / "layout.json")
    ref = shared.ref()
    assert set(ref) == {"version", "seq", "layout", "owner"} and ref["version"] == "w-000001" and ref["seq"] == 0
    names = [t["name"] for t in json.loads((tmp_path / "layout.json").read_text())["tensors"]]
    assert names == ["embed.weight", "norm.weight", "norm.bias"]  # the tied head is the embedding's entry
    ctx = mp.get_context("spawn")
    requests, replies = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_reader, args=(requests, replies), daemon=True)
    proc.start()
    try:
        requests.put(json.dumps(ref))
        kind, got = replies.get(timeout=120)
        assert kind == "ok" and set(got) == set(names)
        for k in names:
            assert torch.equal(torch.tensor(got[k]), m.state_dict()[k]), k

        shared.begin()  # the gate engine copies the next candidate in
        with pytest.raises(SharedChanged):
            shared.ref()  # no ref is handed out mid-write
        with torch.no_grad():
            m.embed.weight.add_(1.0)
        shared.end("w-000002")
        requests.put(json.dumps(ref))  # a replica still holding the old ref
        kind, why = replies.get(timeout=60)
        assert kind == "changed" and "w-000001" in why and "load the file" in why
        new = shared.ref()
        assert new["version"] == "w-000002" and new["seq"] == 2
        requests.put(json.dumps(new))
        kind, got = replies.get(timeout=60)
        assert kind == "ok" and torch.equal(torch.tensor(got["embed.weight"]), m.embed.weight.detach())
    finally:
        requests.put(None)
        proc.join(30)


def test_a_ref_from_an_ended_process_is_refused(tmp_path):
    shared = SharedWeights(torch.nn.Linear(2, 2), "w-000003", tmp_path / "layout.json")
    with pytest.raises(SharedChanged, match="ended"):
        read_shared({**shared.ref(), "owner": -1}, list)


def _versions(d, tmp_path):
    base = load_file(str(d / "model.safetensors"))
    files = {}
    for n in (1, 2):
        torch.manual_seed(n)
        files[n] = tmp_path / f"w-{n:06d}.safetensors"
        save_file({k: v + 0.01 * torch.randn_like(v) for k, v in base.items()}, str(files[n]))
    return files


def test_a_serving_engine_copies_the_gate_engines_weights_without_reading_the_file(untied_dir, tmp_path):
    from policies.engines.engine import TransformersEngine

    files = _versions(untied_dir, tmp_path)
    gate = TransformersEngine(untied_dir, dtype="float32")
    gate.share(tmp_path / "layout.json")
    gate.load_weights(files[1], "w-000001")  # the gate scores the candidate
    ref = gate.shared.ref()
    assert ref["version"] == "w-000001" and ref["seq"] == 2
    serve = TransformersEngine(untied_dir, dtype="float32", standby=True)
    serve.load_weights(tmp_path / "no-such-file.safetensors", "w-000001", shared=ref)  # no file is read
    assert serve.last_load == "shared" and serve.version == "w-000001"
    served, want = serve.model.state_dict(), load_file(str(files[1]))
    assert "lm_head.weight" in want
    for k, v in want.items():
        assert torch.equal(served[k], v), k

    gate.load_weights(files[2], "w-000002")  # the next candidate: the old ref is stale
    serve.load_weights(files[1], "w-000001", shared=ref)
    assert serve.last_load.startswith("file (SharedChanged") and serve.version == "w-000001"
    served = serve.model.state_dict()
    assert all(torch.equal(served[k], v) for k, v in want.items())
    serve.load_weights(files[2], "w-000002", shared=ref)  # a ref of another version is not even tried
    assert serve.last_load == "file" and torch.equal(
        serve.model.state_dict()["lm_head.weight"], load_file(str(files[2]))["lm_head.weight"]
    )
    with pytest.raises(ValueError, match="standby"):
        serve.share(tmp_path / "other.json")


class Served(torch.nn.Module):
    """A stand-in for vLLM's model: `load_weights` copies Hugging Face names in place, reports what it wrote."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 2)

    def load_weights(self, weights):
        sd, done = dict(self.named_parameters()), set()
        with torch.no_grad():
            for name, t in weights:
                sd[name].copy_(t)
                done.add(name)
        return done


def test_the_vllm_worker_copies_a_shared_ref_and_reports_a_stale_one(tmp_path):
    from policies.engines.vllm_worker import WeightLoader

    gate = Served()
    shared = SharedWeights(gate, "w-000001", tmp_path / "layout.json")
    worker = WeightLoader()
    worker.model_runner = SimpleNamespace(model=Served())
    ref = shared.ref()
    assert worker.kaizen_load_shared(ref) == {"ok": True, "tensors": 2}
    for k, v in gate.state_dict().items():
        assert torch.equal(worker.model_runner.model.state_dict()[k], v), k
    shared.begin()
    shared.end("w-000002")
    out = worker.kaizen_load_shared(ref)  # never raises: the engine loads the file instead
    assert out["ok"] is False and out["error"].startswith("SharedChanged")
