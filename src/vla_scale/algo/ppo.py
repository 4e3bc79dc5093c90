"""PPO with a critic, per action chunk: a value head on the policy's backbone, generalised advantage estimation over
each episode's chunk steps, advantages normalised over the step, and the clipped value loss beside the clipped policy
loss; every episode trains (groups of one). `algo=ppo` (an SFT policy) and `algo=ppo_scratch` (a fresh one).

A chunk step is one decision: the policy sees an observation, emits a whole chunk, the env runs it and returns one
reward (the sum of its steps' rewards). An episode of T chunk steps gives rewards r_0..r_{T-1} and the critic's
values V_0..V_{T-1} of the observations the chunks were decoded on. After the last chunk:
- a terminated episode (the task succeeded: nothing follows) has V_T = 0;
- a truncated one (the step limit cut it) is bootstrapped with V_T = the critic's value of its final observation,
  read from a row of its own in the planned batch (`final_observation`), which the policy loss never sees.
The maths (`chunk_gae`, `normalized`, `clipped_value_loss`, `explained_variance`) are pure functions of torch, checked
by hand; `PPO` puts them into the update.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from vla_scale.algo.base import Algorithm, Prepared
from vla_scale.batches import MeanOverRanks, MicroBatch, MiniBatch, UpdatePlan


def chunk_gae(rewards: Tensor, values: Tensor, last_value: float, terminated: bool, gamma: float,
              lam: float) -> tuple[Tensor, Tensor]:
    """(advantages, returns) float64 [T] of one episode's chunk steps.

    delta_t = r_t + gamma * V_{t+1} - V_t with V_T = 0 when `terminated`, else `last_value`;
    A_t = delta_t + gamma * lam * A_{t+1} (A_T = 0); returns R_t = A_t + V_t, the value loss's targets.
    lam = 1 gives the discounted Monte-Carlo return minus V_t, lam = 0 the one-step TD error.
    """
    if rewards.dim() != 1 or values.shape != rewards.shape:
        raise ValueError(f"need rewards [T] and values [T], got {tuple(rewards.shape)} and {tuple(values.shape)}")
    if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
        raise ValueError(f"need 0 <= gamma <= 1 and 0 <= lam <= 1, got gamma={gamma}, lam={lam}")
    r, v = rewards.detach().double(), values.detach().double()
    following = torch.cat([v[1:], v.new_tensor([0.0 if terminated else float(last_value)])])
    deltas = r + gamma * following - v
    advantages = torch.zeros_like(deltas)
    running = 0.0
    for t in range(len(deltas) - 1, -1, -1):
        running = float(deltas[t]) + gamma * lam * running
        advantages[t] = running
    return advantages, advantages + v


def normalized(values: Tensor, mean: float, std: float, eps: float = 1e-8) -> Tensor:
    """(values - mean) / (std + eps): advantages on one scale whatever the rewards' (mean and std over the whole
    step's chunk steps, every rank's: the caller reduces them)."""
    return (values - mean) / (std + eps)


def clipped_value_loss(values: Tensor, old_values: Tensor, returns: Tensor, clip: float, weights: Tensor
                       ) -> tuple[Tensor, dict[str, float]]:
    """PPO's clipped value loss, sum_i w_i * 0.5 * max((V_i - R_i)^2, (V_clip_i - R_i)^2), and its metrics.

    V_clip = V_old + clamp(V - V_old, -clip, clip) keeps one update from moving a value further than `clip` from the
    one the advantages were computed with; `clip` = 0 turns the clipping off (plain squared error). `weights` [M]
    spread the mini-batch's mean over its micro-batches (a row of weight 0, e.g. an episode's final observation,
    which has no target, adds nothing). Metrics: `value_clip_frac`, the share of weighted rows where the clipped
    branch is the larger one."""
    if not values.shape == old_values.shape == returns.shape == weights.shape or values.dim() != 1:
        raise ValueError(f"values, old_values, returns and weights must all be [M], got {tuple(values.shape)}, "
                         f"{tuple(old_values.shape)}, {tuple(returns.shape)}, {tuple(weights.shape)}")
    if clip < 0:
        raise ValueError(f"clip must be >= 0, got {clip}")
    v, old, target = values.float(), old_values.detach().float(), returns.detach().float()
    unclipped = (v - target).square()
    if clip > 0:
        clipped = (old + (v - old).clamp(-clip, clip) - target).square()
        taken = clipped > unclipped
        per_row = torch.maximum(unclipped, clipped)
    else:
        taken = torch.zeros_like(unclipped, dtype=torch.bool)
        per_row = unclipped
    w = weights.detach().float()
    loss = 0.5 * (per_row * w).sum()
    counted = w > 0
    frac = float(taken[counted].float().mean()) if bool(counted.any()) else 0.0
    return loss, {"value_clip_frac": frac}


def explained_variance(predicted: Tensor, targets: Tensor) -> float:
    """1 - Var[targets - predicted] / Var[targets]: 1 for a perfect critic, 0 for one that predicts the mean, < 0 for
    worse; 0 when the targets do not vary."""
    y, p = targets.detach().double(), predicted.detach().double()
    variance = float(y.var(correction=0)) if y.numel() else 0.0
    if variance == 0.0:
        return 0.0
    return 1.0 - float((y - p).var(correction=0)) / variance


class PPO(Algorithm):
    name = "ppo"
    needs_values = True
    compares_groups = False

    @classmethod
    def config_problems(cls, settings: Any, steps: int) -> list[str]:
        """GRPO's group filter (PPO trains every episode), a critic warm-up as long as the run."""
        problems = []
        if settings.filter_low > 0 or settings.filter_high < 1:
            problems.append(f"algo=ppo trains every episode, but algo.filter_low={settings.filter_low} / "
                            f"algo.filter_high={settings.filter_high} would drop groups (GRPO's dynamic sampling): set "
                            "algo.filter_low=0 algo.filter_high=1")
        if settings.critic.warmup_steps >= steps:
            problems.append(f"algo.critic.warmup_steps={settings.critic.warmup_steps} trains only the value head for "
                            f"the whole run (steps={steps}): lower it below steps")
        return problems

    def final_observation(self, trajectory: Any) -> bool:
        """A truncated episode's final observation, whose value bootstraps its return (`algo.critic.
        bootstrap_truncated`)."""
        return bool(self.settings.critic.bootstrap_truncated and trajectory.truncated
                    and trajectory.final_images is not None)

    def prepare(self, plan: UpdatePlan, olds: Sequence[list[Tensor | None]], values: Sequence[list[Tensor]],
                mean_over_ranks: MeanOverRanks) -> Prepared:
        """GAE's advantages and the value loss's targets from the critic's `values` (`with_critic_targets`), then
        the final observations' rows dropped (`without_final_rows`)."""
        minis, metrics = with_critic_targets(plan, values, self.settings, mean_over_ranks)
        trimmed = [without_final_rows(mini, old) for mini, old in zip(minis, olds, strict=True)]
        return Prepared(tuple(mini for mini, _ in trimmed), tuple(old for _, old in trimmed), metrics)

    def policy_trains(self, step: int) -> bool:
        """Not during the critic's warm-up (`algo.critic.warmup_steps`): then only the value head learns."""
        return step >= self.settings.critic.warmup_steps

    def detach_backbone(self, step: int) -> bool:
        """In the warm-up, or always with `algo.critic.detach_backbone`."""
        return not self.policy_trains(step) or self.settings.critic.detach_backbone

    def loss_terms(self, micro: MicroBatch, values: Tensor | None, device: torch.device
                   ) -> tuple[Tensor | None, dict[str, float]]:
        """`algo.vf_coef` times the micro-batch's share of the mini-batch's clipped value loss (its rows' weights
        sum to 1 over the mini-batch); the loss and the clip fraction as that share."""
        assert values is not None, "PPO's loss needs the value head's values"
        weights = micro.targets["value_weights"]
        loss, info = clipped_value_loss(values, micro.targets["old_values"].to(device),
                                        micro.targets["returns"].to(device), self.settings.value_clip,
                                        weights.to(device))
        return self.settings.vf_coef * loss, {"value_loss": loss.item(),
                                              "value_clip_frac": info["value_clip_frac"] * float(weights.sum())}

    def update_metrics(self, step: int) -> dict[str, float]:
        return {"critic_warmup": float(not self.policy_trains(step))}


