"""The engines one serving replica holds, and which one answers a request.

`live` serves the live version. While the broadcaster runs a canary, `canary` holds the candidate
and answers `share` of the requests (a hash of the interaction id picks them, so the split is
stable and independent of load). A request keeps the engine it was given from start to end.
`sync(pointer)` makes the set match the LIVE pointer:
- the canary went live      -> the engines swap roles: nothing is loaded, no request waits (when both
                               are the same kind of engine: a GPU replica's canary is a transformers
                               engine beside vLLM, so there the version is loaded into the vLLM one
                               and users stay on vLLM);
- another live version      -> copied into the live engine in place (between requests);
- a canary starts / changes -> loaded into the canary engine (made on first use, then reused);
- the canary ends           -> its engine is set aside for the next canary.
A file that is not the one the broadcaster verified (sha256 once, at staging; the pointer pins its size
and mtime, so a swap costs a stat, not a re-hash) is never loaded.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from policies.model_store import BASE_VERSION, file_stat, sha256_file


class EngineSet:
    def __init__(self, live, make_canary, base_dir: Path, log=None):
        self.live, self.canary, self.spare = live, None, None
        self.share = 0.0
        self._make_canary, self.base_dir, self.log = make_canary, Path(base_dir), log

    def path(self, ref: dict) -> str | None:
        if ref.get("path"):
            return ref["path"]
        return str(self.base_dir / "model.safetensors") if ref["version"] == BASE_VERSION else None

    def _verified(self, ref: dict) -> bool:
        """The file is the one the broadcaster verified: its pinned size and mtime (a stat), or, for a pointer
        without them, its sha256."""
        path = self.path(ref)
        if path is None or not Path(path).exists():
            ok = False
        elif ref.get("stat"):
            ok = file_stat(path) == list(ref["stat"])
        else:
            ok = not ref.get("sha256") or sha256_file(path) == ref["sha256"]
        if not ok:
            if self.log:
                self.log.error("swap.sha_mismatch", version=ref["version"], path=path)
            return False
        return True

    def sync(self, pointer: dict) -> list[str]:
        """Match the LIVE pointer; returns what changed (blocking: run it in a worker thread)."""
        changed = []
        if pointer["version"] != self.live.version:
            if self.canary is not None and self.canary.version == pointer["version"] \
                    and type(self.canary) is type(self.live):
                self.live, self.spare, self.canary = self.canary, self.live, None
                changed.append("promoted")
            elif self._verified(pointer):
                self.live.load_weights(self.path(pointer), pointer["version"])
                changed.append("live")
        want = pointer.get("canary")
        if want is None and self.canary is not None:
            self.spare, self.canary = self.canary, None
            changed.append("canary_ended")
        elif want is not None and (self.canary is None or self.canary.version != want["version"]) \
                and self._verified(want):
            eng = self.canary or self.spare or self._make_canary()
            eng.load_weights(self.path(want), want["version"])
            self.canary, self.spare = eng, None
            changed.append("canary")
        self.share = float(want["share"]) if want and self.canary is not None else 0.0
        return changed

    def pick(self, interaction_id: str):
        """The engine that answers this request."""
        canary, share = self.canary, self.share
        if canary is None or share <= 0:
            return self.live
        bucket = int(hashlib.sha256(interaction_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return canary if bucket < share else self.live
