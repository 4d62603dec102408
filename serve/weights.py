"""The replica's weights: the engines it holds, which one answers a request, and following the LIVE pointer.

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
A version the pointer shares (`LivePointer.shared`: the gate engine's weights in memory, CUDA IPC on a GPU)
is copied from there, with the file as fallback (`serve.weights_transport`). A file that is not the one the
broadcaster verified (sha256 once, at staging; the pointer pins its size
and mtime, so a swap costs a stat, not a re-hash) is never loaded.

A file the pointer pins another stat for, whose sha256 this node checked (`LivePolicy.file`: the base model
converted on this node), is accepted by the stat it had then (`pinned`).

`ReplicaWeights` follows the pointer for a replica: on start (before traffic, from this node's copy), then on each
value of the pointer's key in the bus's key-value bucket (`LiveBoard.watch`: the broadcaster's every move, a pointer
repaired on its start included), and reports what it serves (`evo.weights_swapped`). With weights in the bus's object
store (`weights.store: nats`) it also fetches each version the learner publishes (`evo.weights_published`) while the
gate scores it, so that the swap to it later finds the file on this node: a load, not a download (`prefetch`).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from pathlib import Path
from typing import Callable

from actors.events import WeightsPublished, WeightsSwapped, parse_event, subject_for
from actors.lifecycles import CanaryRef, LivePointer
from policies.weights.model_store import file_stat, sha256_file


class EngineSet:
    def __init__(
        self,
        live,
        make_canary,
        file: Callable[[str, str | None], Path | None],
        log=None,
        pinned: Callable[[Path], list[int] | None] = lambda path: None,
    ):
        """`file(version, path)` resolves a pointer's weights file (`LivePolicy.file`); `pinned(path)` is the stat
        this node found the file's sha256 matching at (`WeightsStore.pinned`)."""
        self.live, self.canary, self.spare = live, None, None
        self.share = 0.0
        self._make_canary, self.file, self.log, self.pinned = make_canary, file, log, pinned
        self.via = ""  # how the last load arrived ("shared", "file", "file (why shared failed)")

    def _verified(self, ref: LivePointer | CanaryRef) -> Path | None:
        """The file, when it is the one the broadcaster verified: its pinned size and mtime (a stat), or, for a
        pointer without them, its sha256."""
        path = self.file(ref.version, ref.path)
        if path is None or not Path(path).exists():
            ok = False
        elif ref.stat:
            ok = file_stat(path) in (list(ref.stat), self.pinned(path))
        else:
            ok = not ref.sha256 or sha256_file(path) == ref.sha256
        if not ok:
            if self.log:
                self.log.error("swap.sha_mismatch", version=ref.version, path=str(path))
            return None
        return Path(path)

    def sync(self, pointer: LivePointer) -> list[str]:
        """Match the LIVE pointer; returns what changed (blocking: run it in a worker thread)."""
        changed, self.via = [], ""
        if pointer.version != self.live.version:
            if self.canary is not None and self.canary.version == pointer.version and type(self.canary) is type(self.live):
                self.live, self.spare, self.canary = self.canary, self.live, None
                changed.append("promoted")
            elif path := self._verified(pointer):
                self._load(self.live, path, pointer.version, pointer)
                changed.append("live")
        want = pointer.canary
        if want is None and self.canary is not None:
            self.spare, self.canary = self.canary, None
            changed.append("canary_ended")
        elif want is not None and (self.canary is None or self.canary.version != want.version) and (path := self._verified(want)):
            eng = self.canary or self.spare or self._make_canary()
            self._load(eng, path, want.version, pointer)
            self.canary, self.spare = eng, None
            changed.append("canary")
        self.share = float(want.share) if want and self.canary is not None else 0.0
        return changed

    def _load(self, engine, path: Path, version: str, pointer: LivePointer) -> None:
        """From the gate engine's memory when the pointer shares this version (the engine falls back to the file
        itself), else from the file."""
        if shared := pointer.shared_for(version):
            engine.load_weights(path, version, shared=shared)
            self.via = getattr(engine, "last_load", "shared?")
        else:
            engine.load_weights(path, version)
            self.via = "file"

    def pick(self, interaction_id: str):
        """The engine that answers this request."""
        canary, share = self.canary, self.share
        if canary is None or share <= 0:
            return self.live
        bucket = int(hashlib.sha256(interaction_id.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
        return canary if bucket < share else self.live


class ReplicaWeights:
    """A replica's follower of the live policy: its `LivePolicy`'s engine serves live, a second one the canary."""

    def __init__(self, policy, replica: str, prefix: str, report: Callable, log):
        self.policy, self.replica, self.prefix, self._report, self.log = policy, replica, prefix, report, log
        self.engines = EngineSet(policy.engine, lambda: policy.make_engine("canary"), policy.file, log, policy.store.pinned)
        self.swaps: list[float] = []
        self._lock = asyncio.Lock()
        self.engines.sync(policy.pointer())  # the live version (and canary) before taking traffic

    @property
    def engine(self):
        return self.engines.live

    @property
    def canary_version(self) -> str | None:
        return self.engines.canary.version if self.engines.canary else None

    async def watch(self, nc) -> None:
        """Follow the pointer: bind its bucket on the bus, then sync on each value of its key (the current one
        first, so a move made while this replica started is not missed). Ends only with the connection."""
        await self.policy.attach(nc.jetstream(), follow=False)
        await self.report(0.0, "joined")
        if self.policy.objects is not None:
            await nc.subscribe(subject_for("weights_published", self.prefix), cb=self.prefetch)
        await self.policy.watch(lambda _ptr: self.sync())

    async def prefetch(self, msg) -> None:
        """Fetch a published version to this node now (best effort: one missed here is fetched at its swap). The
        object store's digest and our sha256 are checked as at a swap; a node that has the file fetches nothing."""
        try:
            ev = parse_event(msg.data)
            if isinstance(ev, WeightsPublished):
                ref = ev.weights
                await asyncio.to_thread(self.policy.file, ref.version, ref.path, ref.sha256)
        except Exception as exc:  # a poison event or a failed fetch: the swap fetches (and reports) again
            self.log.warning("weights.prefetch_failed", error=repr(exc)[:200])

    async def sync(self) -> None:
        async with self._lock:
            t0 = time.perf_counter()
            changed = await asyncio.to_thread(self.engines.sync, self.policy.pointer())
            if changed:
                total_ms = (time.perf_counter() - t0) * 1000
                self.swaps.append(total_ms)
                canary = self.engines.canary
                via = self.engines.via
                self.log.info(
                    "swap.done",
                    version=self.engine.version,
                    canary=canary and canary.version,
                    changed=changed,
                    total_ms=round(total_ms, 1),
                    via=via,
                )
                await self.report(total_ms, ",".join(changed) + (f" via {via}" if via else ""))

    async def report(self, swap_ms: float, reason: str) -> None:
        canary = self.engines.canary
        ev = WeightsSwapped(
            replica=self.replica,
            version=self.engine.version,
            swap_ms=swap_ms,
            canary=canary.version if canary else None,
            reason=reason,
            producer=f"serve:{self.replica}",
        )
        ev.weights_version = self.engine.version
        await self._report(ev)
