"""GRPO batches, named, from the episodes a step plays to what the actor takes: the record chain
`Trajectory -> Sample -> MiniBatch -> MicroBatch`, all in this module.

A `Trajectory` is one episode as the env loop records it; `StepBatch` holds the groups kept for one update; each
chunk step of their episodes is a `Sample` (with its episode's group-normalised advantage); `plan_update` splits the
samples into `algo.mini_batches` optimizer steps (`MiniBatch`), each split into `algo.micro_batches` accumulation
steps (`MicroBatch`: inputs, tokens, the rollout's log-probs, advantages, token mask and loss weights). Everything is
built once, when the update is planned, and never changes after: the old log-probs, the truncated importance weights
and the mismatch are the update's own (`Actor.grpo_update`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from vla_scale.algo import (
    executed_action_mask,
    group_advantages,
    group_success_filter,
    loss_normaliser,
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
    logprobs: list[np.ndarray] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    success: bool = False
    env_steps: int = 0
    restarts: int = 0

    @property
    def reward(self) -> float:
        return float(self.success)

    def __len__(self) -> int:
        return len(self.tokens)

    def restart(self) -> None:
        """Forget what was recorded: the episode starts again from its initial state."""
        self.images, self.proprio, self.tokens, self.logprobs, self.versions = [], [], [], [], []
        self.executed = []
        self.success, self.env_steps = False, 0
        self.restarts += 1



@dataclass
class StepBatch:
    """The groups kept for one update, and what the rollout saw before filtering."""

    groups: list[list[Trajectory]]
    success_rate: float
    rounds: int
    episodes: int

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept episodes, group after group."""
        return [traj for group in self.groups for traj in group]


@dataclass(frozen=True)
class Sample:
    """One chunk step as the loss reads it: its episode, the step's index in it, the episode's advantage and the
    episode's index among the update's episodes (`trajectory_mean` weighs by episode)."""

    trajectory: Trajectory
    step: int
    advantage: float
    episode: int


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


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step: its micro-batches (accumulated), built once when the update is planned."""

    micro_batches: tuple[MicroBatch, ...]

    @property
    def rows(self) -> int:
        return sum(len(micro.inputs) for micro in self.micro_batches)


def policy_inputs(samples: list[Sample], processor: Processor) -> tuple[PreparedInputs, torch.Tensor]:
    """The policy's inputs of `samples` exactly as the rollout recorded them (host side: images uint8, normalised
    where they run), and their sampled tokens."""
    images = np.stack([s.trajectory.images[s.step] for s in samples])
    proprio = np.stack([s.trajectory.proprio[s.step] for s in samples])
    inputs = processor.encode(images, [s.trajectory.instruction for s in samples], proprio)
    return inputs, torch.from_numpy(np.stack([s.trajectory.tokens[s.step] for s in samples]))


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
    trajectory_mean splits shuffled episodes, so a mini-batch holds whole episodes."""
    episodes = [[Sample(traj, step, advantages[i].item(), i) for step in range(len(traj))]
                for i, traj in enumerate(trajs)]
    if algo.loss_agg == "token_mean":
        samples = [sample for episode in episodes for sample in episode]
        return [[samples[j] for j in part] for part in shuffled_parts(len(samples), algo.mini_batches)]
    minis = [[sample for i in part for sample in episodes[i]] for part in shuffled_parts(len(trajs), algo.mini_batches)]
    return [[mini[j] for j in torch.randperm(len(mini)).tolist()] for mini in minis]


def shuffled_parts(n: int, parts: int) -> list[list[int]]:
    """0..n-1 shuffled (torch's global generator), cut into `parts` consecutive pieces of nearly equal size."""
    return [part.tolist() for part in np.array_split(np.array(torch.randperm(n).tolist(), dtype=np.int64), parts)]


def mini_batch(samples: list[Sample], algo: AlgoConfig, model: ModelConfig, processor: Processor,
               mean_over_ranks: MeanOverRanks) -> MiniBatch:
    """One mini-batch's micro-batches: token mask, loss weights, the rollout's log-probs. The loss normaliser is the
    mini-batch's over every rank's share of it (`algo.loss_normaliser`): each episode weighs what it would on one
    rank, DeepSpeed averaging the ranks' gradients."""
    executed = torch.tensor([s.trajectory.executed[s.step] for s in samples])
    mask = executed_action_mask(executed, model.chunk_len, model.action_dim)
    episodes = torch.tensor([s.episode for s in samples])
    normaliser = mean_over_ranks(loss_normaliser(mask, episodes, algo.loss_agg))
    weights = token_weights(mask, episodes, algo.loss_agg, normaliser).float()
    rollout = torch.from_numpy(np.stack([s.trajectory.logprobs[s.step] for s in samples]))
    advantages = torch.tensor([s.advantage for s in samples], dtype=torch.float32)
    micro = []
    for part in np.array_split(np.arange(len(samples)), algo.micro_batches):
        inputs, tokens = policy_inputs([samples[j] for j in part], processor)
        micro.append(MicroBatch(inputs, tokens, rollout[part], advantages[part], mask[part], weights[part]))
    return MiniBatch(tuple(micro))


def plan_update(trajs: list[Trajectory], algo: AlgoConfig, model: ModelConfig, processor: Processor,
                mean_over_ranks: MeanOverRanks) -> tuple[MiniBatch, ...]:
    """The update of the kept episodes (`StepBatch.trajectories`): GRPO advantages per group, then the mini-batches,
    every micro-batch's inputs built here once. Empty when some rank kept no episode: then no rank updates (every
    rank must run the same passes; ZeRO-3 gathers are collectives)."""
    if mean_over_ranks(float(bool(trajs))) < 1.0:
        return ()
    advantages = group_advantages(torch.tensor([traj.reward for traj in trajs]), [traj.uid for traj in trajs])
    return tuple(mini_batch(samples, algo, model, processor, mean_over_ranks)
                 for samples in mini_batch_samples(trajs, advantages, algo))
