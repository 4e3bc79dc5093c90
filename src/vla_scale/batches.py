"""The update's batches, named, from the episodes a step plays to what the actor takes: the record chain
`Trajectory -> Sample -> MiniBatch -> MicroBatch`, all in this module.

A `Trajectory` is one episode as the env loop records it; `StepBatch` holds the groups kept for one update; each
chunk step of their episodes is a `Sample` (with GRPO, its episode's group-normalised advantage); `plan_update`
splits the samples into `algo.mini_batches` optimizer steps (`MiniBatch`), each split into `algo.micro_batches`
accumulation steps (`MicroBatch`: inputs, tokens, the rollout's log-probs, advantages, token mask and loss weights),
and returns them as an `UpdatePlan`. Everything is built once, when the update is planned; the old log-probs, the
truncated importance weights and the mismatch are the update's own (`Actor.update`). With a critic (PPO) the
advantages and value targets are made from the critic's values read before the update (`with_critic_targets`),
and the micro-batches are remade with them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from vla_scale.algo import (
    chunk_gae,
    executed_action_mask,
    explained_variance,
    group_advantages,
    group_success_filter,
    loss_normaliser,
    normalized,
    token_weights,
)
from vla_scale.config import AlgoConfig, ModelConfig
from vla_scale.models.processor import PreparedInputs

if TYPE_CHECKING:
    from vla_scale.envs.types import TaskSpec
    from vla_scale.models.processor import Processor

MeanOverRanks = Callable[[float], float]
"""A value's mean over the ranks of the run (the identity on one rank)."""


@dataclass
class Trajectory:
    """One episode, per executed chunk step: model inputs, action tokens, rollout log-probs, policy version.

    The inputs are exactly what the rollout decoded on: every camera the policy takes, as the towers saw them
    (resized and cropped, before normalisation), and the raw proprio; the update feeds them to
    `Processor.from_prepared`. Every recorded step counts for the loss: an episode ends at its first success, so the
    recorded steps are exactly those up to and including the first success; `executed` says how many of each
    chunk's actions ran (the last chunk stops at the success or at the step limit), so only their tokens do.
    """

    task: TaskSpec
    uid: str
    instruction: str = ""
    images: list[np.ndarray] = field(default_factory=list)  # uint8[cameras, S, S, 3] per chunk step, primary first
    proprio: list[np.ndarray] = field(default_factory=list)
    tokens: list[np.ndarray] = field(default_factory=list)  # [chunk*action_dim]: bins, or the l1 head's values
    executed: list[int] = field(default_factory=list)  # actions of each chunk that ran (fewer at the episode's end)
    logprobs: list[np.ndarray] = field(default_factory=list)  # [chunk*action_dim] per token, or [1] per chunk (π0)
    sampled: list[dict[str, np.ndarray]] = field(default_factory=list)  # a family's record per chunk (π0: its chain)
    versions: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)  # the env's reward of each chunk step (its steps' sum)
    success: bool = False
    env_steps: int = 0
    restarts: int = 0
    final_images: np.ndarray | None = None  # a truncated episode's last observation, as the towers see it
    final_proprio: np.ndarray | None = None

    @property
    def reward(self) -> float:
        """The episode's outcome, what GRPO compares within a group: 1 for success, else 0."""
        return float(self.success)

    @property
    def truncated(self) -> bool:
        """The step limit ended it before success: its return goes on past the last chunk (PPO bootstraps it from
        the final observation's value); a successful episode terminated."""
        return not self.success

    def __len__(self) -> int:
        return len(self.tokens)

    def restart(self) -> None:
        """Forget what was recorded: the episode starts again from its initial state."""
        self.images, self.proprio, self.tokens, self.logprobs, self.versions = [], [], [], [], []
        self.sampled = []
        self.executed, self.rewards = [], []
        self.success, self.env_steps = False, 0
        self.final_images = self.final_proprio = None
        self.restarts += 1



