"""A replica's Prometheus metrics (serve/metrics.py): what it measured itself and what the event stream told it,
read back through prometheus_client's own parser."""

from datetime import datetime, timedelta, timezone

from prometheus_client.parser import text_string_to_metric_families

from actors.events import HeldoutScored, LearnerStep, WeightsPromoted, WeightsPublished, WeightsRef, WeightsStatus
from serve.metrics import KEEP_VERSIONS, Metrics, reason_kind

T0 = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)


def _samples(m: Metrics) -> dict:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(m.render().decode())
        for s in fam.samples
    }


def _ref(v: str, step: int) -> WeightsRef:
    return WeightsRef(version=v, path=f"/w/{v}.safetensors", sha256="0" * 64, parent="w-000000", step=step)


def test_what_the_replica_measures_and_what_the_stream_says():
    m = Metrics(outbox_depth=lambda: 3)
    m.answered(stream=False, seconds=2.0, tokens=40)
    m.answered(stream=True, seconds=0.5, tokens=0)
    m.swapped(0.3)
    m.on_event(
        LearnerStep(
            step=1,
            groups=2,
            samples=8,
            loss=0.1,
            mean_reward=0.2,
            grad_norm=1.0,
            duration_s=30,
            metrics={"learned_from_ts": T0.timestamp(), "informative_share": 0.75, "groups_env": 1.0, "groups_live": 1.0},
        )
    )
    m.on_event(WeightsPublished(weights=_ref("w-000001", 1)))
    promoted = WeightsPromoted(
        weights=_ref("w-000001", 1),
        candidate_score=0.5,
        live_score=0.4,
        previous="w-000000",
        stage="canary",
        occurred_at=(T0 + timedelta(seconds=150)).isoformat(),
    )
    m.on_event(promoted)
    m.on_event(promoted.model_copy(update={"stage": "live", "occurred_at": (T0 + timedelta(seconds=400)).isoformat()}))
    m.on_event(WeightsStatus(version="w-000002", status="rejected", reason="held-out success 0.250 vs live 0.500"))
    m.on_event(
        HeldoutScored(
            version="w-000001",
            env="code",
            entries=24,
            suite_entries=24,
            k=8,
            avg=0.2,
            base_avg=0.05,
            delta=0.15,
            p_value=0.01,
            wins=5,
            losses=0,
            verdict="not_below",
            duration_s=60,
        )
    )
    s = _samples(m)
    assert s[("kaizen_request_seconds_count", (("stream", "false"),))] == 1
    assert s[("kaizen_request_seconds_count", (("stream", "true"),))] == 1
    assert s[("kaizen_generated_tokens_total", ())] == 40 and s[("kaizen_tokens_per_second_sum", ())] == 20
    assert s[("kaizen_swap_seconds_count", ())] == 1 and s[("kaizen_outbox_depth", ())] == 3
    # first served (the canary) 150 s after the oldest group it learned from; going live later is not counted again
    assert s[("kaizen_interaction_to_served_seconds_count", ())] == 1
    assert s[("kaizen_interaction_to_served_seconds_sum", ())] == 150
    assert s[("kaizen_weights_decisions_total", (("reason", "held-out success"), ("status", "rejected")))] == 1
    assert s[("kaizen_heldout_score", (("env", "code"), ("version", "w-000001")))] == 0.2
    assert s[("kaizen_heldout_base_score", (("env", "code"),))] == 0.05
    assert s[("kaizen_informative_group_share", ())] == 0.75 and s[("kaizen_live_training_share", ())] == 0.5


def test_labels_stay_bounded():
    assert reason_kind("canary feedback worse: mean -0.50 (n=4) vs 0.50") == "canary feedback worse"
    assert reason_kind("reference NLL 1.30 > 1.19 + 0.1") == "reference nll"
    assert reason_kind("") == "other" and reason_kind("0.5 is lower") == "other"
    m = Metrics()
    for i in range(KEEP_VERSIONS + 10):
        m.on_event(
            HeldoutScored(
                version=f"w-{i:06d}",
                env="code",
                entries=1,
                suite_entries=1,
                k=1,
                avg=0.1,
                base_avg=0.1,
                delta=0.0,
                p_value=1.0,
                wins=0,
                losses=0,
                verdict="not_below",
                duration_s=60,
            )
        )
    versions = {
        lbl["version"] for (name, labels), _ in _samples(m).items() if name == "kaizen_heldout_score" for lbl in [dict(labels)]
    }
    assert len(versions) == KEEP_VERSIONS and "w-000000" not in versions


def test_the_grafana_dashboard_queries_only_metrics_that_exist():
    import json
    import re
    from pathlib import Path

    dash = json.loads((Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "kaizen.json").read_text())
    names = {fam.name for fam in text_string_to_metric_families(Metrics().render().decode())}
    queried = {n for p in dash["panels"] for t in p["targets"] for n in re.findall(r"kaizen_[a-z_]+", t["expr"])}
    base = {re.sub(r"_(bucket|total|count|sum)$", "", n) for n in queried}
    assert queried and base <= names, base - names
