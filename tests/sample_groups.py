"""A judged rollout group of two samples for the learner's tests: task `i`'s right call (mkdir, GOOD, outcome 1)
and its wrong one (rm, BAD, outcome 0); a small lineage of weights versions. tests/ is on sys.path (its conftest.py)."""

import json

from actors.events import ChatMessage, Judgement, Sample, ToolCall


def two_sample_group(i: int, version: str = "w-000000") -> Judgement:
    def sample(ok: bool) -> Sample:
        call = ToolCall(id="c", name="mkdir" if ok else "rm", arguments=json.dumps({"dir_name": f"d{i}"}))
        return Sample(
            sample_id=f"s{i}{ok}",
            messages=[
                ChatMessage(role="system", content="You call functions."),
                ChatMessage(role="user", content=f"Create the folder d{i}."),
                ChatMessage(role="assistant", tool_calls=[call]),
            ],
            step_indices=[2],
        )

    return Judgement(
        event_id=f"j-{i}",
        group_id=f"g{i}",
        source="rollout",
        task_id=f"t{i}",
        weights_version=version,
        samples=[sample(True), sample(False)],
        outcomes=[1.0, 0.0],
        step_labels=[["GOOD"], ["BAD"]],
    )


def lineage_store(path):
    """A weights store of w-000001..w-000006 in a line from the base, and w-000007 trained from w-000003 after
    w-000004..6 were rejected (tiny files)."""
    import torch

    from policies.weights.model_store import WeightsStore

    store, sd = WeightsStore(path), {"w": torch.zeros(1)}
    for n in range(1, 7):
        store.save(sd, f"w-{n:06d}", {"parent": f"w-{n - 1:06d}"})
    store.save(sd, "w-000007", {"parent": "w-000003"})
    return store
