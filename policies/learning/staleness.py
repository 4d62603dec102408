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