def with_critic_targets(plan: UpdatePlan, values: Sequence[list[Tensor]], settings: Any,
                        mean_over_ranks: MeanOverRanks) -> tuple[tuple[MiniBatch, ...], dict[str, float]]:
    """The plan's mini-batches with PPO's advantages and value targets, from `values` (the critic's, per micro-batch
    of each mini-batch, before the update): chunk-level GAE per episode (`chunk_gae`; a successful episode
    terminated, a truncated one bootstrapped from its final observation's value), advantages normalised over every
    rank's chunk steps (`algo.normalize_advantages`; with `algo.critic.bootstrap_truncated=false` the step limit
    ends an episode as a success does), and each row's weight in its mini-batch's value loss. Also the metrics of
    what was made: the values', returns' and advantages' means, the advantages' std (before normalising) and the
    critic's explained variance."""
    per_episode = [np.zeros(len(traj)) for traj in plan.trajectories]
    last = np.zeros(len(plan.trajectories))
    for mini, mini_values in zip(plan.minis, values, strict=True):
        for micro, micro_values in zip(mini.micro_batches, mini_values, strict=True):
            for e, t, final, v in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(),
                                      micro.rows.final.tolist(), micro_values.double().tolist(), strict=True):
                if final:
                    last[e] = v
                else:
                    per_episode[e][t] = v
    ends = [not (traj.truncated and settings.critic.bootstrap_truncated) for traj in plan.trajectories]
    gae = [chunk_gae(torch.tensor(traj.rewards, dtype=torch.float64), torch.from_numpy(per_episode[e]),
                     float(last[e]), ends[e], settings.gamma, settings.gae_lambda)
           for e, traj in enumerate(plan.trajectories)]
    advantages = torch.cat([a for a, _ in gae]) if gae else torch.zeros(0, dtype=torch.float64)
    returns = torch.cat([r for _, r in gae]) if gae else torch.zeros(0, dtype=torch.float64)
    old = torch.from_numpy(np.concatenate(per_episode)) if gae else torch.zeros(0, dtype=torch.float64)
    count = mean_over_ranks(float(len(advantages)))
    mean = mean_over_ranks(float(advantages.sum())) / count
    std = max(mean_over_ranks(float((advantages - mean).square().sum())) / count, 0.0) ** 0.5
    metrics = {"value_mean": mean_over_ranks(float(old.sum())) / count,
               "return_mean": mean_over_ranks(float(returns.sum())) / count,
               "advantage_mean": mean, "advantage_std": std,
               "explained_variance": explained_variance(old, returns)}
    if settings.normalize_advantages:
        gae = [(normalized(a, mean, std), r) for a, r in gae]
    minis = []
    for mini in plan.minis:
        weights = value_weights(mini, mean_over_ranks)
        minis.append(MiniBatch(tuple(_targeted(micro, gae, per_episode, last, w)
                                     for micro, w in zip(mini.micro_batches, weights, strict=True))))
    return tuple(minis), metrics


