"""GRPO batches, named, from the episodes a step plays to what the actor takes.

A `Trajectory` is one episode as the env loop records it; `StepBatch` holds the groups kept for one update; each
chunk step of their episodes is a `Sample` (with its episode's group-normalised advantage); `plan_update` splits the
samples into `algo.mini_batches` optimizer steps (`MiniBatch`: token mask, loss weights, rollout and old log-probs),
each split into `algo.micro_batches` accumulation steps (`MicroBatch`, the inputs of one forward and backward of
`Actor.update`).
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
    logprob_mismatch,
    loss_normaliser,
    token_weights,
    truncated_is_weights,
)
from vla_scale.config import AlgoConfig, ModelConfig
from vla_scale.models.policy import PolicyInputs

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



class MicroBatch(NamedTuple):
    """One forward/backward of an update: inputs, sampled tokens, old log-probs (the rollout's, or recomputed),
    advantages, the mask of the tokens that enter the loss and their weights (`algo.token_weights`)."""

    inputs: PolicyInputs
    tokens: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor


@dataclass
class StepBatch:
    """The groups kept for one update, and what the rollout saw before filtering."""

    groups: list[list[Trajectory]]
    success_rate: float
    rounds: int
    episodes: int


@dataclass(frozen=True)
class Sample:
    """One chunk step as the loss reads it: its episode, the step's index in it, the episode's advantage and the
    episode's index among the update's episodes (`trajectory_mean` weighs by episode)."""

    trajectory: Trajectory
    step: int
    advantage: float
    episode: int


def policy_inputs(samples: list[Sample], processor: Processor) -> tuple[PolicyInputs, torch.Tensor]:
    """The policy's inputs of `samples` exactly as the rollout recorded them, and their sampled tokens. Built on the
    host: an update builds all its micro-batches before the first runs, and each moves when it runs."""
    images = np.stack([s.trajectory.images[s.step] for s in samples])
    proprio = np.stack([s.trajectory.proprio[s.step] for s in samples])
    inputs: PolicyInputs = processor.from_prepared(images, [s.trajectory.instruction for s in samples], proprio)
    return inputs, torch.from_numpy(np.stack([s.trajectory.tokens[s.step] for s in samples]))


@dataclass
class MiniBatch:
    """One optimizer step's samples, the tokens that enter the loss, their weights, the rollout's log-probs, the old
    log-probs of the loss (the rollout's, or the actor's once recomputed) and the split into micro-batches (index
    arrays into `samples`)."""

    samples: list[Sample]
    mask: torch.Tensor  # bool [R, K]
    weights: torch.Tensor  # float32 [R, K]
    rollout: torch.Tensor  # float32 [R, K]
    old: torch.Tensor  # float32 [R, K]
    parts: list[np.ndarray]

    def micro_batch(self, part: np.ndarray, processor: Processor) -> MicroBatch:
        inputs, tokens = policy_inputs([self.samples[j] for j in part], processor)
        advantages = torch.tensor([self.samples[j].advantage for j in part], dtype=torch.float32)
        return MicroBatch(inputs, tokens, self.old[part], advantages, self.mask[part], self.weights[part])

    def micro_batches(self, processor: Processor) -> list[MicroBatch]:
        return [self.micro_batch(part, processor) for part in self.parts]

    def recompute_old(self, logprobs: Callable[[PolicyInputs, torch.Tensor], torch.Tensor], processor: Processor,
                      tis_cap: float) -> None:
        """The old log-probs become `logprobs` (the actor's, before any optimizer step) on exactly the rollout's
        inputs, one micro-batch at a time (SimpleVLA-RL's way); with `tis_cap` > 0 the loss weights also get the
        truncated importance weights."""
        self.old = torch.cat([logprobs(*policy_inputs([self.samples[j] for j in part], processor))
                              for part in self.parts])
        if tis_cap > 0:
            self.weights = self.weights * truncated_is_weights(self.old, self.rollout, tis_cap)


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
    steps = [(e, k) for e, traj in enumerate(trajs) for k in range(len(traj))]
    if algo.loss_agg == "token_mean":
        order = torch.randperm(len(steps)).tolist()
        minis = [[steps[j] for j in part] for part in np.array_split(np.array(order), algo.mini_batches)]
    else:
        minis = []
        for part in np.array_split(np.array(torch.randperm(len(trajs)).tolist()), algo.mini_batches):
            mine = [(e, k) for e in part.tolist() for k in range(len(trajs[e]))]
            minis.append([mine[j] for j in torch.randperm(len(mine)).tolist()])
    return [[Sample(trajs[e], k, advantages[e].item(), e) for e, k in mini] for mini in minis]


def mini_batch(samples: list[Sample], algo: AlgoConfig, model: ModelConfig, mean_over_ranks: MeanOverRanks
               ) -> MiniBatch:
    """One mini-batch's samples with their token mask, loss weights, old log-probs (the rollout's) and micro-batch
    split. The loss normaliser is the mini-batch's over every rank's share of it (`algo.loss_normaliser`): each
    episode weighs what it would on one rank, DeepSpeed averaging the ranks' gradients."""
    executed = torch.tensor([s.trajectory.executed[s.step] for s in samples])
    mask = executed_action_mask(executed, model.chunk_len, model.action_dim)
    episodes = torch.tensor([s.episode for s in samples])
    normaliser = mean_over_ranks(loss_normaliser(mask, episodes, algo.loss_agg))
    weights = token_weights(mask, episodes, algo.loss_agg, normaliser).float()
    rollout = torch.from_numpy(np.stack([s.trajectory.logprobs[s.step] for s in samples]))
    parts = np.array_split(np.arange(len(samples)), algo.micro_batches)
    return MiniBatch(samples, mask, weights, rollout, rollout, parts)


def plan_update(groups: list[list[Trajectory]], algo: AlgoConfig, model: ModelConfig,
                mean_over_ranks: MeanOverRanks) -> list[MiniBatch]:
    """The update of the kept `groups`: GRPO advantages per group, then the mini-batches."""
    trajs = [t for group in groups for t in group]
    advantages = group_advantages(torch.tensor([t.reward for t in trajs]), [t.uid for t in trajs])
    return [mini_batch(samples, algo, model, mean_over_ranks)
            for samples in mini_batch_samples(trajs, advantages, algo)]


def step_mismatch(minis: list[MiniBatch], algo: AlgoConfig) -> dict[str, float]:
    """The rollout <-> actor log-prob mismatch over every valid token of the step (old log-probs recomputed)."""
    stats = logprob_mismatch(torch.cat([mb.old for mb in minis]), torch.cat([mb.rollout for mb in minis]),
                             torch.cat([mb.mask for mb in minis]), algo.clip_low, algo.clip_high)
    return {f"mismatch_{k}": v for k, v in stats.items()}