@dataclass
class StepBatch:
    """The groups kept for one update, and what the rollout saw before filtering."""

    groups: list[list[Trajectory]]
    success_rate: float
    rounds: int
    episodes: int
    env_steps: int = 0  # of every episode played, kept or not

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept episodes, group after group."""
        return [traj for group in self.groups for traj in group]


@dataclass(frozen=True)
class Sample:
    """One chunk step as the loss reads it: its episode, the step's index in it, the episode's advantage and the
    episode's index among the update's episodes (`trajectory_mean` weighs by episode). With a critic, a truncated
    episode also has one sample at `step == len(trajectory)`, its final observation, which only the critic reads
    (`bootstrap`: no action, no loss)."""

    trajectory: Trajectory
    step: int
    advantage: float
    episode: int

    @property
    def bootstrap(self) -> bool:
        return self.step == len(self.trajectory)


class MicroBatch(NamedTuple):
    """One forward/backward of an update, immutable: the inputs exactly as the rollout decoded on (host side, images
    uint8), the sampled tokens, the rollout's log-probs of them (the behaviour policy's), the advantages, the mask of
    the tokens that enter the loss and their weights (`algo.token_weights` of the whole mini-batch)."""

    inputs: PreparedInputs
    tokens: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    rows: RowIndex | None = None
    """With a critic: which chunk step each row is, and its weight in the value loss."""
    critic: CriticTargets | None = None
    """With a critic: the value loss's targets, set once the values are known (`with_critic_targets`)."""
    sampled: dict[str, torch.Tensor] | None = None
    """A family's record of what it sampled, stacked over the rows (π0: the chains the actor scores again); None for
    OFT, whose tokens say it all."""


class RowIndex(NamedTuple):
    """Which chunk step each row of a micro-batch is: its episode (index into `UpdatePlan.trajectories`), its step,
    whether it is an episode's final observation (`Sample.bootstrap`), and its weight in the mini-batch's value loss
    (0 for a final observation, which has no target)."""

    episode: torch.Tensor
    step: torch.Tensor
    bootstrap: torch.Tensor
    value_weights: torch.Tensor


