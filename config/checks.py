"""The settings of what decides which weights users get: the promotion gate and the guard against the base
(sections of `config.settings.Settings`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GateSettings(_Section):
    heldout_tasks: int = Field(3, description="Held-out tasks per environment a promotion gate scores first")
    second_look_tasks: int = Field(
        8,
        description="Held-out tasks per environment both versions are scored on when "
        "the candidate fell short of live on the first heldout_tasks there (that decides)",
    )
    tolerance: float = Field(0.05, description="Candidate may score this much below live and still be promoted")
    success_alpha: float = Field(
        0.05,
        gt=0,
        le=1,
        description="A candidate that falls short of live by more than "
        "tolerance is rejected only when the drop is significant: one-sided paired sign-flip "
        "p below this on the entries of the deciding look (1 = the point rule). On 8 entries "
        "one flip is noise, and a version lucky there would otherwise stop every successor",
    )
    nll_tolerance: float = Field(
        0.05,
        description="Candidate's per-token NLL of the held-out reference actions may "
        "exceed live's by this much (nats) and still be promoted",
    )
    base_nll_tolerance: float = Field(
        0.3,
        description="Candidate's reference NLL may exceed the base model's by "
        "this much (nats): steps each within nll_tolerance of live cannot add up to a "
        "runaway (the +12.5-point version of the learning-curve run was +0.18)",
    )
    nll_entries: int = Field(16, description="Held-out entries whose reference actions the gate scores by likelihood")
    keep_versions: int = Field(5, description="Weights versions kept on disk for rollback")
    canary_share: float = Field(
        0.25,
        description="Share of live requests served by a promoted candidate while it is a canary (0 = promote straight to live)",
    )
    canary_min_feedback: int = Field(
        8, description="Rated canary requests (and as many rated live ones) before the canary is judged"
    )
    canary_min_s: float | None = Field(
        120.0,
        description="A successor that passed its gate against the running canary "
        "ends that canary after this long, unless the canary's feedback so far is worse "
        "than live: the canary goes live and the successor becomes the canary (the live "
        "watch still rolls back). None: every canary runs to its verdict",
    )
    canary_max_s: float = Field(
        900.0, description="A canary without enough feedback after this long goes live (it passed the gate)"
    )
    live_after_guard: bool = Field(
        False,
        description="A canary goes live only once the guard has checked it no worse than the base (needs "
        "guard.enabled): a version below the base then reaches the canary's share of users, and only until its "
        "check ends, never all of them. Its ratings and time still decide as before; the check is one more "
        "condition. A check that fails holds the canary where it is (`main.py status` shows the guard's "
        "error). Off: a canary can go live before its check ends, and a later `below` rolls users back",
    )
    rollback_margin: float = Field(
        0.3, description="Rollback when the version's mean feedback is this much below the baseline's (scores in [-1, 1])"
    )
    watch_feedback: int = Field(
        16,
        description="Rated requests of a live version compared with its predecessor's "
        "(sliding window); a drop beyond rollback_margin rolls it back",
    )


class GuardSettings(_Section):
    enabled: bool = Field(
        True,
        description="Score every served version against the base model on a held-out suite "
        "in the background (policies/promotion/guard.py) and publish evo.heldout_scored",
    )
    suite: dict[str, list[str]] = Field(
        {"code": ["add", "muladd"]},
        description="env -> held-out categories the "
        "guard scores (empty list = every category); where the base is neither at 0 "
        "nor at 1, so a loss can show",
    )
    per_category: int = Field(32, description="Held-out entries per category (the first ones)")
    k: int = Field(4, description="Samples per entry of a checked version (avg@k at rollout.temperature)")
    base_k: int = Field(
        8,
        description="Samples per entry of the base, scored once per state dir: near the floor "
        "(the 135M solves ~4% of the suite) only a well-known base rate gives the test power; 16 "
        "doubles that power and the first scoring's cost",
    )
    chunk_entries: int = Field(8, description="Entries scored between two looks at the running comparison")
    early_fraction: float = Field(
        0.5,
        description="Once this share of the suite is scored and the version is at "
        "least as good as the base there, the check stops (not below)",
    )
    alpha: float = Field(
        0.05,
        description="Below the base: a lower success rate, and the stratified exact test's "
        "one-sided p (policies/stats.fewer_successes) below this",
    )
    rollback: bool = Field(
        True,
        description="Roll back served versions found below the base, and the ones that "
        "descend from them, to the newest live version checked no worse (else the base)",
    )
    nice: int = Field(
        5,
        ge=0,
        le=19,
        description="OS niceness of the guard's thread: 5, the gate's and the "
        "learner's (it decides what users get, as the gate does), below users' replicas (0); on 2 "
        "busy cores a check takes ~10-20 min at 5 and most of an hour at 15",
    )
    batch: int = Field(16, description="Episodes generated together")
    duty: float = Field(
        1.0,
        gt=0,
        le=1,
        description="The share of wall time the guard may spend checking: after a check of d seconds the next "
        "waits d * (1/duty - 1), unless serving is held. 1 = whenever it is idle; on 2 cores, checking back to "
        "back took 0.26 of a core in an unrated hour (tests/benchmarks/LOG.md)",
    )
