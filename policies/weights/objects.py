"""Weights versions in the bus's JetStream object store (`weights.store: nats`): a node needs no shared disk.

- `upload` (the learner, from `WeightsStore.save`, before the manifest is written and the version published): the
  file goes into the bucket `<stream>_weights` under its version name, with its manifest (sha256, parent, step, and
  the file's size and mtime) as the object's description. The object store records its own SHA-256 digest.
- `fetch` (a follower whose state dir lacks the version): once per node, under a file lock in that state dir (two
  replicas on one node fetch once: the second finds the file). The chunks stream into a temp file, nats-py checking
  the object store's digest at the end; then our sha256, against the manifest's and the one the pointer names, once;
  then the file gets the origin's mtime (as `cp -p` keeps it), so the size and mtime the pointer pins match on every
  node and a swap costs a stat, as on one host; then it is renamed into place beside its manifest. A mismatch is
  refused with a logged error and the temp file removed: nothing unverified is loaded. Versions this node fetched
  earlier that are gone from the bucket (pruned) are removed from the node then.
- `delete` (the broadcaster's prune).
These are blocking calls made from worker threads (the learner's save, a replica's swap): they hand the transfer to
the event loop that owns the NATS connection and wait for it. `delete`, which the broadcaster calls on its loop, runs
in the background there instead.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import time
from pathlib import Path

from nats.js import api
from nats.js.errors import DigestMismatchError, NotFoundError, ObjectNotFoundError

from policies.device_lock import file_lock
from policies.weights.live_board import open_bucket
from policies.weights.model_store import WeightsStore, atomic_write_bytes, file_stat, fsync_dir, sha256_file


class ObjectWeights:
    def __init__(self, settings, store: WeightsStore, log=None):
        self.bucket = f"{settings.nats.stream}_weights"
        self.replicas = settings.nats.replicas
        self.timeout = settings.weights.transfer_timeout_s
        self.store, self.log = store, log
        self.obs = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()

    async def open(self, js) -> "ObjectWeights":
        self.obs = await open_bucket(
            lambda: js.object_store(self.bucket),
            lambda: js.create_object_store(
                self.bucket,
                replicas=self.replicas,
                storage=api.StorageType.FILE,
                description="Kaizen: weights versions (safetensors), named by version",
            ),
        )
        self.loop = asyncio.get_running_loop()
        return self

    def _on_loop_thread(self) -> bool:
        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def _wait(self, coro):
        """Run `coro` on the connection's loop and wait for it (from a worker thread)."""
        if self._on_loop_thread():
            coro.close()
            raise RuntimeError("a weights transfer would block the event loop it needs: call it from a worker thread")
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()  # the transfer stops too, its temp file is removed by the caller
            raise

    # ------------------------------------------------------------------ the learner's side
    def upload(self, version: str, path: Path, manifest: dict) -> None:
        meta = {**{k: v for k, v in manifest.items() if k != "path"}, "stat": file_stat(path)}
        self._wait(self._put(version, Path(path), meta))
        if self.log:
            self.log.info("weights.uploaded", version=version, bucket=self.bucket, bytes=meta["stat"][0])

    async def _put(self, version: str, path: Path, meta: dict) -> None:
        with open(path, "rb") as f:
            await self.obs.put(version, f, meta=api.ObjectMeta(name=version, description=json.dumps(meta)))

    # ------------------------------------------------------------------ a follower's side
    def fetch(self, version: str, sha256: str | None = None) -> Path | None:
        """This node's file of `version`, fetched from the object store when the state dir lacks it; None when it is
        not there or does not verify."""
        dest = self.store.path(version)
        with file_lock(self.store.dir / f".{version}.fetch.lock"):
            if dest.exists() and self.store.manifest(version):
                return dest  # another process on this node fetched it meanwhile
            tmp = dest.with_name(f".{dest.name}.{os.getpid()}.fetch")
            try:
                t0 = time.monotonic()
                meta = self._wait(self._get(version, tmp))
                if meta is None or not self._matches(version, tmp, meta, sha256):
                    return None
                self._install(version, tmp, dest, meta)
            finally:
                tmp.unlink(missing_ok=True)
        self._drop_pruned(keep=version)
        if self.log:
            self.log.info("weights.fetched", version=version, bytes=dest.stat().st_size, seconds=round(time.monotonic() - t0, 2))
        return dest

    async def _get(self, version: str, tmp: Path) -> dict | None:
        try:
            info = await self.obs.get_info(version)
            with open(tmp, "wb") as f:
                await self.obs.get(version, writeinto=f)
        except ObjectNotFoundError:
            if self.log:
                self.log.error("weights.not_in_object_store", version=version, bucket=self.bucket)
            return None
        except DigestMismatchError:
            if self.log:
                self.log.error("weights.digest_mismatch", version=version, check="object store SHA-256")
            return None
        return json.loads(info.description or "{}")

    def _matches(self, version: str, tmp: Path, meta: dict, sha256: str | None) -> bool:
        """Our sha256 of the fetched bytes against the manifest's and the pointer's (both, where both are known)."""
        want = {d for d in (meta.get("sha256"), sha256) if d}
        got = sha256_file(tmp)
        if want == {got}:
            return True
        if self.log:
            self.log.error("weights.digest_mismatch", version=version, check="sha256", expected=sorted(want), got=got)
        return False

    def _install(self, version: str, tmp: Path, dest: Path, meta: dict) -> None:
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        if stat := meta.get("stat"):
            os.utime(tmp, ns=(stat[1], stat[1]))
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
        self.store.mark_verified(dest)  # verified just now: a stat from here on
        manifest = {**{k: v for k, v in meta.items() if k != "stat"}, "path": str(dest), "fetched": time.time()}
        atomic_write_bytes(self.store.dir / f"{version}.json", json.dumps(manifest).encode())

    def _drop_pruned(self, keep: str) -> None:
        """Versions this node fetched that the broadcaster has pruned since (gone from the bucket) go from here too,
        so a follower's disk holds no more versions than the bucket does."""
        try:
            held = set(self._wait(self.names()))
        except Exception as exc:  # the next fetch tries again
            if self.log:
                self.log.warning("weights.bucket_unlisted", error=repr(exc)[:200])
            return
        for path in self.store.dir.glob("w-*.json"):
            man = json.loads(path.read_text())
            v = man.get("version", path.stem)
            if man.get("fetched") and v != keep and v not in held:
                self.store.remove(v)
                if self.log:
                    self.log.info("weights.dropped_pruned", version=v)

    # ------------------------------------------------------------------ the broadcaster's side
    def delete(self, versions: list[str]) -> None:
        coro = self._delete(list(versions))
        if self._on_loop_thread():
            task = self.loop.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._wait(coro)

    async def _delete(self, versions: list[str]) -> None:
        for v in versions:
            try:
                await self.obs.delete(v)
            except ObjectNotFoundError:
                pass
            except Exception as exc:  # a version left in the bucket is only space: the next prune does not retry it
                if self.log:
                    self.log.warning("weights.delete_failed", version=v, error=repr(exc)[:200])

    async def settle(self) -> None:
        """Wait for deletes running in the background."""
        await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def names(self) -> list[str]:
        """The versions in the bucket."""
        try:
            return sorted(i.name for i in await self.obs.list(ignore_deletes=True))
        except NotFoundError:  # an empty bucket
            return []
