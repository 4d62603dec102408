"""The one follower of the live policy, used by serve and by every actor that needs weights.

`LivePolicy` builds the engine from the base model and keeps it on the version it should generate
with: the live one (the LIVE pointer), or, for an actor that samples with the learner's newest
published version (`aim`), that one until the broadcaster rejects or rolls back a version it
descends from (`drop_branch`). It also knows which versions descend from which (`descends_from`),
so the explorer and the learner share one answer to "is this on a bad branch?".

The LIVE pointer is the broadcaster's projection of its decisions on the stream (`publish_live`, written
right before the event that announces it): a file, so that a replica that starts, or follows, while the
bus is down still serves the version users were given (DESIGN.md "What is live").
"""
from __future__ import annotations

from pathlib import Path

from actors.events import WeightsRef
from actors.lifecycles import CanaryRef, LivePointer
from policies.model_store import WeightsStore, ensure_base_model


class LivePolicy:
    def __init__(self, settings, role: str | None = None, *, engine=None, base: Path | None = None, log=None):
        """`role` names the engine to build ("serve", "explorer", "judge", ...); None builds none (the learner
        trains its own copy, and uses the store, the base and the lineage from here). A test may hand in
        the engine and the base model folder."""
        self.settings = settings
        self.store = WeightsStore(settings.state)
        self.base = Path(base) if base is not None else ensure_base_model(
            settings.state, settings.model.source, settings.model.path, progress=False)
        self.engine = engine if engine is not None else self.make_engine(role) if role else None
        if role == "gate" and settings.serve.weights_transport == "shared" and hasattr(self.engine, "share"):
            # the gate engine holds each candidate it scored: replicas copy it from there
            self.engine.share(self.store.dir / "shared-layout.json")
        self.target: WeightsRef | None = None  # the newest published version to sample with; None = live
        self.log = log

    def make_engine(self, role: str):
        from policies.engine import make_engine

        return make_engine(self.settings, self.base, role=role)

    # ------------------------------------------------------------------ reading what is live
    def pointer(self) -> LivePointer:
        return self.store.live()

    @property
    def live_version(self) -> str:
        return self.pointer().version

    def file(self, version: str, path: str | None = None) -> Path | None:
        """The weights file of `version` (`path` when the pointer names one); the base model's for the base."""
        return Path(path) if path else self.store.file(version, self.base)

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

    def aim(self, ref: WeightsRef) -> None:
        """Sample with this published version from the next `follow` on (until its branch is dropped)."""
        self.target = ref

    def follow(self) -> str:
        """Before a unit of work: load the version to generate with, if it changed. Blocking."""
        t = self.target
        if t is None:
            return self.sync()
        if t.version != self.engine.version:
            if not self.store.verify(t.path, t.sha256):  # pruned or damaged: back to live
                if self.log:
                    self.log.warning("weights.target_unusable", version=t.version)
                self.target = None
                return self.sync()
            self.engine.load_weights(t.path, t.version)
        return self.engine.version

    def drop_branch(self, bad: str) -> bool:
        """A rejected or rolled-back version: a target that is or descends from it is dropped for live (the
        learner's next version descends from live). True when the target was dropped."""
        if self.target is not None and self.descends_from(self.target.version, bad):
            self.target = None
            return True
        return False

    # ------------------------------------------------------------------ the broadcaster's side
    def publish_live(self, live: WeightsRef, canary: WeightsRef | None = None, share: float = 0.0) -> LivePointer:
        """Write the pointer (the broadcaster only, right before the event that announces it)."""
        c = CanaryRef(version=canary.version, path=canary.path, sha256=canary.sha256, share=share) if canary else None
        return self.store.set_live(live.version, live.path or None, live.sha256 or None, canary=c,
                                   shared=self.shared_ref({live.version, canary.version if canary else live.version}))

    def shared_ref(self, versions: set[str]) -> dict | None:
        """A `SharedRef` of this engine's weights, when they are shared and hold one of `versions` (the gate
        has just scored the version it promotes, so they usually do; otherwise replicas read the file)."""
        shared = getattr(self.engine, "shared", None)
        if shared is None:
            return None
        from policies.shared_weights import SharedChanged

        try:
            ref = shared.ref()
        except SharedChanged:  # being written: the file it is
            return None
        return ref if ref["version"] in versions else None
