"""A base model that ships in shards (7B models do): the store, the engines, the trainer and vLLM's worker loader
read it through its shard index, and the gate and a rollback can use it like a single file."""

import torch


def _sharded(tmp_path, tiny_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_dir))
    out = tmp_path / "sharded"
    model.save_pretrained(out, max_shard_size="20KB")
    AutoTokenizer.from_pretrained(str(tiny_dir)).save_pretrained(out)
    return out, {k: v.clone() for k, v in model.state_dict().items()}


def test_a_base_in_shards_is_read_through_its_index(tmp_path, tiny_dir):
    from policies.engines.engine import TransformersEngine
    from policies.weights.model_store import BASE_VERSION, WeightsStore, iter_weights, read_weights, weight_files

    folder, want = _sharded(tmp_path, tiny_dir)
    assert not (folder / "model.safetensors").exists()
    path = WeightsStore(tmp_path / "state").file(BASE_VERSION, folder)
    assert path.name == "model.safetensors.index.json" and len(weight_files(path)) > 2
    got = read_weights(path)
    assert set(got) >= {k for k in want if k != "lm_head.weight"}  # a tied head is not stored
    assert all(torch.equal(got[k], want[k]) for k in got)
    assert sum(1 for _ in iter_weights(path)) == len(got)
    eng = TransformersEngine(folder, dtype="float32", threads=1)
    with torch.no_grad():
        for p in eng.model.parameters():
            p.add_(1.0)  # a trained version, then a rollback to the base in shards
    eng.load_weights(path, BASE_VERSION)
    assert all(torch.equal(eng.model.state_dict()[k], want[k]) for k in got) and eng.version == BASE_VERSION


def test_the_trainer_and_the_vllm_worker_loader_take_a_shard_index(tmp_path, tiny_dir):
    from config.settings import load_settings
    from policies.engines.vllm_worker import WeightLoader
    from policies.learning.trainer import Trainer
    from policies.weights.model_store import BASE_VERSION, WeightsStore

    folder, want = _sharded(tmp_path, tiny_dir)
    s = load_settings(None)
    s.state_dir = str(tmp_path / "state")
    store = WeightsStore(s.state)
    t = Trainer(s, folder, store)
    assert set(t._weights(BASE_VERSION)) == set(t._weights(BASE_VERSION, str(store.file(BASE_VERSION, folder))))

    class Model:
        def __init__(self):
            self.got = {}

        def named_parameters(self):
            return iter([])

        def load_weights(self, weights):
            for n, v in weights:
                self.got[n] = v
            return None

    loader = WeightLoader.__new__(WeightLoader)
    model = Model()
    loader.model_runner = type("R", (), {"model": model})()
    assert loader.kaizen_load_weights(str(store.file(BASE_VERSION, folder))) == len(model.got) > 0
