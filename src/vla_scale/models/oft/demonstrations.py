"""OFT's demonstrations -> what the policy trains on, made the way the policy runs at rollout time.

Every env step t of every episode is one example: the camera images at t prepared as the towers see them
(`Processor.prepare`: the same resize and crop as a rollout), the raw proprio at t (the processor normalises it with
the policy's statistics), the instruction's prompt, and the chunk of actions t .. t+chunk_len-1 as the target (past
the episode's end the last action repeats, as OpenVLA-OFT's data pipeline pads chunks). Targets are the normalised
actions (`DatasetStats.normalize_actions`), as bins of the action tokenizer for the token head or as values for the
L1 head, in OFT's step-major order (chunk step, then action dimension). `OFTDemonstrations` is what the supervised
trainer sees of them (`models/interface.Demonstrations`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from vla_scale.datasets.episodes import Episode
from vla_scale.models.interface import chunk_index, draw_batches
from vla_scale.models.oft.actions import ActionTokenizer, DatasetStats
from vla_scale.models.oft.processor import PolicyInputs, Processor
from vla_scale.objectives.supervised import supervised_loss


def chunk_targets(actions: np.ndarray, chunk_len: int) -> np.ndarray:
    """float [T, A] -> [T, chunk_len, A]: at each step the next `chunk_len` actions, the last one repeated past the
    end of the episode."""
    return actions[chunk_index(len(actions), chunk_len)[0]]


class TokenBatch(NamedTuple):
    """An OFT micro-batch: the policy's inputs and its head's targets (a pair, as it unpacks)."""

    inputs: PolicyInputs
    targets: Tensor

    @property
    def examples(self) -> int:
        return len(self.targets)

    def loss(self, forward: Callable[..., Any], policy: nn.Module, device: torch.device | str, trim: bool
             ) -> tuple[Tensor, dict[str, float]]:
        """The head's supervised loss (`objectives.supervised_loss`): bins' cross-entropy or L1 regression."""
        logits = forward(self.inputs, device=device, trim=trim)
        return supervised_loss(logits, self.targets.to(device), policy.spec.action_head)


@dataclass(frozen=True)
class SupervisedExamples:
    """All examples of a dataset, inputs prepared once (uint8 images, raw proprio, instructions) and targets made."""

    images: np.ndarray  # uint8 [N, cameras, S, S, 3], as `Processor.prepare` gives them
    proprio: np.ndarray  # float32 [N, P], raw
    instructions: list[str]
    targets: np.ndarray  # [N, chunk_len * action_dim]: int64 bins (tokens head) or float32 normalised values (l1)

    @classmethod
    def build(cls, episodes: Sequence[Episode], processor: Processor, stats: DatasetStats, chunk_len: int,
              head: str, n_bins: int) -> SupervisedExamples:
        images, proprio, instructions, targets = [], [], [], []
        tokenizer = ActionTokenizer(n_bins)
        for episode in episodes:
            frames = np.stack([episode.images[camera] for camera in processor.cameras], axis=1)
            images.append(processor.transform.prepare(frames))
            proprio.append(episode.state.astype(np.float32))
            instructions += [episode.instruction] * len(episode)
            normalized = stats.normalize_actions(chunk_targets(episode.actions.astype(np.float64), chunk_len))
            flat = normalized.reshape(len(episode), -1)
            targets.append(tokenizer.to_bins(flat) if head == "tokens" else flat.astype(np.float32))
        return cls(np.concatenate(images), np.concatenate(proprio), instructions, np.concatenate(targets))

    def __len__(self) -> int:
        return len(self.instructions)

    def batch(self, index: np.ndarray, processor: Processor, device: torch.device | str = "cpu") -> TokenBatch:
        """The policy's inputs and the targets of the examples at `index`; pixels normalised on `device`."""
        inputs = processor.from_prepared(self.images[index], [self.instructions[i] for i in index],
                                         self.proprio[index], device)
        return TokenBatch(inputs, torch.from_numpy(self.targets[index]))


@dataclass(frozen=True)
class OFTDemonstrations:
    """`SupervisedExamples` with the processor that turns them into inputs (`models/interface.Demonstrations`): a
    step's draw is its example indices."""

    examples: SupervisedExamples
    processor: Processor

    def __len__(self) -> int:
        return len(self.examples)

    def draw(self, generator: np.random.Generator, batch_size: int) -> np.ndarray:
        return draw_batches(generator, len(self.examples), batch_size)

    def batch(self, draw: np.ndarray, positions: np.ndarray, device: torch.device | str = "cpu") -> TokenBatch:
        return self.examples.batch(draw[positions], self.processor, device)
