"""A judged rollout group of two samples for the learner's tests: task `i`'s right call (mkdir, GOOD, outcome 1)
and its wrong one (rm, BAD, outcome 0). tests/ is on sys.path (its conftest.py)."""

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
