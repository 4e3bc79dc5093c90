"""Pi0Source: a π0 / π0.5 policy with everything that must agree with it, the family's `PolicySource`
(`models/interface.py`): its spec, the PaliGemma SentencePiece tokenizer, the env's cameras in the model's camera
slots, and the norm stats its states and actions are normalised with (made from the demonstrations by
`with_demonstrations`, saved with the policy in openpi's `assets/<asset_id>/norm_stats.json`).

What fits an env: the env's action and proprio sizes at most the model's action size (a robot's vectors are
zero-padded to it), at most `num_images` cameras (the first ones, primary first; slots left over are masked). What
fits demonstrations: a horizon no longer than the shortest episode (its chunks would be mostly padding), prompts
within the budget. The rollout engine decodes it (`processor`, `chunk_decoder`: `models/pi0/rollout.py`): noise-free
for evaluation, for RL a Flow-SDE chain of noise level `noise_level` or a Flow-Noise chain (`rl_noise`), whose chunks
the actor scores again (`chunk_scorer`); GRPO and PPO train it (PPO's value head reads the PaliGemma prefix,
`value_width` wide). With Flow-Noise every policy it builds carries the noise head (`noise_std` its bounds): loaded
from the checkpoint folder's `noise_head.safetensors` when it has one, else freshly initialised (an SFT folder), as
`describe` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_scale.datasets.episodes import Episode
from vla_scale.envs.registry import simulator
from vla_scale.models.interface import EnvKeys
from vla_scale.models.kernels import use_kernels
from vla_scale.models.pi0.noise_head import FILE as NOISE_HEAD_FILE
from vla_scale.models.pi0.noise_head import STD_BOUNDS
from vla_scale.models.pi0.normalize import NormStats, Pi0Normalizer, norm_stats_of
from vla_scale.models.pi0.spec import Pi0Spec
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer

if TYPE_CHECKING:  # the model imports transformers' SigLIP: checking a policy against an env and data needs none
    from torch import Tensor, nn

    from vla_scale.models.pi0.demonstrations import Pi0Demonstrations
    from vla_scale.models.pi0.policy import Pi0Policy
    from vla_scale.models.pi0.rollout import Pi0Decoder, Pi0Processor, Pi0Scorer


class Pi0Source:
    """A π0 / π0.5 policy's spec, tokenizer, cameras and norm stats (module docstring)."""

    augmentations = ("none", "openpi")
    """`sft.image_augmentation` values besides auto (auto is openpi, as openpi trains π0)."""

    family = "pi0"

    def __init__(self, spec: Pi0Spec, tokenizer: PaliGemmaTokenizer, env: str, source: str,
                 norm_stats: dict[str, NormStats] | None = None, asset_id: str = "", weights: str = "",
                 weights_asset: str = "", actions_per_chunk: int = 0):
        self.spec, self.tokenizer, self.env, self.source = spec, tokenizer, env, source
        self.norm_stats, self.asset_id, self.weights = norm_stats, asset_id, weights
        self.weights_asset = weights_asset
        """The asset id whose norm stats the weights' folder was read with (`asset_id` is the stats in use)."""
        self._actions_per_chunk = actions_per_chunk
        self._policy: Pi0Policy | None = None
        self.noise_level = 0.5
        """RL's Flow-SDE noise level (`model.pi0.noise_level`)."""
        self.stochastic_steps = ""
        """Which steps of RL's chain are stochastic (`model.pi0.stochastic_steps`; '': the method's)."""
        self.rl_noise = "flow_sde"
        """How RL's chain is made stochastic (`model.pi0.rl_noise`): flow_sde or flow_noise."""
        self.noise_std = STD_BOUNDS
        """Flow-Noise's std bounds (min, max) (`model.pi0.noise_std_min`, `noise_std_max`)."""
        self.kernels = "eager"
        """The kernels every policy it builds runs (`model.kernels`, `models/kernels.py`)."""

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

    # ---- fitting the env -------------------------------------------------------------------------------------------
    @property
    def cameras(self) -> tuple[str, ...]:
        return simulator(self.env).cameras[: self.spec.num_images]

    @property
    def reads_state(self) -> bool:
        return not self.spec.pi05 or self.spec.state_in_prompt

    @property
    def value_width(self) -> int:
        return self.spec.paligemma.width

    def camera_resolution(self, env: EnvKeys) -> int:
        return env.camera_resolution or self.spec.vision.image_size

    def check_env(self, env: EnvKeys) -> list[str]:
        """Robot vectors wider than the model's; for π0 (whose prompt is the instruction alone), instructions of the
        tasks played whose prompts exceed the budget and would be cut. (π0.5's prompt carries the state too, known
        only as the episode runs.)"""
        face, width = simulator(env.name), self.spec.action_dim
        sizes = {"actions": face.action_dim, "proprio states": face.state_size(env.simulator_kwargs())}
        problems = [f"env {env.name!r} has {n}-d {what} but the policy's action size is {width}: set "
                    f"model.pi0.action_dim >= {n}" for what, n in sizes.items() if n > width]
        trained = self.trained_state_size()
        if trained and face.observation is not None and (problem := face.state_problem(
                trained, env.simulator_kwargs(), f"{self.source}'s norm stats say it was trained on")):
            problems.append(problem)
        if self.spec.state_in_prompt or env.suite not in face.suites:
            return problems
        played = face.instructions(env.suite)[: env.num_tasks]
        length, longest = max((len(self.tokenizer.prompt_ids(text)), text) for text in played)
        if length > self.spec.max_token_len:
            problems.append(f"the instruction {longest!r} of env.suite={env.suite} makes a prompt of {length} tokens "
                            f"> the policy's budget {self.spec.max_token_len}: set model.pi0.max_token_len={length} "
                            "(a checkpoint keeps its own budget: play tasks whose prompts fit it)")
        return problems

    def trained_state_size(self) -> int:
        """The size of the states the norm stats were made of (0: no state statistics)."""
        stats = (self.norm_stats or {}).get("state")
        return len(stats.mean) if stats is not None else 0

    def rollout_problems(self) -> list[str]:
        return []

    def training_problems(self, critic: bool = False) -> list[str]:
        """GRPO and PPO train it (PPO's value head reads the PaliGemma prefix: `Pi0Policy.value_features`)."""
        return []

    def recording_problems(self) -> list[str]:
        return [f"record.path replays each episode from the chunks the policy decoded, which {self.source} does not "
                "keep yet (a π0 chunk is sampled, not tokens): drop record.path"]

    # ---- rolling out (models/pi0/rollout.py) -----------------------------------------------------------------------
    @property
    def actions_per_chunk(self) -> int:
        """Actions of each chunk the env plays before the next decode: a LeRobot folder's `n_action_steps`, else
        the whole horizon."""
        return min(self._actions_per_chunk or self.spec.action_horizon, self.spec.action_horizon)

    def normalizer(self) -> Pi0Normalizer | None:
        """The norm stats' normaliser (None without norm stats: states and actions as they are)."""
        if self.norm_stats is None:
            return None
        return Pi0Normalizer(self.norm_stats, self.spec.resolved_normalization, self.spec.resolved_norm_convention)

    @property
    def processor(self) -> Pi0Processor:
        """Observations -> the model's inputs, as SFT prepares them."""
        from vla_scale.models.pi0.rollout import Pi0Processor

        return Pi0Processor(self.spec, self.cameras, self.tokenizer, self.normalizer())

    def chunk_decoder(self) -> Pi0Decoder:
        """What the rollout engine decodes a batch with: noise-free `sample_actions`, un-normalised and cut."""
        from vla_scale.models.pi0.rollout import Pi0Decoder

        return Pi0Decoder(self.normalizer(), simulator(self.env).action_dim, self.actions_per_chunk,
                          self.noise_level, self.stochastic_steps, self.rl_noise)

    def chunk_scorer(self) -> Pi0Scorer:
        """What the actor scores the rollout's chains with: their log-probs again, with gradients."""
        from vla_scale.models.pi0.rollout import Pi0Scorer

        return Pi0Scorer(self.spec, simulator(self.env).action_dim, self.actions_per_chunk, self.rl_noise)

    @property
    def noise_head_std(self) -> tuple[float, float] | None:
        """The noise head's std bounds for the policies it builds (Flow-Noise), else None (no head)."""
        return self.noise_std if self.rl_noise == "flow_noise" else None

    def unfilled_policy(self) -> Pi0Policy:
        """A policy of the spec without initialising its weights: the trainer's engine, which the first sync fills."""
        from transformers import initialization

        from vla_scale.models.pi0.policy import Pi0Policy

        with initialization.no_init_weights():
            return use_kernels(Pi0Policy(self.spec, noise_std=self.noise_head_std), self.kernels)

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The decoded actions in the env's convention: they are already (openpi's outputs are played as they
        come)."""
        return np.asarray(actions, dtype=np.float64)

    def simulator_kwargs(self, env: EnvKeys) -> dict[str, Any]:
        """The fleet's env kwargs: the env's own, rendered at `camera_resolution(env)`."""
        return {**env.simulator_kwargs(), "camera_resolution": self.camera_resolution(env)}

    @property
    def policy(self) -> Pi0Policy:
        """The policy (built on first use by `new_policy`, eval mode)."""
        if self._policy is None:
            self._policy = self.new_policy().eval()
        return self._policy

    def describe(self, env: EnvKeys | None = None) -> str:
        spec = self.spec
        rendered = f"rendered at {self.camera_resolution(env)} px, " if env is not None else ""
        stats = f"norm stats {self.asset_id!r} ({spec.resolved_normalization})" if self.norm_stats else \
            "no norm stats"
        return (f"{self.source}: {'π0.5' if spec.pi05 else 'π0'}, images {'+'.join(self.cameras)} {rendered}"
                f"resized with padding to {spec.vision.image_size} in {spec.num_images} slots; chunks of "
                f"{spec.action_horizon} x {spec.action_dim}, {spec.num_steps} Euler steps; prompts of up to "
                f"{spec.max_token_len} tokens ({self.tokenizer.path.name}); {stats}{self._noise_head_note()}")

    def _noise_head_note(self) -> str:
        """Where a Flow-Noise policy's noise head comes from ('' without one)."""
        if self.noise_head_std is None:
            return ""
        bounds = f"stds in [{self.noise_std[0]}, {self.noise_std[1]}]"
        if self.weights and (Path(self.weights) / NOISE_HEAD_FILE).is_file():
            return f"; RL's Flow-Noise head ({bounds}) from {Path(self.weights) / NOISE_HEAD_FILE}"
        where = f"{self.weights} has no {NOISE_HEAD_FILE}" if self.weights else "a fresh policy"
        return f"; RL's Flow-Noise head ({bounds}) freshly initialised ({where})"

    # ---- supervised fine-tuning ------------------------------------------------------------------------------------
    def demonstration_problems(self, episodes: Sequence[Episode]) -> list[str]:
        """A horizon longer than the shortest demonstration, robot vectors wider than the model's, prompts over the
        budget; each naming the key to change."""
        spec, problems = self.spec, []
        shortest = min(len(e) for e in episodes)
        if spec.action_horizon > shortest:
            problems.append(f"the policy's action horizon {spec.action_horizon} is longer than the shortest "
                            f"demonstration ({shortest} steps): its chunks would be mostly padding; set "
                            f"model.pi0.action_horizon <= {shortest}")
        for what, width in (("actions", episodes[0].actions.shape[1]), ("states", episodes[0].state.shape[1])):
            if width > spec.action_dim:
                problems.append(f"the demonstrations' {what} are {width}-d, wider than the policy's action size "
                                f"{spec.action_dim}: set model.pi0.action_dim >= {width}")
        for text in sorted({e.instruction for e in episodes}):
            state = episodes[0].state[0] if spec.state_in_prompt else None
            length = len(self.tokenizer.prompt_ids(text, state))
            if length > spec.max_token_len:
                problems.append(f"the instruction {text!r} makes a prompt of {length} tokens > the budget "
                                f"{spec.max_token_len}: set model.pi0.max_token_len={length}")
        return problems

    def with_demonstrations(self, key: str, episodes: Sequence[Episode]) -> Pi0Source:
        """This source with norm stats of the demonstrations' states and actions under `key` (the asset id)."""
        stats = {"state": norm_stats_of(np.concatenate([e.state for e in episodes])),
                 "actions": norm_stats_of(np.concatenate([e.actions for e in episodes]))}
        source = Pi0Source(self.spec, self.tokenizer, self.env, f"{self.source} + norm stats {key!r}", stats, key,
                           self.weights, self.weights_asset, self._actions_per_chunk)
        source.noise_level, source.stochastic_steps, source.kernels = (self.noise_level, self.stochastic_steps,
                                                                        self.kernels)
        source.rl_noise, source.noise_std = self.rl_noise, self.noise_std
        return source

    def demonstrations(self, episodes: Sequence[Episode], augmentation: str = "auto") -> Pi0Demonstrations:
        """The examples of `episodes`, prepared once; with `augmentation` auto or openpi each training batch's images
        are augmented as openpi trains π0 (`models/pi0/augment.py`)."""
        from vla_scale.models.pi0.demonstrations import Pi0Demonstrations

        if self.norm_stats is None:
            raise ValueError("no norm stats to normalise the demonstrations with: with_demonstrations first")
        normalizer = self.normalizer()
        assert normalizer is not None
        if augmentation not in ("auto", "none", "openpi"):
            raise ValueError(f"sft.image_augmentation={augmentation}: choose auto, none or openpi")
        return Pi0Demonstrations.build(episodes, self.spec, self.cameras, normalizer, self.tokenizer,
                                       augment=augmentation != "none")

    # ---- weights ---------------------------------------------------------------------------------------------------
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

    def identity_stats(self) -> dict[str, NormStats]:
        """Statistics that leave states and actions as they are (up to openpi's 1e-6 on the divisor): what a folder
        of a policy without norm stats (a fresh one that RL trained) is written with."""
        zeros, ones = np.zeros(self.spec.action_dim), np.ones(self.spec.action_dim)
        same = NormStats(mean=zeros, std=ones, q01=-ones, q99=ones)
        return {"state": same, "actions": same}

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
