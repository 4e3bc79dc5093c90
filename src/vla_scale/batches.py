"""The update's batches, named, from the episodes a step plays to what the actor takes: the record chain
`Trajectory -> Sample -> MiniBatch -> MicroBatch`, all in this module.

A `Trajectory` is one episode as the env loop records it; `StepBatch` holds the groups kept for one update; each
chunk step of their episodes is a `Sample` (and, where the algorithm asks, an episode's final observation);
`plan_update` splits the samples into `algo.mini_batches` optimizer steps (`MiniBatch`), each split into
`algo.micro_batches` accumulation steps (`MicroBatch`: inputs, tokens, the rollout's log-probs, token mask and loss
weights, which episode and step each row is), and returns them as an `UpdatePlan`. Everything is built once, when the
update is planned; the advantages (and any targets) are the algorithm's (`algo/`), set once the update has read the
old log-probs (and values); the old log-probs, the truncated importance weights and the mismatch are the update's own
(`Actor.update`). This module knows no algorithm and no config: it reads the `algo.*` and `model.*` keys it needs by
name (`BatchSettings`, `ActionShape`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, NamedTuple, Protocol

import numpy as np
import torch

from vla_scale.models.oft.processor import PreparedInputs
from vla_scale.objectives import group_success_filter, loss_normaliser, token_weights

if TYPE_CHECKING:
    from vla_scale.envs.types import TaskSpec
    from vla_scale.models.oft.processor import Processor

MeanOverRanks = Callable[[float], float]
"""A value's mean over the ranks of the run (the identity on one rank)."""


class BatchSettings(Protocol):
    """The `algo.*` keys that group, filter and split a step's episodes."""

    group_size: int
    filter_low: float
    filter_high: float
    loss_agg: str
    mini_batches: int
    micro_batches: int


class ActionShape(Protocol):
    """The `model.*` keys of a chunk's layout: its actions and their dimensions."""

    chunk_len: int
    action_dim: int


FinalObservation = Callable[["Trajectory"], bool]
"""Whether a planned batch gets a row for an episode's final observation (the algorithm's `final_observation`)."""

NO_TARGETS: Mapping[str, torch.Tensor] = MappingProxyType({})


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
        """The step limit ended it before success: its return goes on past the last chunk (a critic may bootstrap it
        from the final observation's value); a successful episode terminated."""
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
    outcomes: tuple[tuple[int, bool], ...] = ()  # (task id, success) of each episode of the first round

    @property
    def trajectories(self) -> list[Trajectory]:
        """The kept episodes, group after group."""
        return [traj for group in self.groups for traj in group]


@dataclass(frozen=True)
class Sample:
    """One chunk step as the loss reads it: its episode, the step's index in it and the episode's index among the
    update's episodes (`trajectory_mean` weighs by episode). Where the algorithm asks (`FinalObservation`), an episode
    also has one sample at `step == len(trajectory)`, its final observation, which only a critic reads (`final`: no
    action, no policy loss)."""

    trajectory: Trajectory
    step: int
    episode: int

    @property
    def final(self) -> bool:
        return self.step == len(self.trajectory)


class RowIndex(NamedTuple):
    """Which chunk step each row of a micro-batch is: its episode (index into `UpdatePlan.trajectories`), its step,
    and whether it is an episode's final observation (`Sample.final`)."""

    episode: torch.Tensor
    step: torch.Tensor
    final: torch.Tensor

    @staticmethod
    def first_steps(rows: int) -> RowIndex:
        """`rows` rows, each the first chunk step of an episode of its own: a micro-batch made by hand (benchmarks,
        tests), not planned from episodes."""
        return RowIndex(torch.arange(rows), torch.zeros(rows, dtype=torch.long), torch.zeros(rows, dtype=torch.bool))


