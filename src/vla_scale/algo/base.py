"""What an RL algorithm is to the rest of the trainer: `Algorithm`, the one class the trainer, the batches and the actor
talk to, so none of them asks which algorithm it holds.

The update of one step, and where an algorithm takes part in it:

    Trainer.update                                      Algorithm
      plan(trajectories, ...)  ------------------->  the planned batch (`batches.plan_update`), with a row for each
                                                     episode's final observation where `final_observation` asks, and
                                                     the advantages known from the outcomes alone (GRPO's)
    Actor (builds the algorithm `algo.name` names: `registry.make_algorithm`)
      needs_values  ------------------------------>  a value head trains beside the policy; the proximal pass reads
                                                     every row's value beside its old log-prob
      prepare(plan, olds, values, mean)  -------->  the mini-batches with the advantages that need the proximal
                                                     pass (PPO's, from the values) and their targets, the rows the
                                                     loss trains on, measures of what was made
      policy_trains(step), detach_backbone(step) ->  whether the policy loss counts this step (a critic's warm-up)
      loss_terms(micro, values, device)  -------->  what the algorithm adds to the clipped policy loss (a value loss)
      update_metrics(step)  --------------------->  the update's `train/` scalars of its own

Every algorithm trains the same clipped, token-weighted policy loss (`objectives/policy_loss.py`); they differ in the
advantages and in what they add. An algorithm is one module of this folder that defines `ALGORITHM`, its class;
`algo/registry.py` finds it by the module's name, which is what `algo.name` says. The settings are the run's `algo.*`
group, read by name (this layer imports no config).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import torch

from vla_scale.batches import MeanOverRanks, MiniBatch, UpdatePlan, plan_update


class Prepared(NamedTuple):
    """The mini-batches an update trains on, with their advantages; each micro-batch's old log-probs (None: its own
    update forward's, detached); the algorithm's measures of what it made (`train/` scalars)."""

    minis: tuple[MiniBatch, ...]
    olds: tuple[list[torch.Tensor | None], ...]
    metrics: dict[str, float]


class Algorithm:
    """An RL algorithm: its advantages and what it adds to the clipped policy loss (module docstring). Subclasses set
    `name` and override `planned` or `prepare` (where their advantages are made); the rest has defaults for an
    algorithm without a critic."""

    name: ClassVar[str] = ""
    needs_values: ClassVar[bool] = False
    """A value head trains beside the policy (its settings: `algo.critic.*`), and the proximal pass reads the values."""
    compares_groups: ClassVar[bool] = True
    """Advantages compare the episodes of one task spec's group: a group needs at least 2."""
    group_reason: ClassVar[str] = ""
    """With `compares_groups`: how the advantages use the group (what a group of one refusal says)."""

    def __init__(self, settings: Any):
        self.settings = settings

    @classmethod
    def config_problems(cls, settings: Any, steps: int) -> list[str]:
        """What contradicts itself in `settings` (the run's `algo.*`) for this algorithm, over a run of `steps`
        steps, each saying what to change; checked before anything starts (`config.validate`)."""
        if cls.compares_groups and settings.group_size < 2:
            return [f"algo.group_size={settings.group_size}: {cls.group_reason}, so a group needs at least 2 episodes "
                    "(algo=ppo trains groups of one)"]
        return []

    def final_observation(self, trajectory: Any) -> bool:
        """Whether the planned batch gets a row for the episode's final observation (no action, no policy loss): a
        critic bootstraps a truncated episode's return from its value."""
        return False

    def plan(self, trajectories: Sequence[Any], model: Any, processor: Any, mean_over_ranks: MeanOverRanks
             ) -> UpdatePlan:
        """The update's mini- and micro-batches of the kept episodes (`batches.plan_update`), with what the algorithm
        knows of them before the update (`planned`)."""
        return self.planned(plan_update(list(trajectories), self.settings, model, processor, mean_over_ranks,
                                        final_observation=self.final_observation))

    def planned(self, plan: UpdatePlan) -> UpdatePlan:
        """The plan with the advantages the episodes' outcomes alone give (none here: `prepare` makes them)."""
        return plan

    def prepare(self, plan: UpdatePlan, olds: Sequence[list[torch.Tensor | None]],
                values: Sequence[list[torch.Tensor]], mean_over_ranks: MeanOverRanks) -> Prepared:
        """The plan's mini-batches as the update trains on them, after the proximal pass: `olds` are each
        micro-batch's old log-probs, `values` (with `needs_values`) its rows' values before the update. Here the
        plan as it is (its advantages made by `planned`)."""
        return Prepared(plan.minis, tuple(olds), {})

    def policy_trains(self, step: int) -> bool:
        """Whether the policy loss counts at the run's `step` (False: only what `loss_terms` adds trains)."""
        return True

    def detach_backbone(self, step: int) -> bool:
        """Whether the value loss stops at the value head at `step` (with `needs_values`)."""
        return False

    def loss_terms(self, micro: Any, values: torch.Tensor | None, device: torch.device
                   ) -> tuple[torch.Tensor | None, dict[str, float]]:
        """What the algorithm adds to the micro-batch's share of the policy loss (None: nothing), and its measures
        as the micro-batch's share of the mini-batch's (summed over the micro-batches, averaged over the update's
        optimizer steps)."""
        return None, {}

    def update_metrics(self, step: int) -> dict[str, float]:
        """The algorithm's own `train/` scalars of the update at `step`."""
        return {}


def with_episode_advantages(plan: UpdatePlan, advantages: torch.Tensor) -> tuple[MiniBatch, ...]:
    """The plan's mini-batches with every row's advantage its episode's (`advantages` [episodes], indexed like
    `plan.trajectories`), float32."""
    per_episode = advantages.float()
    return tuple(MiniBatch(tuple(micro._replace(advantages=per_episode[micro.rows.episode])
                                 for micro in mini.micro_batches)) for mini in plan.minis)


class EpisodeOutcomes(Algorithm):
    """An algorithm whose advantage is one number per episode, from the outcomes of its group (e.g. GRPO): the
    same for each of its chunk steps, made when the update is planned; no critic."""

    episode_advantages: ClassVar[Callable[[torch.Tensor, list[str]], torch.Tensor]]
    """One advantage per episode from the episodes' rewards and group uids (a pure function of the module)."""

    def planned(self, plan: UpdatePlan) -> UpdatePlan:
        rewards = torch.tensor([traj.reward for traj in plan.trajectories])
        advantages = type(self).episode_advantages(rewards, [traj.uid for traj in plan.trajectories])
        return UpdatePlan(with_episode_advantages(plan, advantages), plan.trajectories)
