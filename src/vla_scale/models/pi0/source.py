"""Pi0Source: a π0 / π0.5 policy with everything that must agree with it, the family's `PolicySource`
(`models/interface.py`, most of it the flow families' `models/flow/source.FlowSource`): its spec, the PaliGemma
SentencePiece tokenizer, the env's cameras in the model's camera slots, and the norm stats its states and actions are
normalised with (made from the demonstrations by `with_demonstrations`, saved with the policy in openpi's
`assets/<asset_id>/norm_stats.json`).

π0's state and actions share the model's action size (`model.pi0.action_dim`); π0.5 reads the state only in its
prompt (discretised) where the spec says so. SFT augments its images as openpi trains π0 (`models/pi0/augment.py`)
unless `sft.image_augmentation=none`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from vla_scale.models.flow.layout import FlowLayout
from vla_scale.models.flow.normalize import FlowNormalizer, NormStats
from vla_scale.models.flow.source import FlowSource
from vla_scale.models.interface import EnvKeys
from vla_scale.models.kernels import use_kernels
from vla_scale.models.pi0.spec import Pi0Spec
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer

if TYPE_CHECKING:  # the model imports transformers' SigLIP: checking a policy against an env and data needs none
    from torch import Tensor, nn

    from vla_scale.models.flow.demonstrations import Augmentation
    from vla_scale.models.pi0.policy import Pi0Policy


class Pi0Source(FlowSource):
    """A π0 / π0.5 policy's spec, tokenizer, cameras and norm stats (module docstring)."""

    family = "pi0"
    augmentations = ("none", "openpi")
    """`sft.image_augmentation` values besides auto (auto is openpi, as openpi trains π0)."""
    keys = {"action_dim": "model.pi0.action_dim", "state_dim": "model.pi0.action_dim",
            "horizon": "model.pi0.action_horizon", "prompt": "model.pi0.max_token_len"}

    def __init__(self, spec: Pi0Spec, tokenizer: PaliGemmaTokenizer, env: str, source: str,
                 norm_stats: dict[str, NormStats] | None = None, asset_id: str = "", weights: str = "",
                 weights_asset: str = "", actions_per_chunk: int = 0):
        super().__init__(spec, tokenizer, env, source, norm_stats, weights, actions_per_chunk, asset_id)
        self.asset_id = asset_id
        """The asset id of the norm stats in use."""
        self.weights_asset = weights_asset
        """The asset id whose norm stats the weights' folder was read with."""

    @classmethod
    def fresh(cls, spec: Pi0Spec, tokenizer_file: str, env: str, source: str) -> Pi0Source:
        """A freshly initialised policy of `spec` (weights drawn by `new_policy`: seed torch first); ValueError when
        the tokenizer file is not a SentencePiece model or has more ids than the model embeds."""
        tokenizer = PaliGemmaTokenizer(tokenizer_file, spec.max_token_len)
        if tokenizer.vocab_size > spec.vocab_size:
            raise ValueError(f"the tokenizer {tokenizer_file} has {tokenizer.vocab_size} ids but the model embeds "
                             f"only {spec.vocab_size}: use the tokenizer the model was made for")
        return cls(spec, tokenizer, env, source)

    @classmethod
    def from_folder(cls, folder: str, env: str, tokenizer_file: str = "") -> Pi0Source:
        """The policy of a π0 / π0.5 checkpoint folder, openpi's layout or LeRobot's (`read_pi0_folder`: every check
        before a tensor is read; its weights load in `new_policy`). `tokenizer_file`: the SentencePiece model to
        use ('': the folder's own, which it must then have)."""
        from vla_scale.models.pi0.checkpoint import read_pi0_folder, tokenizer_problem

        spec, _, stats, own, found = read_pi0_folder(folder, load=False)
        path = tokenizer_file or own
        if path is None:
            raise ValueError(f"{folder} holds no tokenizer.model: set model.pi0.tokenizer to the PaliGemma "
                             "SentencePiece model the policy was trained with")
        problem = tokenizer_problem(Path(path), spec) if tokenizer_file else None
        if problem:
            raise ValueError(problem)
        asset = found.asset_id or ""
        return cls(spec, PaliGemmaTokenizer(str(path), spec.max_token_len), env, f"{folder} ({found.note})", stats,
                   asset, weights=folder, weights_asset=asset, actions_per_chunk=found.n_action_steps or 0)

    # ---- what the flow family's pieces read ------------------------------------------------------------------------
    @property
    def layout(self) -> FlowLayout:
        from vla_scale.models.pi0.demonstrations import resize_with_pad

        spec = self.spec
        return FlowLayout(image_size=spec.vision.image_size, num_images=spec.num_images,
                          action_horizon=spec.action_horizon, action_dim=spec.action_dim, state_dim=spec.action_dim,
                          num_steps=spec.num_steps, state_in_prompt=spec.state_in_prompt, resize=resize_with_pad)

    @property
    def budget(self) -> int:
        return self.spec.max_token_len

    @property
    def reads_state(self) -> bool:
        return not self.spec.pi05 or self.spec.state_in_prompt

    @property
    def value_width(self) -> int:
        return self.spec.paligemma.width

    def normalizer(self) -> FlowNormalizer | None:
        if self.norm_stats is None:
            return None
        return FlowNormalizer(self.norm_stats, self.spec.resolved_normalization, self.spec.resolved_norm_convention)

    def with_stats(self, stats: dict[str, NormStats], name: str) -> Pi0Source:
        return Pi0Source(self.spec, self.tokenizer, self.env, f"{self.source} + norm stats {name!r}", stats, name,
                         self.weights, self.weights_asset, self._actions_per_chunk)

    def augmentation(self, name: str) -> Augmentation | None:
        """openpi's augmentation of π0's images (auto or openpi), none."""
        from vla_scale.models.pi0.demonstrations import OPENPI_AUGMENTATION

        return None if name == "none" else OPENPI_AUGMENTATION

    def describe(self, env: EnvKeys | None = None) -> str:
        spec = self.spec
        rendered = f"rendered at {self.camera_resolution(env)} px, " if env is not None else ""
        stats = f"norm stats {self.asset_id!r} ({spec.resolved_normalization})" if self.norm_stats else \
            "no norm stats"
        return (f"{self.source}: {'π0.5' if spec.pi05 else 'π0'}, images {'+'.join(self.cameras)} {rendered}"
                f"resized with padding to {spec.vision.image_size} in {spec.num_images} slots; chunks of "
                f"{spec.action_horizon} x {spec.action_dim}, {spec.num_steps} Euler steps; prompts of up to "
                f"{spec.max_token_len} tokens ({self.tokenizer.path.name}); {stats}{self.noise_head_note()}")

    # ---- weights ---------------------------------------------------------------------------------------------------
    def unfilled_policy(self) -> Pi0Policy:
        """A policy of the spec without initialising its weights: the trainer's engine, which the first sync fills."""
        from transformers import initialization

        from vla_scale.models.pi0.policy import Pi0Policy

        with initialization.no_init_weights():
            return use_kernels(Pi0Policy(self.spec, noise_std=self.noise_head_std), self.kernels)
    def new_policy(self, zero3_init: bool = False) -> Pi0Policy:
        """The policy (the expert's LM head, which never runs, frozen): freshly initialised, or the weights of the
        checkpoint folder it came from (copied into ZeRO-3 shards under `zero3_init`), with `kernels`. A Flow-Noise
        policy's noise head comes from the folder's `noise_head.safetensors`, else stays freshly initialised."""
        from vla_scale.models.checkpoint_folders import copy_tensors
        from vla_scale.models.pi0.checkpoint import read_noise_head, read_pi0_folder
        from vla_scale.models.pi0.noise_head import PREFIX
        from vla_scale.models.pi0.policy import Pi0Policy

        policy = Pi0Policy.from_spec(self.spec, zero3_init=zero3_init, noise_std=self.noise_head_std)
        if self.weights:
            _, state, _, _, _ = read_pi0_folder(self.weights, self.weights_asset or None, check_shapes=False)
            if policy.noise_head is not None:
                state = {**state, **read_noise_head(self.weights, self.spec)}
            names = dict(policy.named_parameters())  # one name of each tied pair, as the policy holds it
            copy_tensors(policy, ((n, t) for n, t in state.items() if n in names), zero3_init, fresh=(PREFIX,))
        return use_kernels(policy, self.kernels)

    def write_folder(self, module: nn.Module, tensors: dict[str, Tensor], folder: str) -> None:
        """The gathered `tensors` as an openpi-layout folder with the norm stats and the tokenizer file
        (`models/pi0/checkpoint.write_pi0_folder`; a noise head's tensors beside, in `noise_head.safetensors`)."""
        import torch

        from vla_scale.models.pi0.checkpoint import write_pi0_folder
        from vla_scale.models.pi0.noise_head import PREFIX
        from vla_scale.models.pi0.policy import Pi0Policy

        policy = Pi0Policy(self.spec, noise_std=self.noise_std if any(k.startswith(PREFIX) for k in tensors) else None)
        with torch.no_grad():
            policy.load_openpi_state_dict({k: v.float() for k, v in tensors.items()})
        stats = self.norm_stats or self.identity_stats()
        write_pi0_folder(folder, policy, stats, tokenizer_file=str(self.tokenizer.path), layout="openpi",
                         asset_id=self.asset_id or "demonstrations")
