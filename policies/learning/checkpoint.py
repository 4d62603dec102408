"""Learner checkpoints: atomic, verified, resumable.

A checkpoint is a file `ckpt-NNNNNN.pt` (model, optimizer, step state) and a manifest
`checkpoint.json` {step, version, file, sha256, bytes, created}. Saving writes the file to a
temp name, fsyncs it, renames it, fsyncs the directory, hashes it, then moves the old manifest to
`checkpoint.prev.json` and writes the new one atomically: the manifest is the commit point. A
crash at any instant therefore leaves at least one complete checkpoint whose manifest verifies;
loading checks the sha256 and falls back to the previous checkpoint when the newest one does not
verify. Files no manifest names (a save cut off before its manifest) are removed on the next save.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from policies.weights.model_store import atomic_write_bytes, fsync_dir, sha256_file

MANIFEST, PREVIOUS = "checkpoint.json", "checkpoint.prev.json"
APPLIED_STEPS = 64  # steps whose judgement ids a checkpoint keeps


def applied_ids(applied: dict[str, int] | list[str], step: int, ids=()) -> dict[str, int]:
    """Judgement id -> the checkpointed step that trained it, `ids` added at `step`, for the last `APPLIED_STEPS` steps
    only: a judgement is acked once its step is published (and the actor's applied ids keep it from then on), so only a
    step cut off between its checkpoint and its acks is ever redelivered. A list (older checkpoints) reads as `step`'s."""
    kept = applied if isinstance(applied, dict) else dict.fromkeys(applied, step)
    return {i: s for i, s in {**kept, **dict.fromkeys(ids, step)}.items() if s > step - APPLIED_STEPS}


class CheckpointStore:
    def __init__(self, directory: Path):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)

    def manifests(self) -> list[dict]:
        """Readable manifests, newest first."""
        out = []
        for name in (MANIFEST, PREVIOUS):
            try:
                out.append(json.loads((self.dir / name).read_text()))
            except (OSError, ValueError):
                continue
        return out

    def save(self, state: dict, step: int, version: str) -> dict:
        import torch

        final = self.dir / f"ckpt-{step:06d}.pt"
        tmp = self.dir / f".ckpt-{step:06d}.pt.tmp"
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(self.dir)
        man = {
            "step": step,
            "version": version,
            "file": final.name,
            "sha256": sha256_file(final),
            "bytes": final.stat().st_size,
            "created": time.time(),
        }
        current = self.dir / MANIFEST
        if current.exists():
            os.replace(current, self.dir / PREVIOUS)
        atomic_write_bytes(current, json.dumps(man).encode())
        self._prune()
        return man

    def _prune(self) -> None:
        named = {m["file"] for m in self.manifests()}
        for p in self.dir.glob("ckpt-*.pt"):
            if p.name not in named:
                p.unlink(missing_ok=True)
        for p in self.dir.glob(".ckpt-*.tmp"):
            p.unlink(missing_ok=True)

    def load(self, map_location="cpu") -> tuple[dict, dict, list[str]] | None:
        """(state, manifest, reasons newer checkpoints were skipped) of the newest checkpoint that verifies."""
        import torch

        skipped = []
        for man in self.manifests():
            path = self.dir / man["file"]
            if not path.exists():
                skipped.append(f"{man['file']}: missing")
                continue
            if sha256_file(path) != man["sha256"]:
                skipped.append(f"{man['file']}: sha256 does not match its manifest")
                continue
            return torch.load(path, map_location=map_location, weights_only=False), man, skipped
        return None
