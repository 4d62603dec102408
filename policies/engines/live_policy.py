"""The one follower of the live policy, used by serve and by every actor that needs weights.

`LivePolicy` builds the engine from the base model and keeps it on the version it should generate
with: the live one (the LIVE pointer), or, for an actor that samples with the learner's newest
published version (`aim`), that one until the broadcaster rejects or rolls back a version it
descends from (`drop_branch`). It also knows which versions descend from which (`descends_from`),
so the explorer and the learner share one answer to "is this on a bad branch?".

The LIVE pointer is the broadcaster's projection of its decisions on the stream (`announce`, right before the
event that announces it): a key in a JetStream key-value bucket that followers watch (`attach`;
policies/weights/live_board.py), and on every node a copy in its state dir, so that a replica that starts, or follows,
while the bus is down still serves the version users were given (DESIGN.md "What is live").

The pointer names versions; each node resolves a version to its own file (`file`): the base model's own weights,
the path named where this node has it, its state dir's copy, or (`weights.store: nats`) the copy fetched once from
the bus's object store (policies/weights/objects.py). A file whose size and mtime are not the ones the pointer pins
(the base model converted on another node) has its sha256 checked once here before a swap may use it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import nats.errors

from actors.events import WeightsRef
from actors.lifecycles import CanaryRef, LivePointer
from policies.weights.model_store import BASE_VERSION, WeightsStore, ensure_base_model, file_stat


class LivePolicy:
    def __init__(self, settings, role: str | None = None, *, engine=None, base: Path | None = None, log=None):
        """`role` names the engine to build ("serve", "explorer", "judge", ...); None builds none (the learner
        trains its own copy, and uses the store, the base and the lineage from here). A test may hand in
        the engine and the base model folder."""
        self.settings = settings
        self.store = WeightsStore(settings.state)
        self.base = (
            Path(base)
            if base is not None
            else ensure_base_model(settings.state, settings.model.source, settings.model.path, progress=False)
        )
        self.engine = engine if engine is not None else self.make_engine(role) if role else None
        if role == "gate" and settings.serve.weights_transport == "shared" and hasattr(self.engine, "share"):
            # the gate engine holds each candidate it scored: replicas copy it from there
            self.engine.share(self.store.dir / "shared-layout.json")
        self.target: WeightsRef | None = None  # the newest published version to sample with; None = live
        self.log = log
        self.board = None  # the pointer's bucket on the bus, once attached (policies/weights/live_board.py)
        self.objects = None  # the versions' object store (weights.store: nats)
        self._following: asyncio.Task | None = None
        self.seen: LivePointer | None = None  # the newest value of the key this follower saw (`watch`)

    async def attach(self, js, writer: bool = False, follow: bool = True) -> None:
        """Bind the pointer's bucket (and the object store of versions with `weights.store: nats`). The writer
        (the broadcaster) puts its pointer there when the bucket holds another one (a pointer repaired on its
        start); a follower follows the key from now on (`follow`; serve drives `watch` itself)."""
        from policies.weights.live_board import LiveBoard

        self.board = await LiveBoard(self.settings, self.store, self.log).open(js)
        if self.settings.weights.store == "nats":
            from policies.weights.objects import ObjectWeights

            self.objects = await ObjectWeights(self.settings, self.store, self.log).open(js)
            self.store.remote = self.objects
        if writer:
            if (ptr := self.pointer()) != await self.board.get():
                await self.board.put(ptr)
        elif follow and self._following is None:
            self._following = asyncio.create_task(self.watch())

    async def watch(self, then=None) -> None:
        """Follow the key until cancelled: each value is what `pointer()` answers from then on (and this node's copy,
        unless the copy is newer by the writer's clock), then `then(pointer)` runs."""

        async def saw(ptr: LivePointer) -> None:
            self.seen = ptr
            if then is not None:
                await then(ptr)

        await self.board.watch(saw)

    def make_engine(self, role: str):
        from policies.engines.roles import make_engine

        return make_engine(self.settings, self.base, role=role)

    # ------------------------------------------------------------------ reading what is live
    def pointer(self) -> LivePointer:
        """The last value a follower saw on the bus; before that (or never attached), this node's copy."""
        return self.seen or self.store.live()

    async def current(self) -> LivePointer:
        """The pointer as the bus holds it now: what an event handler reads, since the broadcaster puts the pointer
        before it publishes the event (the watch may not have delivered it yet). `pointer()` when not attached or
        when the bus does not answer."""
        if self.board is not None:
            try:
                if (ptr := await self.board.get()) is not None:
                    return ptr
            except (nats.errors.Error, asyncio.TimeoutError) as exc:
                if self.log:
                    self.log.warning("live.pointer_unread", error=repr(exc)[:200])
        return self.pointer()

    @property
    def live_version(self) -> str:
        return self.pointer().version

    def file(self, version: str, path: str | None = None, sha256: str | None = None) -> Path | None:
        """This node's weights file of `version` (see the module docstring); None when it has none. Blocking when
        it fetches: call it from a worker thread."""
        if path and Path(path).exists():
            found = Path(path)
        elif version == BASE_VERSION:
            found = self.store.file(version, self.base)
        elif self.store.path(version).exists():
            found = self.store.path(version)
        elif self.objects is not None:
            found = self.objects.fetch(version, sha256 or getattr(self._named(version), "sha256", None))
        else:
            return Path(path) if path else self.store.file(version, self.base)
        self._check_here(version, found)
        return found

    def _named(self, version: str):
        """The pointer's reference to `version` (live or canary), if it names it."""
        ptr = self.pointer()
        return next((r for r in (ptr, ptr.canary) if r is not None and r.version == version), None)

    def _check_here(self, version: str, path: Path | None) -> None:
        """A file the pointer pins another size or mtime for (not the broadcaster node's file): its sha256 once, so
        that `EngineSet` can accept it by the stat this node verified (`WeightsStore.pinned`)."""
        ref = self._named(version)
        if ref is None or not ref.stat or not ref.sha256 or path is None or not path.exists():
            return
        if file_stat(path) not in (list(ref.stat), self.store.pinned(path)):
            self.store.verify(path, ref.sha256)

    def descends_from(self, version: str, ancestor: str) -> bool:
        return ancestor in self.store.ancestors(version, 1000)

    # ------------------------------------------------------------------ following it
    def sync(self) -> str:
        """Load the live version into the engine if it holds another one; returns the version it holds.
        Blocking (seconds): call it in a worker thread from async code."""
        self.target = None
        live = self.pointer()
        if live.version != self.engine.version:
            path = self.file(live.version, live.path)
            if path is None:
                raise FileNotFoundError(f"cannot load {live.version}: no weights file (base folder {self.base})")
            shared = live.shared_for(live.version)
            self.engine.load_weights(path, live.version, **({"shared": shared} if shared else {}))
        return self.engine.version

    def _verified(self, path: Path | None, sha256: str) -> bool:
        """sha256 once per file: a file verified by this process before (an earlier target, or fetched), or saved into
        this node's store by a process that hashed it then (the learner: its manifest pins the file's stat), costs a
        stat; a file changed since then is hashed again."""
        if path is None or not path.exists():
            return False
        man = self.store.manifest(path.stem) if path.parent == self.store.dir else None
        saved = man.get("stat") if man and man.get("sha256") == sha256 and man.get("path") == str(path) else None
        if file_stat(path) in (self.store.pinned(path), saved):
            self.store.mark_verified(path)  # the LIVE pointer pins it without hashing it again
            return True
        return self.store.verify(path, sha256)

    def aim(self, ref: WeightsRef) -> None:
        """Sample with this published version from the next `follow` on (until its branch is dropped)."""
        self.target = ref

    def follow(self) -> str:
        """Before a unit of work: load the version to generate with, if it changed. Blocking."""
        t = self.target
        if t is None:
            return self.sync()
        if t.version != self.engine.version:
            here = self.obtain(t)
            if here is None:  # pruned or damaged: back to live
                if self.log:
                    self.log.warning("weights.target_unusable", version=t.version)
                self.target = None
                return self.sync()
            self.engine.load_weights(here.path, t.version)
        return self.engine.version

    def obtain(self, ref: WeightsRef) -> WeightsRef | None:
        """`ref` as this node has it: its file here (fetched from the bus where the node lacks it) with a matching
        sha256, and this node's path; None when there is none. Blocking."""
        path = self.file(ref.version, ref.path, ref.sha256)
        return ref.model_copy(update={"path": str(path)}) if self._verified(path, ref.sha256) else None

    def drop_branch(self, bad: str) -> bool:
        """A rejected or rolled-back version: a target that is or descends from it is dropped for live (the
        learner's next version descends from live). True when the target was dropped."""
        if self.target is not None and self.descends_from(self.target.version, bad):
            self.target = None
            return True
        return False

    # ------------------------------------------------------------------ the broadcaster's side
    async def announce(self, live: WeightsRef, canary: WeightsRef | None = None, share: float = 0.0) -> LivePointer:
        """Put the pointer on the bus, then keep it as this node's copy (the broadcaster only, right before the
        event that announces it). A put that fails raises before anything changed here."""
        ptr = self._make(live, canary, share)
        if self.board is not None:
            await self.board.put(ptr)
        self.store.keep_live(ptr, force=True)
        return ptr

    def publish_live(self, live: WeightsRef, canary: WeightsRef | None = None, share: float = 0.0) -> LivePointer:
        """Write this node's copy of the pointer only (before `attach`: it puts the copy on the bus if it differs)."""
        ptr = self._make(live, canary, share)
        self.store.keep_live(ptr, force=True)
        return ptr

    def _make(self, live: WeightsRef, canary: WeightsRef | None, share: float) -> LivePointer:
        c = CanaryRef(version=canary.version, path=canary.path, sha256=canary.sha256, share=share) if canary else None
        return self.store.make_live(
            live.version,
            live.path or None,
            live.sha256 or None,
            canary=c,
            shared=self.shared_ref({live.version, canary.version if canary else live.version}),
        )

    def shared_ref(self, versions: set[str]) -> dict | None:
        """A `SharedRef` of this engine's weights, when they are shared and hold one of `versions` (the gate
        has just scored the version it promotes, so they usually do; otherwise replicas read the file)."""
        shared = getattr(self.engine, "shared", None)
        if shared is None:
            return None
        from policies.weights.shared import SharedChanged

        try:
            ref = shared.ref()
        except SharedChanged:  # being written: the file it is
            return None
        return ref if ref["version"] in versions else None
