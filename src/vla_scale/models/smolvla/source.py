"""SmolVLASource: a SmolVLA policy with everything that must agree with it, the family's `PolicySource`
(`models/interface.py`, most of it the flow families' `models/flow/source.FlowSource`): its spec, the VLM's
tokenizer, the env's cameras in the model's camera slots, and the dataset statistics its states and actions are
normalised with as LeRobot normalises them (mean and std, LeRobot's epsilon; made from the demonstrations by
`with_demonstrations`, saved in the folder's processor files).

Frames are resized to the model's side as LeRobot's policy resizes them (`images.resize_with_pad`: bilinear, padded
on the left and top) and kept as uint8 until the batch is built, so a frame already rendered at that side (the
default: `camera_resolution` is the model's side) reaches the tower exactly as LeRobot's would.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vla_scale.models.flow.layout import FlowLayout
from vla_scale.models.flow.normalize import FlowNormalizer, NormStats
from vla_scale.models.flow.source import FlowSource
from vla_scale.models.interface import EnvKeys
from vla_scale.models.kernels import use_kernels
from vla_scale.models.smolvla.spec import SmolVLASpec
from vla_scale.models.smolvla.tokenizer import SmolVLATokenizer

if TYPE_CHECKING:
    from torch import Tensor, nn

    from vla_scale.models.smolvla.policy import SmolVLAPolicy


def resize_frame(frame: np.ndarray, side: int) -> np.ndarray:
    """uint8 [H, W, 3] -> uint8 [side, side, 3] by LeRobot's SmolVLA resize (on [0, 1] floats, rounded back)."""
    if frame.shape[:2] == (side, side):
        return frame
    import torch

    from vla_scale.models.smolvla.images import resize_with_pad

    pixels = torch.from_numpy(np.ascontiguousarray(frame)).permute(2, 0, 1).float() / 255.0
    resized = resize_with_pad(pixels, side, side)
    return (resized.clamp(0.0, 1.0) * 255.0).round().to(torch.uint8).permute(1, 2, 0).numpy()