class CriticTargets(NamedTuple):
    """The value loss's targets of a micro-batch's rows: the GAE returns and the values the advantages were computed
    with (the clipped value loss keeps the new values near them)."""

    returns: torch.Tensor
    old_values: torch.Tensor


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step: its micro-batches (accumulated), built once when the update is planned."""

    micro_batches: tuple[MicroBatch, ...]

    @property
    def rows(self) -> int:
        return sum(len(micro.inputs) for micro in self.micro_batches)


@dataclass(frozen=True)
class UpdatePlan:
    """An update, planned: its mini-batches and the episodes they come from (the critic's GAE runs per episode)."""

    minis: tuple[MiniBatch, ...]
    trajectories: tuple[Trajectory, ...] = ()


def policy_inputs(samples: list[Sample], processor: Processor) -> tuple[PreparedInputs, torch.Tensor]:
    """The policy's inputs of `samples` exactly as the rollout recorded them (host side: images uint8, normalised
    where they run), and their sampled tokens."""
    images = np.stack([_observed(s)[0] for s in samples])
    proprio = np.stack([_observed(s)[1] for s in samples])
    inputs = processor.encode(images, [s.trajectory.instruction for s in samples], proprio)
    return inputs, torch.from_numpy(np.stack([_recorded(s, s.trajectory.tokens) for s in samples]))


def _observed(sample: Sample) -> tuple[np.ndarray, np.ndarray]:
    """The images and proprio the sample's row sees: its chunk step's, or the episode's final observation."""
    traj = sample.trajectory
    if sample.bootstrap:
        assert traj.final_images is not None and traj.final_proprio is not None
        return traj.final_images, traj.final_proprio
    return traj.images[sample.step], traj.proprio[sample.step]


def _recorded(sample: Sample, per_step: list[np.ndarray]) -> np.ndarray:
    """What the rollout recorded for the sample's chunk step (zeros for a final observation: no action was drawn)."""
    return np.zeros_like(per_step[0]) if sample.bootstrap else per_step[sample.step]


def repeat_for_groups(specs: list[TaskSpec], group_size: int) -> list[TaskSpec]:
    """Each task spec `group_size` times in a row: the episodes of its group."""
    return [spec for spec in specs for _ in range(group_size)]


def group_uids(prefix: str, groups: int, group_size: int) -> list[str]:
    """One uid per episode, the same within a group: `<prefix>.<group>`."""
    return [f"{prefix}.{g}" for g in range(groups) for _ in range(group_size)]


def kept_groups(trajs: list[Trajectory], uids: list[str], algo: AlgoConfig) -> tuple[list[list[Trajectory]], float]:
    """The groups (`algo.group_size` consecutive episodes) whose mean success lies in [filter_low, filter_high], and
    the mean reward of all of `trajs`."""
    rewards = torch.tensor([t.reward for t in trajs])
    keep = group_success_filter(rewards, uids, algo.filter_low, algo.filter_high)
    size = algo.group_size
    members = [slice(g * size, (g + 1) * size) for g in range(len(trajs) // size)]
    return [trajs[m] for m in members if keep[m].all()], rewards.mean().item()


def mini_batch_samples(trajs: list[Trajectory], advantages: torch.Tensor, algo: AlgoConfig) -> list[list[Sample]]:
    """The samples of each mini-batch, shuffled: token_mean splits the shuffled chunk steps of the whole batch;
    trajectory_mean splits shuffled episodes, so a mini-batch holds whole episodes. With a critic a truncated episode
    has one more sample, its final observation."""
    episodes = [[Sample(traj, step, advantages[i].item(), i) for step in range(len(traj) + _bootstraps(traj, algo))]
                for i, traj in enumerate(trajs)]
    if algo.loss_agg == "token_mean":
        samples = [sample for episode in episodes for sample in episode]
        return [[samples[j] for j in part] for part in shuffled_parts(len(samples), algo.mini_batches)]
    minis = [[sample for i in part for sample in episodes[i]] for part in shuffled_parts(len(trajs), algo.mini_batches)]
    return [[mini[j] for j in torch.randperm(len(mini)).tolist()] for mini in minis]


def _bootstraps(traj: Trajectory, algo: AlgoConfig) -> int:
    """1 when the critic needs the value of the episode's final observation (truncated and bootstrapped), else 0."""
    return int(algo.has_critic and algo.critic.bootstrap_truncated and traj.truncated
               and traj.final_images is not None)


def shuffled_parts(n: int, parts: int) -> list[list[int]]:
    """0..n-1 shuffled (torch's global generator), cut into `parts` consecutive pieces of nearly equal size."""
    return [part.tolist() for part in np.array_split(np.array(torch.randperm(n).tolist(), dtype=np.int64), parts)]


def mini_batch(samples: list[Sample], algo: AlgoConfig, model: ModelConfig, processor: Processor,
               mean_over_ranks: MeanOverRanks) -> MiniBatch:
    """One mini-batch's micro-batches: token mask, loss weights, the rollout's log-probs. The loss normaliser is the
    mini-batch's over every rank's share of it (`algo.loss_normaliser`): each episode weighs what it would on one
    rank, DeepSpeed averaging the ranks' gradients."""
    executed = torch.tensor([0 if s.bootstrap else s.trajectory.executed[s.step] for s in samples])
    mask = logprob_mask(executed, samples[0].trajectory.logprobs[0].shape[-1], model)
    episodes = torch.tensor([s.episode for s in samples])
    normaliser = mean_over_ranks(loss_normaliser(mask, episodes, algo.loss_agg))
    weights = token_weights(mask, episodes, algo.loss_agg, normaliser).float()
    rollout = torch.from_numpy(np.stack([_recorded(s, s.trajectory.logprobs) for s in samples]))
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    rows = row_index(samples, mean_over_ranks) if algo.has_critic else None
    micro = []
    for part in np.array_split(np.arange(len(samples)), algo.micro_batches):
        inputs, tokens = policy_inputs([samples[j] for j in part], processor)
        index = None if rows is None else RowIndex(*(field[part] for field in rows))
        sampled = recorded_samples([samples[j] for j in part])
        micro.append(MicroBatch(inputs, tokens, rollout[part], advantages[part], mask[part], weights[part], index,
                                sampled=sampled))
    return MiniBatch(tuple(micro))


def logprob_mask(executed: torch.Tensor, width: int, model: ModelConfig) -> torch.Tensor:
    """Which recorded log-probs enter the loss, bool[M, width], as wide as the rollout recorded them: one per action
    token (OFT, `chunk_len * action_dim`: the executed actions' tokens), or one per chunk (width 1, a flow policy's
    whole chunk: every chunk step that ran counts, a final observation's row does not)."""
    if width == 1:
        return (executed > 0)[:, None]
    return executed_action_mask(executed, model.chunk_len, model.action_dim)


def recorded_samples(samples: list[Sample]) -> dict[str, torch.Tensor] | None:
    """The family's records of the samples' chunk steps stacked per key (a final observation's: zeros), or None when
    the family records none (OFT)."""
    first = samples[0].trajectory.sampled[0] if samples[0].trajectory.sampled else {}
    if not first:
        return None
    return {key: torch.from_numpy(np.stack([_recorded(s, [r[key] for r in s.trajectory.sampled]) for s in samples]))
            for key in first}


def row_index(samples: list[Sample], mean_over_ranks: MeanOverRanks) -> RowIndex:
    """The samples' episodes and steps, and their value-loss weights: the mean over the mini-batch's chunk steps (its
    final observations left out) of every rank's share, so several ranks weigh rows as one would."""
    bootstrap = torch.tensor([s.bootstrap for s in samples])
    counted = mean_over_ranks(float((~bootstrap).sum()))
    weights = (~bootstrap).float() / max(counted, 1e-12)
    return RowIndex(torch.tensor([s.episode for s in samples]), torch.tensor([s.step for s in samples]), bootstrap,
                    weights)


def plan_update(trajs: list[Trajectory], algo: AlgoConfig, model: ModelConfig, processor: Processor,
                mean_over_ranks: MeanOverRanks) -> UpdatePlan:
    """The update of the kept episodes (`StepBatch.trajectories`): GRPO advantages per group (with a critic they are
    made by `with_critic_targets` once the actor has the values), then the mini-batches, every micro-batch's inputs
    built here once. No mini-batch when some rank kept no episode: then no rank updates (every rank must run the
    same passes; ZeRO-3 gathers are collectives)."""
    if mean_over_ranks(float(bool(trajs))) < 1.0:
        return UpdatePlan(())
    if algo.has_critic:
        advantages = torch.zeros(len(trajs))
    else:
        advantages = group_advantages(torch.tensor([traj.reward for traj in trajs]), [traj.uid for traj in trajs])
    minis = tuple(mini_batch(samples, algo, model, processor, mean_over_ranks)
                  for samples in mini_batch_samples(trajs, advantages, algo))
    return UpdatePlan(minis, tuple(trajs))


def with_critic_targets(plan: UpdatePlan, values: list[list[torch.Tensor]], algo: AlgoConfig,
                        mean_over_ranks: MeanOverRanks) -> tuple[tuple[MiniBatch, ...], dict[str, float]]:
    """The plan's mini-batches with PPO's advantages and value targets, from `values` (the critic's, per micro-batch
    of each mini-batch, before the update): chunk-level GAE per episode (`algo.ppo.chunk_gae`; a successful episode
    terminated, a truncated one bootstrapped from its final observation's value), advantages normalised over every
    rank's chunk steps (`algo.normalize_advantages`; with `algo.critic.bootstrap_truncated=false` the step limit
    ends an episode as a success does). Also the metrics of what was made: the values', returns' and
    advantages' means, the advantages' std (before normalising) and the critic's explained variance."""
    per_episode = [np.zeros(len(traj)) for traj in plan.trajectories]
    last = np.zeros(len(plan.trajectories))
    for mini, mini_values in zip(plan.minis, values, strict=True):
        for micro, micro_values in zip(mini.micro_batches, mini_values, strict=True):
            assert micro.rows is not None
            for e, t, boot, v in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(),
                                     micro.rows.bootstrap.tolist(), micro_values.double().tolist(), strict=True):
                if boot:
                    last[e] = v
                else:
                    per_episode[e][t] = v
    ends = [not (traj.truncated and algo.critic.bootstrap_truncated) for traj in plan.trajectories]
    gae = [chunk_gae(torch.tensor(traj.rewards, dtype=torch.float64), torch.from_numpy(per_episode[e]),
                     float(last[e]), ends[e], algo.gamma, algo.gae_lambda)
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
    if algo.normalize_advantages:
        gae = [(normalized(a, mean, std), r) for a, r in gae]
    minis = tuple(MiniBatch(tuple(_targeted(micro, gae, per_episode, last) for micro in mini.micro_batches))
                  for mini in plan.minis)
    return minis, metrics


def without_final_rows(mini: MiniBatch, olds: list[torch.Tensor | None]
                       ) -> tuple[MiniBatch, list[torch.Tensor | None]]:
    """`mini` without its final-observation rows (and their old log-probs): the proximal pass read their values,
    and they have no action and no target, so the update's forward and backward skip them (a micro-batch of final
    observations alone keeps one, weighed 0, so every rank runs the same passes)."""
    kept_minis, kept_olds = [], []
    for micro, old in zip(mini.micro_batches, olds, strict=True):
        assert micro.rows is not None
        keep = np.flatnonzero(~micro.rows.bootstrap.numpy())
        keep = keep if len(keep) else np.arange(1)
        index = torch.from_numpy(keep)
        rows = RowIndex(*(field[index] for field in micro.rows))
        critic = None if micro.critic is None else CriticTargets(*(field[index] for field in micro.critic))
        sampled = None if micro.sampled is None else {k: v[index] for k, v in micro.sampled.items()}
        kept_minis.append(MicroBatch(micro.inputs.rows(keep), micro.tokens[index], micro.rollout_logprobs[index],
                                     micro.advantages[index], micro.mask[index], micro.weights[index], rows, critic,
                                     sampled))
        kept_olds.append(None if old is None else old[index])
    return MiniBatch(tuple(kept_minis)), kept_olds


def _targeted(micro: MicroBatch, gae: list[tuple[torch.Tensor, torch.Tensor]], values: list[np.ndarray],
              last: np.ndarray) -> MicroBatch:
    """`micro` with its rows' advantages, returns and old values (a final observation's: 0, 0 and its value)."""
    assert micro.rows is not None
    advantages, returns, old = [], [], []
    for e, t, boot in zip(micro.rows.episode.tolist(), micro.rows.step.tolist(), micro.rows.bootstrap.tolist(),
                          strict=True):
        advantage, ret = gae[e]
        advantages.append(0.0 if boot else float(advantage[t]))
        returns.append(0.0 if boot else float(ret[t]))
        old.append(float(last[e]) if boot else float(values[e][t]))
    return micro._replace(advantages=torch.tensor(advantages, dtype=torch.float32),
                          critic=CriticTargets(torch.tensor(returns, dtype=torch.float32),
                                               torch.tensor(old, dtype=torch.float32)))
