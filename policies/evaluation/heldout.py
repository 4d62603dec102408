"""A fixed held-out suite and each version's scores on it, cached: what `main.py report`, `status` and the
learning-curve benchmark show, so that every version is compared with the base on the same entries.

The suite is the first `per_category` held-out entries of every category of every environment (a
category of the code env is a rung of its ladder), scored avg@k with sampling (`temperature`), k >= 4
by default. Scores are cached per version in `<state>/evals/heldout.json` under the suite's
fingerprint (entries, k, temperature, token budget, forced call prefix, how a forced call's name is
picked and its answer read): a different suite starts a new cache. The paired comparison with the base
(`policies/stats.py`) uses the same entries. Held-out entries are only ever evaluated, never trained on (tests pin that).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from policies.device_lock import file_lock
from policies.stats import paired_test
from policies.weights.model_store import atomic_write_bytes

# a forced call names one of the declared functions, as Serve picks it, and is scored as Serve sends it (`chat.served_answer`)
NAMES = "declared, as served"


def suite(envs: dict, per_category: int | dict[str, int], categories: dict[str, list[str]] | None = None) -> dict[str, list[str]]:
    """env -> entries: the first `per_category` (an int, or one per environment) held-out entries of every
    category, or only of the categories `categories[env]` names (unknown names are an error)."""
    out = {}
    for name, env in envs.items():
        n = per_category if isinstance(per_category, int) else per_category.get(name, 0)
        by_cat: dict[str, list[str]] = {}
        for e in env.entries("heldout"):
            by_cat.setdefault(env.category_of(e), []).append(e)
        keep = (categories or {}).get(name) or sorted(by_cat)
        if unknown := sorted(set(keep) - set(by_cat)):
            raise ValueError(f"{name} has no held-out category {unknown}; it has {sorted(by_cat)}")
        if n > 0:
            out[name] = [e for cat in sorted(keep) for e in by_cat[cat][:n]]
    return out


class HeldoutCache:
    def __init__(
        self, path: Path, entries: dict[str, list[str]], *, k: int, temperature: float, max_new_tokens: int, call_prefix: bool
    ):
        self.path, self.entries, self.k = Path(path), entries, k
        self.opts = {"temperature": temperature, "max_new_tokens": max_new_tokens, "call_prefix": call_prefix}
        # scores from before a forced call was named and read as Serve does (`run_episodes`) are another suite's
        measure = [entries, k, self.opts, NAMES]
        self.fingerprint = hashlib.sha256(json.dumps(measure, sort_keys=True).encode()).hexdigest()[:16]
        data = json.loads(self.path.read_text()) if self.path.exists() else {}
        self.versions: dict[str, dict] = data.get(self.fingerprint, {})
        self._all = data

    def get(self, version: str) -> dict | None:
        return self.versions.get(version)

    def evaluate(self, engine, envs: dict, version: str, seed: int = 0, progress=None, batch: int = 16) -> dict:
        """Score the version the engine holds now (caller loads it) on the suite; cached. `batch` episodes
        (several entries' k samples) are generated together."""
        import torch

        from policies.rollout import evaluate

        torch.manual_seed(seed)  # every version draws from the same seed
        out = {}
        for name, entries in self.entries.items():
            res = evaluate(engine, envs[name], entries, k=self.k, progress=progress, batch=batch, **self.opts)
            out[name] = [sum(res["entries"][e]) / self.k for e in entries]
        return self.put(version, envs, out)

    def put(self, version: str, envs: dict, per_entry: dict[str, list[float]]) -> dict:
        """Record a version's avg@k per entry (env -> scores in suite order), scored here or elsewhere (the
        broadcaster's guard); cached."""
        out = {
            name: {
                "avg": sum(per) / max(1, len(per)),
                "per_entry": per,
                "categories": _by_category(envs[name], self.entries[name], per),
            }
            for name, per in per_entry.items()
        }
        self.versions[version] = out
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # other caches share the file (the guard's base and versions, `main.py report`): merge, do not overwrite
        with file_lock(self.path.with_name(self.path.name + ".lock")):
            self._all = json.loads(self.path.read_text()) if self.path.exists() else {}
            self._all[self.fingerprint] = {**self._all.get(self.fingerprint, {}), version: out}
            self.versions = self._all[self.fingerprint]
            atomic_write_bytes(self.path, json.dumps(self._all).encode())
        return out

    def versus(self, base: str, version: str, exclude: set[str] = frozenset()) -> dict[str, dict]:
        """env -> {"avg", "base_avg", "delta", "p_value", "wins", "losses", "n"} (paired on the same entries),
        leaving out the entries in `exclude` (e.g. those the promotion gate looks at)."""
        a, b = self.get(base), self.get(version)
        if not a or not b:
            return {}
        out = {}
        for env in b:
            if env not in a:
                continue
            keep = [i for i, e in enumerate(self.entries.get(env, [])) if e not in exclude]
            if not keep:
                continue
            x, y = [a[env]["per_entry"][i] for i in keep], [b[env]["per_entry"][i] for i in keep]
            t = paired_test(x, y)
            out[env] = {
                "avg": sum(y) / max(1, len(y)),
                "base_avg": sum(x) / max(1, len(x)),
                "delta": t["mean_diff"],
                "p_value": t["p_value"],
                "wins": t["wins"],
                "losses": t["losses"],
                "n": len(keep),
            }
        return out


def _by_category(env, entries: list[str], per: list[float]) -> dict[str, float]:
    cats: dict[str, list[float]] = {}
    for e, s in zip(entries, per):
        cats.setdefault(env.category_of(e), []).append(s)
    return {c: sum(v) / len(v) for c, v in sorted(cats.items())}