class SmolVLASource(FlowSource):
    """A SmolVLA policy's spec, tokenizer, cameras and statistics (module docstring)."""

    family = "smolvla"
    keys = {"action_dim": "model.smolvla.max_action_dim", "state_dim": "model.smolvla.max_state_dim",
            "horizon": "model.smolvla.chunk_size", "prompt": "model.smolvla.tokenizer_max_length"}

    @classmethod
    def fresh(cls, spec: SmolVLASpec, tokenizer_folder: str, env: str, source: str, actions_per_chunk: int = 0
              ) -> SmolVLASource:
        """A freshly initialised policy of `spec` (weights drawn by `new_policy`: seed torch first); ValueError when
        the tokenizer has more ids than the model embeds."""
        tokenizer = SmolVLATokenizer(tokenizer_folder, spec.tokenizer_max_length)
        if tokenizer.vocab_size > spec.text.vocab_size:
            raise ValueError(f"the tokenizer in {tokenizer_folder} has {tokenizer.vocab_size} ids but the model embeds "
                             f"only {spec.text.vocab_size}: use the tokenizer the VLM was made for")
        return cls(spec, tokenizer, env, source, actions_per_chunk=actions_per_chunk)

    @classmethod
    def from_folder(cls, folder: str, env: str, tokenizer_folder: str = "") -> SmolVLASource:
        """The policy of a LeRobot SmolVLA folder (`read_smolvla_folder`: every check before a tensor is read; its
        weights load in `new_policy`). `tokenizer_folder`: the tokenizer to use ('': the folder's own)."""
        from vla_scale.models.smolvla.checkpoint import read_smolvla_folder

        spec, stats, own, found = read_smolvla_folder(folder)
        path = tokenizer_folder or own
        if path is None:
            raise ValueError(f"{folder} holds no tokenizer/ folder: set model.smolvla.tokenizer to the folder of the "
                             "VLM's tokenizer (SmolVLM2's tokenizer.json and tokenizer_config.json)")
        return cls(spec, SmolVLATokenizer(path, spec.tokenizer_max_length), env, f"{folder} ({found.note})", stats,
                   weights=folder, actions_per_chunk=found.n_action_steps or 0)

    # ---- what the flow family's pieces read ------------------------------------------------------------------------
    @property
    def layout(self) -> FlowLayout:
        spec = self.spec
        return FlowLayout(image_size=spec.image_size, num_images=spec.num_images, action_horizon=spec.chunk_size,
                          action_dim=spec.max_action_dim, state_dim=spec.max_state_dim, num_steps=spec.num_steps,
                          resize=resize_frame)

    @property
    def budget(self) -> int:
        return self.spec.tokenizer_max_length

    @property
    def value_width(self) -> int:
        return self.spec.text.width

    def normalizer(self) -> FlowNormalizer | None:
        """LeRobot's MEAN_STD normaliser of SmolVLA's states and actions."""
        return None if self.norm_stats is None else FlowNormalizer(self.norm_stats, "zscore", "lerobot")

    def with_stats(self, stats: dict[str, NormStats], name: str) -> SmolVLASource:
        return SmolVLASource(self.spec, self.tokenizer, self.env, f"{self.source} + statistics {name!r}", stats,
                             self.weights, self._actions_per_chunk, name)

    def describe(self, env: EnvKeys | None = None) -> str:
        spec = self.spec
        rendered = f"rendered at {self.camera_resolution(env)} px, " if env is not None else ""
        named = f" {self.stats_name!r}" if self.stats_name else " of the folder"
        stats = f"statistics{named} (mean/std)" if self.norm_stats else "no statistics"
        return (f"{self.source}: SmolVLA ({spec.num_vlm_layers} VLM layers of width {spec.text.width}, expert "
                f"{spec.expert_width}), images {'+'.join(self.cameras)} {rendered}resized with padding to "
                f"{spec.image_size} in {spec.num_images} slots; chunks of {spec.chunk_size} x {spec.max_action_dim}, "
                f"{spec.num_steps} Euler steps; prompts of up to {spec.tokenizer_max_length} tokens "
                f"({self.tokenizer.path.name}); {stats}{self.noise_head_note()}")

    # ---- weights ---------------------------------------------------------------------------------------------------
    def unfilled_policy(self) -> SmolVLAPolicy:
        """A policy of the spec without initialising its weights: the trainer's engine, which the first sync fills."""
        from vla_scale.models.smolvla.policy import SmolVLAPolicy

        return use_kernels(SmolVLAPolicy(self.spec, noise_std=self.noise_head_std), self.kernels)

    def new_policy(self, zero3_init: bool = False) -> SmolVLAPolicy:
        """The policy: freshly initialised, or the weights of the folder it came from (copied into ZeRO-3 shards
        under `zero3_init`), with `kernels`. A Flow-Noise policy's noise head comes from the folder's
        `noise_head.safetensors`, else stays freshly initialised."""
        from safetensors.torch import load_file

        from vla_scale.models.checkpoint_folders import copy_tensors
        from vla_scale.models.flow.noise_head import FILE, PREFIX
        from vla_scale.models.smolvla.checkpoint import load_weights
        from vla_scale.models.smolvla.policy import SmolVLAPolicy

        policy = SmolVLAPolicy.from_spec(self.spec, zero3_init=zero3_init, noise_std=self.noise_head_std)
        if self.weights:
            state = load_weights(self.weights)
            head = Path(self.weights) / FILE
            if policy.noise_head is not None and head.is_file():
                state |= load_file(str(head))
            names = dict(policy.named_parameters())
            copy_tensors(policy, ((n, t) for n, t in state.items() if n in names), zero3_init, fresh=(PREFIX,),
                         optional=tuple(n for n in names if n.endswith("lm_head.weight")))
        return use_kernels(policy, self.kernels)

    def write_folder(self, module: nn.Module, tensors: dict[str, Tensor], folder: str) -> None:
        """The gathered `tensors` as a LeRobot SmolVLA folder with the statistics and the tokenizer
        (`checkpoint.write_smolvla_folder`)."""
        from vla_scale.models.smolvla.checkpoint import write_smolvla_folder

        write_smolvla_folder(folder, {k: v.float() for k, v in tensors.items()}, self.spec,
                             self.norm_stats or self.identity_stats(), self.tokenizer.path, list(self.cameras),
                             self.actions_per_chunk)