class MicroBatch(NamedTuple):
    """One forward/backward of an update, immutable: the inputs exactly as the rollout decoded on (host side, images
    uint8), the sampled tokens, the rollout's log-probs of them (the behaviour policy's), the advantages (zeros until
    the algorithm sets them), the mask of the tokens that enter the loss and their weights (`token_weights` of the
    whole mini-batch), and which chunk step each row is."""

    inputs: PreparedInputs
    tokens: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    weights: torch.Tensor
    rows: RowIndex
    targets: Mapping[str, torch.Tensor] = NO_TARGETS
    """The algorithm's per-row tensors beyond the advantages, by name (PPO: the value loss's returns, old values and
    weights), set with the advantages."""
    sampled: Mapping[str, torch.Tensor] = NO_TARGETS
    """A family's record of what it sampled beyond the tokens, stacked over the rows (π0: the chains the actor scores
    again; OFT's tokens say it all: empty)."""

    def rows_at(self, keep: np.ndarray) -> MicroBatch:
        """The micro-batch of the rows `keep` (indices, in order)."""
        index = torch.from_numpy(keep)
        return MicroBatch(self.inputs.rows(keep), self.tokens[index], self.rollout_logprobs[index],
                          self.advantages[index], self.mask[index], self.weights[index],
                          RowIndex(*(field[index] for field in self.rows)),
                          {key: value[index] for key, value in self.targets.items()},
                          {key: value[index] for key, value in self.sampled.items()})


@dataclass(frozen=True)
class MiniBatch:
    """One optimizer step: its micro-batches (accumulated), built once when the update is planned."""

    micro_batches: tuple[MicroBatch, ...]

    @property
    def rows(self) -> int:
        return sum(len(micro.inputs) for micro in self.micro_batches)


@dataclass(frozen=True)
class UpdatePlan:
    """An update, planned: its mini-batches and the episodes they come from (`MicroBatch.rows` index them)."""

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
    if sample.final:
        assert traj.final_images is not None and traj.final_proprio is not None
        return traj.final_images, traj.final_proprio
    return traj.images[sample.step], traj.proprio[sample.step]


def _recorded(sample: Sample, per_step: list[np.ndarray]) -> np.ndarray:
    """What the rollout recorded for the sample's chunk step (zeros for a final observation: no action was drawn)."""
    return np.zeros_like(per_step[0]) if sample.final else per_step[sample.step]


def repeat_for_groups(specs: list[TaskSpec], group_size: int) -> list[TaskSpec]:
    """Each task spec `group_size` times in a row: the episodes of its group."""
    return [spec for spec in specs for _ in range(group_size)]


def group_uids(prefix: str, groups: int, group_size: int) -> list[str]:
    """One uid per episode, the same within a group: `<prefix>.<group>`."""
    return [f"{prefix}.{g}" for g in range(groups) for _ in range(group_size)]


