"""Weights that stay in memory for a swap: one engine's parameters, exported once, copied by other processes.

The file path (a safetensors file, sha256-verified once when the version is staged) is the durable record
and the fallback. A swap from it costs a disk read in every replica (seconds at 7B). Instead the broadcaster's
gate engine, which has just scored the version and so holds it already, shares its parameters in place:
- on a GPU, as CUDA IPC handles (`UntypedStorage._share_cuda_`); the receiving process maps the same device
  memory and copies it into its own weights (vLLM: `model.load_weights` in each worker, `policies/engines/vllm_worker.py`);
- on a CPU, as POSIX shared-memory files (`_share_filename_cpu_`, torch's file_system strategy).
Handles are exported once per parameter storage (the engine copies new versions into the same storages, so
the addresses never move) and written once to a layout file (names, shapes, handles); a `SharedRef` is a few
plain fields (version, sequence number, layout file, producer pid) and travels in the LIVE pointer. A reader
maps each storage once and keeps the mapping while the producer lives (the next swap maps nothing).

No extra copy of the weights exists, so the one copy must not change while a replica reads it: a sequence
counter beside it (a seqlock) is odd while the engine writes and even otherwise. A reader checks it before
and after its copy and raises `SharedChanged` when it moved: the engine then loads the file instead.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Iterator

DTYPES = ("float32", "bfloat16", "float16", "int64")


class SharedChanged(RuntimeError):
    """The shared weights were rewritten (another version) before or while they were read."""


def _b(x: bytes | None) -> str | None:
    return None if x is None else base64.b64encode(x).decode()


def _u(x: str | None) -> bytes | None:
    return None if x is None else base64.b64decode(x)


def export_storage(t) -> dict:
    """A tensor's storage as plain data another process can open (`open_storage`)."""
    s = t.untyped_storage()
    if t.is_cuda:
        import torch

        dev, handle, size, off, rc, rc_off, ev, ev_sync = s._share_cuda_()
        return {
            "kind": "cuda",
            "gpu": str(torch.cuda.get_device_properties(dev).uuid),
            "handle": _b(handle),
            "size": size,
            "offset": off,
            "ref_counter": _b(rc),
            "ref_counter_offset": rc_off,
            "event": _b(ev),
            "event_sync": ev_sync,
        }
    if t.device.type != "cpu":
        raise ValueError(f"cannot share a tensor on {t.device}")
    manager, handle, size = s._share_filename_cpu_()  # moves the storage into shared memory, in place
    s._shared_incref()  # held for the life of this process
    return {"kind": "cpu", "manager": _b(manager), "handle": _b(handle), "size": size}


def local_gpu(uuid: str) -> int:
    """This process's index of the GPU with this UUID (indices differ between processes that see different
    CUDA_VISIBLE_DEVICES; the UUID does not)."""
    import torch

    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid) == uuid:
            return i
    raise RuntimeError(f"the shared weights live on GPU {uuid}, which this process does not see")


def open_storage(d: dict):
    """Map an exported storage into this process (on a GPU: the same device memory, no copy)."""
    import torch

    if d["kind"] == "cuda":
        torch.cuda._lazy_init()
        dev = local_gpu(d["gpu"])
        return torch.UntypedStorage._new_shared_cuda(
            dev,
            _u(d["handle"]),
            d["size"],
            d["offset"],
            _u(d["ref_counter"]),
            d["ref_counter_offset"],
            _u(d["event"]),
            d["event_sync"],
        )
    return torch.UntypedStorage._new_shared_filename_cpu(_u(d["manager"]), _u(d["handle"]), d["size"])


def _view(storage, dtype, shape, stride, offset):
    import torch

    t = torch.empty(0, dtype=dtype, device=storage.device)
    t.set_(storage, offset, shape, stride)
    return t


