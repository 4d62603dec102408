"""The lineage of weights versions, from the event stream: what `main.py report` prints.

One row per published version: its parent and learner step, when it was published, the gate's
decision and reason (`evo.weights_status`: rejected / superseded / passed / canary / live), the
canary's verdict (went live, or rolled back and why), per stage: the learner step's duration, how
long after the judged groups it learned from it was published, how long its gate took from
publication to a decision, and when it was first served (canary or live), and its held-out scores next to the
base's (`policies/evaluation/heldout.py`, paired on the same entries). Pure: it takes typed events, so it is tested without a bus.
"""

from __future__ import annotations

from datetime import datetime

from actors.events import Judgement, LearnerStep, WeightsPromoted, WeightsPublished, WeightsRolledBack, WeightsStatus
from actors.messages import Event


def _t(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


def lineage(events: list[Event], judged: dict[str, float] | None = None) -> list[dict]:
    """`judged`: judgement event id -> its time, when the caller keeps those instead of the judgements
    (`policies/evaluation/evolution.py`); by default taken from the Judgement events among `events`."""
    if judged is None:
        judged = {e.event_id: _t(e.occurred_at) for e in events if isinstance(e, Judgement)}
    rows: dict[str, dict] = {}
    step_sources: dict[int, list[str]] = {}
    step_s: dict[int, float] = {}
    for e in events:
        if isinstance(e, LearnerStep):
            step_sources[e.step], step_s[e.step] = e.source_event_ids, round(e.duration_s, 1)
    for e in events:
        if isinstance(e, WeightsPublished):
            w = e.weights
            srcs = [judged[i] for i in step_sources.get(w.step, []) if i in judged]
            rows.setdefault(
                w.version,
                {
                    "version": w.version,
                    "parent": w.parent,
                    "step": w.step,
                    "status": "published",
                    "published_at": e.occurred_at,
                    "learned_from": min(srcs) if srcs else None,
                    "published_after_s": round(_t(e.occurred_at) - min(srcs), 1) if srcs else None,
                    "step_s": step_s.get(w.step),
                    "gate_s": None,
                    "gate": "",
                    "canary": "",
                    "served_after_s": None,
                    "forced": e.force,
                },
            )
    for e in events:
        row = rows.get(getattr(e, "version", None) or getattr(getattr(e, "weights", None), "version", None) or "")
        if isinstance(e, WeightsStatus) and row is not None:
            status = row["status"] = str(e.status)
            if status in ("passed", "canary", "rejected", "live") and row["gate_s"] is None and not row["forced"]:
                row["gate_s"] = round(_t(e.occurred_at) - _t(row["published_at"]), 1)  # published -> decided
            if status in ("rejected", "superseded", "canary", "passed"):
                row["gate"] = f"{status}: {e.reason}"
            elif status == "live" and row["gate"].startswith("canary"):
                row["canary"] = f"live: {e.reason}"
            elif status == "live":  # straight to live (no canary share) or forced by an operator
                row["gate"] = f"live: {e.reason}"
        elif isinstance(e, WeightsPromoted) and row is not None and row["served_after_s"] is None:
            if row["learned_from"] is not None:
                row["served_after_s"] = round(_t(e.occurred_at) - row["learned_from"], 1)
        elif isinstance(e, WeightsRolledBack) and e.from_version in rows:
            rows[e.from_version]["canary"] = f"rolled back: {e.reason}"
    return sorted(rows.values(), key=lambda r: r["step"])


def table(rows: list[dict], heldout: dict[str, dict[str, dict]], base_scores: dict | None) -> str:
    """`heldout[version][env]` = HeldoutCache.versus(base, version)[env]; `base_scores[env]["avg"]`."""
    envs = sorted({env for v in heldout.values() for env in v} | set(base_scores or {}))
    head = f"{'version':<9} {'parent':<9} {'step':>4} {'status':<11} {'served':>7}  " + "".join(
        f"{env + ' held-out':>22}" for env in envs
    )
    lines = [head]
    if base_scores:
        lines.append(
            f"{'w-000000':<9} {'':<9} {0:>4} {'base':<11} {'':>7}  "
            + "".join(f"{100 * base_scores[e]['avg']:>21.1f}%" if e in base_scores else f"{'-':>22}" for e in envs)
        )
    for r in rows:
        served = f"{r['served_after_s']:.0f}s" if r["served_after_s"] is not None else "-"
        cells = ""
        for env in envs:
            h = heldout.get(r["version"], {}).get(env)
            cells += f"{100 * h['avg']:>6.1f}% ({100 * h['delta']:+.1f}, p={h['p_value']:.3f})" if h else f"{'-':>22}"
        lines.append(f"{r['version']:<9} {r['parent']:<9} {r['step']:>4} {r['status']:<11} {served:>7}  {cells}")
        for key in ("gate", "canary"):
            if r[key]:
                lines.append(f"{'':<11}{key}: {r[key][:150]}")
    return "\n".join(lines)


def curve(rows: list[dict], heldout: dict[str, dict[str, dict]], base_scores: dict, path) -> None:
    """Held-out avg per environment for the base and every scored version, in learner-step order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    for env in sorted(base_scores):
        pts = [(0, 100 * base_scores[env]["avg"], 1.0)] + [
            (r["step"], 100 * heldout[r["version"]][env]["avg"], heldout[r["version"]][env]["p_value"])
            for r in rows
            if env in heldout.get(r["version"], {})
        ]
        (line,) = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{env}")
        sig = [p for p in pts[1:] if p[2] < 0.05]
        if sig:
            ax.scatter([p[0] for p in sig], [p[1] for p in sig], s=120, facecolors="none", edgecolors=line.get_color())
    ax.set_xlabel("learner step of the version (0 = base)")
    ax.set_ylabel("held-out avg@k (%)")
    ax.set_title("Held-out success by weights version (circled: paired p < 0.05 vs base)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
