"""How far behind the weights being trained a sample's behaviour version is, in learner steps along the weights
manifests' parent links (`WeightsStore.ancestors`): the learner drops groups beyond `learner.max_staleness`."""

from __future__ import annotations

from dataclasses import dataclass

from policies.weights.model_store import BASE_VERSION, WeightsStore

REFERENCE = "reference"  # behaviour of an off-policy reference sample: no weights version generated it


def staleness(store: WeightsStore, training: str, version: str, max_staleness: int) -> int | None:
    """Learner steps from `version` to `training` along the manifests' parent links; None when `version` is not
    an ancestor within `max_staleness` steps, or its weights file is gone (it cannot be corrected then).
    A reference sample has no behaviour version and never goes stale."""
    if version == REFERENCE:
        return 0
    lineage = store.ancestors(training, max_staleness)
    if version not in lineage:
        return None
    if version != BASE_VERSION and not (store.manifest(version) or {}).get("path"):
        return None
    return lineage.index(version)


def lead_over_users(store: WeightsStore, training: str, served: list[str], max_staleness: int) -> int | None:
    """How many learner steps `training` is past the nearest of the `served` versions (live, and the canary while
    there is one) once that lead is `max(1, max_staleness)` or more, else None. While users are active (live samples
    held), a step from there would leave what they are answered with too stale to learn from (`staleness` above
    `max_staleness`): the learner waits for the broadcaster to promote, reject or roll back (`WaitForUsers`); the
    held live groups at their last chance then go first (`groups.step_choice`). A served version that is no ancestor
    of `training` (another branch) gives None too: waiting would not make its samples fresh."""
    lineage = store.ancestors(training, 1000, until=served)  # a few manifests in the steady state
    if lineage[-1] not in served or len(lineage) - 1 < max(1, max_staleness):
        return None
    return len(lineage) - 1


@dataclass
class WaitForUsers:
    """The learner's wait at `lead_over_users` over the `pointer`'s live and canary versions (`live_only`: over the
    live version alone, which answers all users but the canary's share: measured from the canary, the rated steps
    of an hour's users went stale as they arrived, `learner.wait_for`), at most `max_wait_s` for one (training,
    served) pair: a gate that never decides (a guard's hold, a stalled broadcaster, held messages filling the
    consumer's `max_ack_pending`) costs one step per `max_wait_s`, not the learner. Called before each step; says
    'waiting' (new: log it), 'still', 'expired' (log it and step) or None (step)."""

    max_wait_s: float
    live_only: bool = False
    key: tuple | None = None  # (training, *served) of the wait in progress
    since: float = 0.0

    @classmethod
    def from_settings(cls, learner) -> WaitForUsers:
        return cls(learner.max_wait_s, live_only=learner.wait_for == "live")

    def __call__(self, store, training: str, pointer, max_staleness: int, active: bool, now: float):
        served = [pointer.version, *([pointer.canary.version] if pointer.canary and not self.live_only else [])]
        if not active or lead_over_users(store, training, served, max_staleness) is None:
            self.key = None
            return None
        if (training, *served) != self.key:
            self.key, self.since = (training, *served), now
            return "waiting"
        return "expired" if now - self.since > self.max_wait_s else "still"