class SharedWeights:
    """The producer: a model whose parameters are shared, with the seqlock. `begin()` / `end(version)` bracket
    every write into the parameters (`TransformersEngine.load_state_dict` calls them)."""

    def __init__(self, model, version: str, layout_path: str | Path):
        import torch

        from policies.weights.model_store import atomic_write_bytes

        self.model, self.version = model, version
        sd = model.state_dict()  # the names a weights file has (tensors share the parameters' storages)
        bad = [f"{k} ({t.dtype})" for k, t in sd.items() if str(t.dtype).removeprefix("torch.") not in DTYPES]
        if bad:
            raise ValueError(f"cannot share {bad[:3]}")
        exports = {}
        for t in sd.values():  # first export each storage (on a CPU that moves it into shared memory) ...
            ptr = t.untyped_storage().data_ptr()
            if ptr not in exports:
                exports[t.untyped_storage().data_ptr()] = exports[ptr] = export_storage(t)
        tensors, seen = [], set()
        for name, t in sd.items():  # ... then list each tensor once (tied ones share one entry)
            key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape))
            if key not in seen:
                seen.add(key)
                tensors.append(
                    {
                        "name": name,
                        "dtype": str(t.dtype).removeprefix("torch."),
                        "shape": list(t.shape),
                        "stride": list(t.stride()),
                        "offset": t.storage_offset(),
                        "storage": exports[key[0]],
                    }
                )
        self.seq = torch.zeros(1, dtype=torch.int64, device=next(iter(sd.values())).device)
        self.layout = Path(layout_path)
        atomic_write_bytes(
            self.layout, json.dumps({"owner": os.getpid(), "seq_storage": export_storage(self.seq), "tensors": tensors}).encode()
        )

    def begin(self) -> None:
        self.seq += 1
        self._sync()

    def end(self, version: str) -> None:
        self._sync()
        self.version = version
        self.seq += 1
        self._sync()

    def _sync(self) -> None:
        if self.seq.is_cuda:
            import torch

            torch.cuda.synchronize(self.seq.device)

    def ref(self) -> dict:
        """What a replica needs to copy the current version (a `SharedRef`: plain data)."""
        seq = int(self.seq.item())
        if seq % 2:
            raise SharedChanged("the shared weights are being written")
        return {"version": self.version, "seq": seq, "layout": str(self.layout), "owner": os.getpid()}


_LAYOUTS: dict[tuple[str, int], dict] = {}
_OPENED: tuple[tuple, dict] = ((), {})  # the producer (layout, owner pid) and its storages mapped here, opened once


def _layout(path: str) -> dict:
    """A layout file, read once per version of it (it is written once per producer process)."""
    key = (path, Path(path).stat().st_mtime_ns)
    if key not in _LAYOUTS:
        _LAYOUTS.clear()
        _LAYOUTS[key] = json.loads(Path(path).read_text())
    return _LAYOUTS[key]


class SharedReader:
    """The reader's side of one `SharedRef`: `tensors()` yields (name, tensor) views of the producer's memory;
    `check()` raises `SharedChanged` when the producer has written since the ref was made. Check once before
    and once after copying the views into your own weights."""

    def __init__(self, ref: dict):
        import torch

        self.ref, self.layout = ref, _layout(ref["layout"])
        if self.layout["owner"] != ref.get("owner"):
            raise SharedChanged(f"the shared weights of {ref['version']} belonged to a process that has ended")
        global _OPENED
        if _OPENED[0] != (ref["layout"], ref.get("owner")):  # mappings are kept while their producer lives
            _OPENED = ((ref["layout"], ref.get("owner")), {})
        self._storages = _OPENED[1]
        self._seq = _view(self._open(self.layout["seq_storage"]), torch.int64, [1], [1], 0)

    def _open(self, d: dict):
        key = (d["handle"], d.get("offset", 0))  # one CUDA block holds many storages
        if key not in self._storages:
            self._storages[key] = open_storage(d)
        return self._storages[key]

    def check(self) -> None:
        seq = int(self._seq.item())
        if seq != self.ref["seq"]:
            raise SharedChanged(
                f"shared weights of {self.ref['version']} were rewritten (seq {self.ref['seq']} -> {seq}): load the file"
            )

    def tensors(self) -> Iterator[tuple[str, object]]:
        import torch

        for t in self.layout["tensors"]:
            yield t["name"], _view(self._open(t["storage"]), getattr(torch, t["dtype"]), t["shape"], t["stride"], t["offset"])


def read_shared(ref: dict, sink):
    """Copy a `SharedRef`'s tensors with `sink(iterator of (name, tensor))`, checked by the seqlock both sides;
    returns what `sink` returned. Raises `SharedChanged` (then the copy may be partial: reload from the file)."""
    r = SharedReader(ref)
    r.check()
    out = sink(r.tensors())
    r.check()
    return out
