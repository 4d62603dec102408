"""Never worse than the base, checked: served versions scored against the base model in the background, and
rolled back when significantly below it.

The gate compares a candidate with the version it replaces on a few entries, so it cannot see a loss built up
over many small steps; the canary needs ratings that unrated traffic does not give. A thread of the broadcaster,
with an engine of its own at OS niceness `guard.nice` (5, the gate's: users first), scores the newest served
version (the canary, else live) that has no check yet on a fixed held-out suite (`guard_suite`: up to
`guard.per_category` held-out entries of each named category, categories interleaved; avg@k at the rollout
temperature), entry by entry against the base. Scores go into `<state>/evals/heldout.json`, beside
`main.py report`'s.

The base is sampled `guard.base_k` (8) times an entry, once; a version `guard.k` (4) times: the 135M solves ~4%
of the suite, and only a well-known base rate gives a test power there. The test is the stratified exact one
(`policies/stats.fewer_successes`). The check is sequential with a futility stop only: once `guard.early_fraction`
of the suite is scored and the version has succeeded at least as often as the base there (and at all), it is
`not_below`; otherwise the whole suite decides, `below` at p < `guard.alpha` with a lower rate. A futility stop
never makes a false alarm more likely; it halves a healthy version's check. After a check of d seconds the guard offers
nothing for d * (1/`guard.duty` - 1) (`rest_s`; duty 1, the default: no wait), so that its share of a small host is
bounded; not while serving is held, when a check is what releases it. These decisions are pure functions in
`policies/promotion/guard_decisions.py`; this module is the thread that makes the checks.

A version below the base rolls back (`rollback_plan`) with every served version descending from it, to the newest
live version checked no worse, else the base, and holds serving (`PromotionBook.hold`): the guard checks the
newest candidate instead, and nothing new reaches users until one is no worse. Every check is an
`evo.heldout_scored` event; every rollback an `evo.weights_rolled_back` whose reason gives the figures.
"""

from __future__ import annotations

import os
import queue
import threading
import time

from policies.promotion.guard_decisions import Check, guard_suite, look, rest_s, rollback_plan
from policies.weights.model_store import BASE_VERSION


