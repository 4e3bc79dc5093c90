"""Demonstrations -> what the policy trains on, made the way the policy runs at rollout time.

Every env step t of every episode is one example: the camera images at t prepared as the towers see them
(`Processor.prepare`: the same resize and crop as a rollout), the raw proprio at t (the processor normalises it with
the policy's statistics), the instruction's prompt, and the chunk of actions t .. t+chunk_len-1 as the target (past
the episode's end the last action repeats, as OpenVLA-OFT's data pipeline pads chunks). Targets are the normalised
actions (`DatasetStats.normalize_actions`), as bins of the action tokenizer for the token head or as values for the
L1 head, in OFT's step-major order (chunk step, then action dimension).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from vla_scale.datasets.episodes import Episode
from vla_scale.models.actions import ActionTokenizer, DatasetStats
from vla_scale.models.processor import PolicyInputs, Processor


def chunk_targets(actions: np.ndarray, chunk_len: int) -> np.ndarray:
    """float [T, A] -> [T, chunk_len, A]: at each step the next `chunk_len` actions, the last one repeated past the
    end of the episode."""
    index = np.minimum(np.arange(len(actions))[:, None] + np.arange(chunk_len)[None, :], len(actions) - 1)
    return actions[index]


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

    def batch(self, index: np.ndarray, processor: Processor, device: torch.device | str = "cpu"
              ) -> tuple[PolicyInputs, torch.Tensor]:
        """The policy's inputs and the targets of the examples at `index`; pixels normalised on `device`."""
        inputs = processor.from_prepared(self.images[index], [self.instructions[i] for i in index],
                                         self.proprio[index], device)
        return inputs, torch.from_numpy(self.targets[index])


def draw_batches(generator: np.random.Generator, size: int, batch_size: int) -> np.ndarray:
    """One step's example indices [batch_size]: a uniform draw without replacement (with it when the dataset has
    fewer examples than a batch)."""
    return generator.choice(size, batch_size, replace=size < batch_size)