def value_weights(mini: MiniBatch, mean_over_ranks: MeanOverRanks) -> list[Tensor]:
    """Each micro-batch's rows' weights in the mini-batch's value loss: the mean over the mini-batch's chunk steps
    (its final observations left out, weight 0) of every rank's share, so several ranks weigh rows as one would."""
    counted_rows = [~micro.rows.final for micro in mini.micro_batches]
    counted = mean_over_ranks(float(sum(int(rows.sum()) for rows in counted_rows)))
    return [rows.float() / max(counted, 1e-12) for rows in counted_rows]


def without_final_rows(mini: MiniBatch, olds: list[Tensor | None]) -> tuple[MiniBatch, list[Tensor | None]]:
    """`mini` without its final-observation rows (and their old log-probs): the proximal pass read their values,
    and they have no action and no target, so the update's forward and backward skip them (a micro-batch of final
    observations alone keeps one, weighed 0, so every rank runs the same passes)."""
    kept_minis, kept_olds = [], []
    for micro, old in zip(mini.micro_batches, olds, strict=True):
        keep = np.flatnonzero(~micro.rows.final.numpy())
        keep = keep if len(keep) else np.arange(1)
        kept_minis.append(micro.rows_at(keep))
        kept_olds.append(None if old is None else old[torch.from_numpy(keep)])
    return MiniBatch(tuple(kept_minis)), kept_olds


def _targeted(micro: MicroBatch, gae: list[tuple[Tensor, Tensor]], values: list[np.ndarray], last: np.ndarray,
              weights: Tensor) -> MicroBatch:
    """`micro` with its rows' advantages, returns, old values (a final observation's: 0, 0 and its value) and
    value-loss weights."""
    advantages, returns, old = [], [], []
    for e, t, final in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(), micro.rows.final.tolist(),
                           strict=True):
        advantage, ret = gae[e]
        advantages.append(0.0 if final else float(advantage[t]))
        returns.append(0.0 if final else float(ret[t]))
        old.append(float(last[e]) if final else float(values[e][t]))
    targets = {"returns": torch.tensor(returns, dtype=torch.float32),
               "old_values": torch.tensor(old, dtype=torch.float32), "value_weights": weights}
    return micro._replace(advantages=torch.tensor(advantages, dtype=torch.float32), targets=targets)


ALGORITHM = PPO
