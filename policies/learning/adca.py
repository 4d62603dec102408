"""Step-level credit (ADCA-GRPO, AgentEvolver) and ambiguity-aware scaling (ADPO, Agent0).

ADCA, per group g of trajectories i with steps k (AgentEvolver's `decouple` scheme):
  p_ik  = +1 for a GOOD step, -1 for a BAD one (the magnitude cancels in the z-score)
  mu_g  = mean over trajectories of each trajectory's mean step reward
  var_g = mean over trajectories of each trajectory's mean squared deviation from mu_g
  z_ik  = (p_ik - mu_g) / sqrt(var_g + 1e-8)                       (equal trajectory weight)
  u_i   = (o_i - mean_g o) / std_g o   (population std; only the mean is removed when std ~ 0)
  r_ik  = alpha * z_ik, plus u_i on the last step
  A_ik  = sum_{j >= k} r_ij            (undiscounted suffix sum; every token of step k gets A_ik)

ADPO: with self-consistency p (share of a task's samples agreeing with the majority answer),
  s(p)        = s_min + (1 - s_min) * clip((p - 0.3) / (0.8 - 0.3), 0, 1)     advantage scale, s_min 0.6
  eps_high(p) = 0.2 + 0.1 * clip((0.8 - p) / (0.8 - 0.3), 0, 1)              upper clip, 0.2 .. 0.3
so ambiguous tasks (low p) get smaller advantages and more room to raise unlikely tokens.
"""

from __future__ import annotations

import math

import torch


def _clip01(x: float) -> float:
    return min(1.0, max(0.0, x))


def step_rewards(labels: list[list[str]], outcomes: list[float], alpha: float = 0.1) -> list[list[float]]:
    """r_ik for one group (see module docstring)."""
    p = [[1.0 if lab == "GOOD" else -1.0 for lab in traj] for traj in labels]
    means = [sum(t) / len(t) for t in p if t]
    mu = sum(means) / len(means) if means else 0.0
    devs = [sum((x - mu) ** 2 for x in t) / len(t) for t in p if t]
    var = sum(devs) / len(devs) if devs else 0.0
    z = [[(x - mu) / math.sqrt(var + 1e-8) for x in t] for t in p]
    n = len(outcomes)
    o_mean = sum(outcomes) / n
    o_std = math.sqrt(sum((o - o_mean) ** 2 for o in outcomes) / n)
    u = [(o - o_mean) / o_std if o_std > 1e-6 else o - o_mean for o in outcomes]
    out = []
    for zi, ui in zip(z, u):
        r = [alpha * x for x in zi]
        if r:
            r[-1] += ui
        out.append(r)
    return out


def step_advantages(labels: list[list[str]], outcomes: list[float], alpha: float = 0.1) -> list[list[float]]:
    """A_ik = suffix sums of r_ik."""
    adv = []
    for r in step_rewards(labels, outcomes, alpha):
        acc, a = 0.0, []
        for x in reversed(r):
            acc += x
            a.append(acc)
        adv.append(list(reversed(a)))
    return adv


def token_advantages(step_ids: list[list[int]], step_adv: list[list[float]], width: int) -> torch.Tensor:
    """[B, width] tensor: each token gets its step's advantage; tokens outside steps get 0."""
    out = torch.zeros(len(step_ids), width)
    for i, (ids, adv) in enumerate(zip(step_ids, step_adv)):
        for t, k in enumerate(ids):
            if 0 <= k < len(adv):
                out[i, t] = adv[k]
    return out


def self_consistency(outcomes: list[float], threshold: float = 0.5) -> float:
    """Share of the group agreeing with the majority verdict (success = outcome >= threshold)."""
    wins = sum(1 for o in outcomes if o >= threshold)
    return max(wins, len(outcomes) - wins) / len(outcomes) if outcomes else 1.0


def adpo_scale(p: float, s_min: float = 0.6, low: float = 0.3, high: float = 0.8) -> float:
    return s_min + (1.0 - s_min) * _clip01((p - low) / (high - low))


def adpo_clip_high(p: float, base: float = 0.2, extra: float = 0.1, low: float = 0.3, high: float = 0.8) -> float:
    return base + extra * _clip01((high - p) / (high - low))