# ---------------------------------------------------------------------------- the background scorer
class Guard:
    """The broadcaster's background scorer: `offer(version)` when idle, `results()` each tick."""

    def __init__(self, settings, base_path, store, envs):
        from envs.registry import make_env
        from policies.evaluation.heldout import HeldoutCache

        g, r = settings.guard, settings.rollout
        envs = {**envs, **{n: make_env(n, settings.env) for n in g.suite if n not in envs}}  # e.g. bfcl_single
        self.s, self.g, self.base_path, self.store, self.envs = settings, g, base_path, store, envs
        self.suite = guard_suite(envs, g)
        caches = {
            k: HeldoutCache(
                settings.state / "evals" / "heldout.json",
                self.suite,
                k=k,
                temperature=r.temperature,
                max_new_tokens=r.max_new_tokens,
                call_prefix=r.call_prefix,
            )
            for k in {g.k, g.base_k}
        }
        self.cache, self.base_cache = caches[g.k], caches[g.base_k]
        self.opts = {"max_new_tokens": r.max_new_tokens, "temperature": r.temperature, "call_prefix": r.call_prefix}
        self._todo: queue.Queue = queue.Queue(maxsize=1)
        self._done: queue.Queue = queue.Queue()
        self.current: Check | None = None
        self.pending: list[Check] = []  # finished checks whose verdict the broadcaster has not carried out yet
        self.offered: set[str] = set()  # in memory only: after a restart a version still served is offered again
        self._busy = True  # until the base is scored
        self.rest_until = 0.0  # time.monotonic() before which nothing is offered (`guard.duty`), unless serving is held
        self.engine = None
        self.error = ""
        threading.Thread(target=self._loop, name="guard", daemon=True).start()

    @property
    def idle(self) -> bool:
        return not self._busy and self._todo.empty()

    def offer(self, version: str) -> bool:
        try:
            self._todo.put_nowait(version)
            return True
        except queue.Full:
            return False

    def undo(self, c: Check, book, live: str, rollback: bool) -> list[tuple[str, str, str | None, str]]:
        """What a finished check undoes (`rollback_plan`), when it is below the base and rollbacks are on."""
        if c.verdict != "below" or not rollback:
            return []
        checks = {**book.checks, c.version: c.verdict}
        return rollback_plan(
            c.version,
            f"below the base on held-out {c.summary()}",
            live,
            book.canary and book.canary.version,
            book.passed and book.passed.version,
            book.history,
            checks,
            book.descends,
        )

    def done(self, c: Check, book, hold: bool = True) -> None:
        """The broadcaster carried out what `c` undoes: record its verdict (a failure before this retries it). With
        `hold` (rollbacks on), a version below the base holds serving: nothing new goes to users until a candidate
        is checked no worse, which releases it."""
        book.checks[c.version] = c.verdict
        if hold:
            book.hold = c.version if c.verdict == "below" else None
        self.pending = [x for x in self.pending if x is not c]

    def offer_newest(self, book, live: str, staged: list[str]) -> None:
        """When idle and rested, take the newest served version (the canary, else live) that has no check yet; while
        serving is held, the newest candidate instead (the one that would be served next), rested or not."""
        if not self.idle or (not book.hold and time.monotonic() < self.rest_until):  # idle first: then the rest is set
            return
        nxt = (staged or [None])[-1] if book.hold else book.canary.version if book.canary else live
        if nxt not in (None, BASE_VERSION) and nxt not in book.checks and nxt not in self.offered:
            self.offered.add(nxt)  # a check that fails is not offered again (until a restart)
            self.offer(nxt)

    def results(self) -> list[Check]:
        """Finished checks not yet carried out, oldest first (a check stays here until `done`)."""
        while True:
            try:
                self.pending.append(self._done.get_nowait())
            except queue.Empty:
                return list(self.pending)

    # -------------------------------------------------------------- the thread
    def _loop(self) -> None:
        try:  # niceness is per thread on Linux: only this thread yields to everything else
            tid = threading.get_native_id()
            os.setpriority(os.PRIO_PROCESS, tid, max(self.g.nice, os.getpriority(os.PRIO_PROCESS, tid)))
        except (OSError, AttributeError):
            pass
        version = BASE_VERSION  # the base first, so that the first served version's check waits for itself only
        while True:
            t0, busy = time.monotonic(), None
            try:
                if version == BASE_VERSION:
                    self._base()
                else:
                    checks = self.check(version)
                    busy = sum(c.duration_s for c in checks)  # the checks alone, not a base scored again
                    for c in checks:
                        self._done.put(c)
            except Exception as exc:  # a missing file, a broken engine: in health(), never fatal
                self.error = f"{version}: {type(exc).__name__}: {str(exc)[:200]}"
            finally:
                self.rested(version, time.monotonic() - t0 if busy is None else busy)
                self.current, self._busy = None, False
            version = self._todo.get()
            self._busy = True

    def rested(self, version: str, busy_s: float) -> None:
        """After a check of `version` that took `busy_s`: the next one waits `rest_s` (the base's scoring: none)."""
        if version != BASE_VERSION:
            self.rest_until = time.monotonic() + rest_s(busy_s, self.g.duty)

    def _scores(self, version: str, env: str, entries: list[str], chunk_no: int, k: int | None = None) -> list[float]:
        import torch

        from policies.rollout import evaluate

        k = k or self.g.k
        torch.manual_seed(chunk_no)
        res = evaluate(self.engine, self.envs[env], entries, k=k, batch=self.g.batch, **self.opts)
        return [sum(res["entries"][e]) / k for e in entries]

    def _chunks(self, entries: list[str]):
        n = max(1, self.g.chunk_entries)
        for i in range(0, len(entries), n):
            yield i // n, entries[i : i + n]

    def _load(self, version: str) -> None:
        from policies.engines.roles import make_engine

        if self.engine is None:
            self.engine = make_engine(self.s, self.base_path, role="eval")
        path = self.store.file(version, self.base_path)
        if path is None or not path.exists():
            raise FileNotFoundError(f"no weights file for {version}")
        self.engine.load_weights(path, version)

    def _base(self) -> dict[str, list[float]]:
        if (got := self.base_cache.get(BASE_VERSION)) is None:
            self._load(BASE_VERSION)
            got = self.base_cache.put(
                BASE_VERSION,
                self.envs,
                {
                    env: [x for no, ids in self._chunks(entries) for x in self._scores(BASE_VERSION, env, ids, no, self.g.base_k)]
                    for env, entries in self.suite.items()
                },
            )
        return {env: got[env]["per_entry"] for env in self.suite}

    def check(self, version: str) -> list[Check]:
        """One check per environment of the suite (in practice one: code)."""
        base = self._base()
        if self.cache.get(version) is None:
            self._load(version)
        out, full = [], {}
        for env, entries in self.suite.items():
            t0 = time.monotonic()
            c = self.current = Check(version, env, [], [], len(entries), self.g.k, self.g.base_k)
            if cached := self.cache.get(version):  # scored in full before (a restart, or `main.py report`)
                c.per_entry, c.base = list(cached[env]["per_entry"]), base[env]
                c.verdict = look(c, self.g.early_fraction, self.g.alpha)
            for no, ids in self._chunks(entries):
                if c.verdict:
                    break
                c.per_entry += self._scores(version, env, ids, no)
                c.base = base[env][: len(c.per_entry)]
                c.verdict = look(c, self.g.early_fraction, self.g.alpha)
            c.duration_s = time.monotonic() - t0
            if c.complete:
                full[env] = c.per_entry
            out.append(c)
        if len(full) == len(self.suite):
            self.cache.put(version, self.envs, full)
        return out

    def health(self) -> dict:
        c = self.current
        base = self.base_cache.get(BASE_VERSION)
        return {
            "checking": c and c.version,
            "checked_entries": c and len(c.per_entry),
            "busy": self._busy,
            "resting_s": round(max(0.0, self.rest_until - time.monotonic()), 1),
            "base": {e: round(x["avg"], 4) for e, x in base.items()} if base else None,
            "error": self.error,
        }
