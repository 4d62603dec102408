"""How far behind the weights being trained a sample's behaviour version is, in learner steps along the weights
manifests' parent links (`WeightsStore.ancestors`): the learner drops groups beyond `learner.max_staleness`."""

from __future__ import annotations

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


def lead_over_users(store: WeightsStore, training: str, served: str, max_staleness: int) -> int | None:
    """How many learner steps `training` is past the `served` version once that lead is `max(1, max_staleness)` or
    more, else None. While live groups are held (users keep sending more), a step from there would leave what the
    served version writes too stale to learn from: the learner waits for the broadcaster to promote, reject or roll
    back instead (each moves `served` or resets `training`); the held live groups at their last chance then go first
    (`groups.step_choice`). A served version that is no ancestor of `training` (another branch) is None too: waiting
    would not make its samples fresh."""
    lead, version = 0, training
    while version != served:  # along the parent links until `served`: a few manifests in the steady state
        man = store.manifest(version)
        version, lead = (man or {}).get("parent"), lead + 1
        if not version or lead > 1000:
            return None
    return lead if lead >= max(1, max_staleness) else None