def kept_groups(trajs: list[Trajectory], uids: list[str], algo: BatchSettings
                ) -> tuple[list[list[Trajectory]], float]:
    """The groups (`algo.group_size` consecutive episodes) whose mean success lies in [filter_low, filter_high], and
    the mean reward of all of `trajs`."""
    rewards = torch.tensor([t.reward for t in trajs])
    keep = group_success_filter(rewards, uids, algo.filter_low, algo.filter_high)
    size = algo.group_size
    members = [slice(g * size, (g + 1) * size) for g in range(len(trajs) // size)]
    return [trajs[m] for m in members if keep[m].all()], rewards.mean().item()


def mini_batch_samples(trajs: list[Trajectory], algo: BatchSettings, final_observation: FinalObservation
                       ) -> list[list[Sample]]:
    """The samples of each mini-batch, shuffled: token_mean splits the shuffled chunk steps of the whole batch;
    trajectory_mean splits shuffled episodes, so a mini-batch holds whole episodes. An episode the algorithm asks it
    of (`final_observation`) has one more sample, its final observation."""
    episodes = [[Sample(traj, step, i) for step in range(len(traj) + int(final_observation(traj)))]
                for i, traj in enumerate(trajs)]
    if algo.loss_agg == "token_mean":
        samples = [sample for episode in episodes for sample in episode]
        return [[samples[j] for j in part] for part in shuffled_parts(len(samples), algo.mini_batches)]
    minis = [[sample for i in part for sample in episodes[i]] for part in shuffled_parts(len(trajs), algo.mini_batches)]
    return [[mini[j] for j in torch.randperm(len(mini)).tolist()] for mini in minis]


def shuffled_parts(n: int, parts: int) -> list[list[int]]:
    """0..n-1 shuffled (torch's global generator), cut into `parts` consecutive pieces of nearly equal size."""
    return [part.tolist() for part in np.array_split(np.array(torch.randperm(n).tolist(), dtype=np.int64), parts)]


def mini_batch(samples: list[Sample], algo: BatchSettings, model: ActionShape, processor: Processor,
               mean_over_ranks: MeanOverRanks) -> MiniBatch:
    """One mini-batch's micro-batches: token mask, loss weights, the rollout's log-probs. The loss normaliser is the
    mini-batch's over every rank's share of it (`algo.loss_normaliser`): each episode weighs what it would on one
    rank, DeepSpeed averaging the ranks' gradients."""
    executed = torch.tensor([0 if s.final else s.trajectory.executed[s.step] for s in samples])
    mask = logprob_mask(executed, samples[0].trajectory.logprobs[0].shape[-1], model)
    episodes = torch.tensor([s.episode for s in samples])
    normaliser = mean_over_ranks(loss_normaliser(mask, episodes, algo.loss_agg))
    weights = token_weights(mask, episodes, algo.loss_agg, normaliser).float()
    rollout = torch.from_numpy(np.stack([_recorded(s, s.trajectory.logprobs) for s in samples]))
    rows = RowIndex(torch.tensor([s.episode for s in samples]), torch.tensor([s.step for s in samples]),
                    torch.tensor([s.final for s in samples]))
    micro = []
    for part in np.array_split(np.arange(len(samples)), algo.micro_batches):
        inputs, tokens = policy_inputs([samples[j] for j in part], processor)
        micro.append(MicroBatch(inputs, tokens, rollout[part], torch.zeros(len(part)), mask[part], weights[part],
                                RowIndex(*(field[part] for field in rows)),
                                sampled=recorded_samples([samples[j] for j in part])))
    return MiniBatch(tuple(micro))


def logprob_mask(executed: torch.Tensor, width: int, model: ActionShape) -> torch.Tensor:
    """Which recorded log-probs enter the loss, bool[M, width], as wide as the rollout recorded them: a record of
    `width` log-probs per chunk covers its `chunk_len * action_dim` action tokens in order, each log-prob an equal run
    of them, and counts when the first action of its run was executed. One per action token (OFT's): the executed
    actions' tokens; one per chunk (π0's whole chunk): every chunk step that ran, not a final observation's row."""
    tokens = model.chunk_len * model.action_dim
    if width < 1 or tokens % width:
        raise ValueError(f"a record of {width} log-probs per chunk does not divide its {tokens} action tokens")
    first_action = torch.arange(width) * (tokens // width) // model.action_dim
    return first_action[None, :] < executed[:, None]


def recorded_samples(samples: list[Sample]) -> dict[str, torch.Tensor]:
    """The family's records of the samples' chunk steps stacked per key (a final observation's: zeros); empty when
    the family records nothing beyond the tokens (OFT)."""
    first = samples[0].trajectory.sampled[0] if samples[0].trajectory.sampled else {}
    return {key: torch.from_numpy(np.stack([_recorded(s, [r[key] for r in s.trajectory.sampled]) for s in samples]))
            for key in first}


def plan_update(trajs: list[Trajectory], algo: BatchSettings, model: ActionShape, processor: Processor,
                mean_over_ranks: MeanOverRanks, final_observation: FinalObservation = lambda traj: False
                ) -> UpdatePlan:
    """The update of the kept episodes (`StepBatch.trajectories`): the mini-batches, every micro-batch's inputs built
    here once (their advantages are the algorithm's to set: `algo/base.Algorithm.prepare`). No mini-batch when some
    rank kept no episode: then no rank updates (every rank must run the same passes; ZeRO-3 gathers are
    collectives)."""
    if mean_over_ranks(float(bool(trajs))) < 1.0:
        return UpdatePlan(())
    minis = tuple(mini_batch(samples, algo, model, processor, mean_over_ranks)
                  for samples in mini_batch_samples(trajs, algo, final_observation))
    return UpdatePlan(minis, tuple(trajs))
