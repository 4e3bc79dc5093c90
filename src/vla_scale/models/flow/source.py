"""FlowSource: what every flow-matching family's `PolicySource` (`models/interface.py`) does the same way; a family's
source (π0's `models/pi0/source.Pi0Source`) adds its spec, tokenizer, checkpoint folders and policy class.

What fits an env: the env's action and proprio sizes at most the model's (a robot's vectors are zero-padded to
them), at most `num_images` cameras (the first ones, primary first; slots left over are masked), instructions whose
prompts fit the budget. What fits demonstrations: a horizon no longer than the shortest episode (its chunks would be
mostly padding), robot vectors within the model's widths, prompts within the budget. The rollout engine decodes it
(`processor`, `chunk_decoder`: `models/flow/rollout.py`): noise-free for evaluation, for RL a Flow-SDE chain of noise
level `noise_level` or a Flow-Noise chain (`rl_noise`), whose chunks the actor scores again (`chunk_scorer`); every
algorithm trains it (a critic's value head reads the prefix, `value_width` wide). With Flow-Noise every policy it builds
carries the noise head (`noise_std` its bounds): loaded from the checkpoint folder's `noise_head.safetensors` when it
has one, else freshly initialised (an SFT folder), as `describe` says.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vla_scale.datasets.episodes import Episode
from vla_scale.envs.registry import simulator
from vla_scale.models.flow.layout import FlowLayout, PromptTokenizer
from vla_scale.models.flow.noise_head import FILE as NOISE_HEAD_FILE
from vla_scale.models.flow.noise_head import STD_BOUNDS
from vla_scale.models.flow.normalize import FlowNormalizer, NormStats, norm_stats_of
from vla_scale.models.interface import EnvKeys

if TYPE_CHECKING:
    from torch import nn

    from vla_scale.models.flow.demonstrations import Augmentation, FlowDemonstrations
    from vla_scale.models.flow.rollout import FlowDecoder, FlowProcessor, FlowScorer


class FlowSource:
    """A flow family's policy with its spec, tokenizer, cameras and statistics (module docstring). Subclasses give
    `layout`, `value_width`, `keys` (the names of their `model.<family>.*` keys for messages), `normalizer`,
    `new_policy`, `unfilled_policy`, `write_folder` and `describe`."""

    family = ""
    """The `model.family` that loads it."""
    augmentations: tuple[str, ...] = ("none",)
    """`sft.image_augmentation` values besides auto."""
    keys: dict[str, str] = {}
    """What a message names for each of `action_dim`, `state_dim`, `horizon`, `prompt` (the family's own keys)."""

    def __init__(self, spec: Any, tokenizer: PromptTokenizer, env: str, source: str,
                 norm_stats: dict[str, NormStats] | None = None, weights: str = "", actions_per_chunk: int = 0,
                 stats_name: str = ""):
        self.spec, self.tokenizer, self.env, self.source = spec, tokenizer, env, source
        self.norm_stats, self.weights, self.stats_name = norm_stats, weights, stats_name
        self._actions_per_chunk = actions_per_chunk
        self._policy: nn.Module | None = None
        self.noise_level = 0.5
        """RL's Flow-SDE noise level (`noise_level` of the family's keys)."""
        self.stochastic_steps = ""
        """Which steps of RL's chain are stochastic ('': the method's)."""
        self.rl_noise = "flow_sde"
        """How RL's chain is made stochastic: flow_sde or flow_noise."""
        self.noise_std = STD_BOUNDS
        """Flow-Noise's std bounds (min, max)."""
        self.kernels = "eager"
        """The kernels every policy it builds runs (`model.kernels`, `models/kernels.py`)."""

    # ---- what a family gives ---------------------------------------------------------------------------------------
    @property
    def layout(self) -> FlowLayout:
        raise NotImplementedError

    def normalizer(self) -> FlowNormalizer | None:
        """The statistics' normaliser (None without statistics: states and actions as they are)."""
        raise NotImplementedError

    def with_stats(self, stats: dict[str, NormStats], name: str) -> FlowSource:
        """This source with `stats` as its statistics, named `name` (the RL settings kept)."""
        raise NotImplementedError

    def augmentation(self, name: str) -> Augmentation | None:
        """The training augmentation `sft.image_augmentation` names (auto: the family's default)."""
        return None

    # ---- fitting the env -------------------------------------------------------------------------------------------
    @property
    def cameras(self) -> tuple[str, ...]:
        return simulator(self.env).cameras[: self.layout.num_images]

    @property
    def reads_state(self) -> bool:
        return True

    def camera_resolution(self, env: EnvKeys) -> int:
        return env.camera_resolution or self.layout.image_size

    def check_env(self, env: EnvKeys) -> list[str]:
        """Robot vectors wider than the model's; states other than those the statistics were made of; instructions
        of the tasks played whose prompts exceed the budget and would be cut (unless the prompt carries the state,
        known only as the episode runs)."""
        face, layout = simulator(env.name), self.layout
        sizes = {"actions": (face.action_dim, layout.action_dim, "action_dim"),
                 "proprio states": (face.state_size(env.simulator_kwargs()), layout.state_dim, "state_dim")}
        problems = [f"env {env.name!r} has {n}-d {what} but the policy's {what.split()[-1][:-1]} size is {width}: "
                    f"set {self.keys[key]} >= {n}" for what, (n, width, key) in sizes.items() if n > width]
        trained = self.trained_state_size()
        if trained and face.observation is not None and (problem := face.state_problem(
                trained, env.simulator_kwargs(), f"{self.source}'s statistics say it was trained on")):
            problems.append(problem)
        if layout.state_in_prompt or env.suite not in face.suites:
            return problems
        played = face.instructions(env.suite)[: env.num_tasks]
        length, longest = max((len(self.tokenizer.prompt_ids(text)), text) for text in played)
        if length > self.budget:
            problems.append(f"the instruction {longest!r} of env.suite={env.suite} makes a prompt of {length} tokens "
                            f"> the policy's budget {self.budget}: set {self.keys['prompt']}={length} "
                            "(a checkpoint keeps its own budget: play tasks whose prompts fit it)")
        return problems

    @property
    def budget(self) -> int:
        """The prompt's budget in tokens."""
        raise NotImplementedError

    def trained_state_size(self) -> int:
        """The size of the states the statistics were made of (0: no state statistics)."""
        stats = (self.norm_stats or {}).get("state")
        return len(stats.mean) if stats is not None else 0

    def rollout_problems(self) -> list[str]:
        return []

    def training_problems(self, critic: bool = False) -> list[str]:
        """Every algorithm trains it (a critic's value head reads the prefix: `FlowPolicy.value_features`)."""
        return []

    def recording_problems(self) -> list[str]:
        return [f"record.path replays each episode from the chunks the policy decoded, which {self.source} does not "
                "keep yet (a flow policy's chunk is sampled, not tokens): drop record.path"]

    # ---- rolling out (models/flow/rollout.py) ----------------------------------------------------------------------
    @property
    def actions_per_chunk(self) -> int:
        """Actions of each chunk the env plays before the next decode: a LeRobot folder's `n_action_steps`, else
        the whole horizon."""
        horizon = self.layout.action_horizon
        return min(self._actions_per_chunk or horizon, horizon)

    @property
    def processor(self) -> FlowProcessor:
        """Observations -> the model's inputs, as SFT prepares them."""
        from vla_scale.models.flow.rollout import FlowProcessor

        return FlowProcessor(self.layout, self.cameras, self.tokenizer, self.normalizer())

    def chunk_decoder(self) -> FlowDecoder:
        """What the rollout engine decodes a batch with: noise-free `sample_actions`, un-normalised and cut."""
        from vla_scale.models.flow.rollout import FlowDecoder

        return FlowDecoder(self.normalizer(), simulator(self.env).action_dim, self.actions_per_chunk,
                           self.noise_level, self.stochastic_steps, self.rl_noise)

    def chunk_scorer(self) -> FlowScorer:
        """What the actor scores the rollout's chains with: their log-probs again, with gradients."""
        from vla_scale.models.flow.rollout import FlowScorer

        return FlowScorer(self.layout, simulator(self.env).action_dim, self.actions_per_chunk, self.rl_noise)

    @property
    def noise_head_std(self) -> tuple[float, float] | None:
        """The noise head's std bounds for the policies it builds (Flow-Noise), else None (no head)."""
        return self.noise_std if self.rl_noise == "flow_noise" else None

    def env_actions(self, actions: np.ndarray) -> np.ndarray:
        """The decoded actions in the env's convention: they are already (played as they come)."""
        return np.asarray(actions, dtype=np.float64)

    def simulator_kwargs(self, env: EnvKeys) -> dict[str, Any]:
        """The fleet's env kwargs: the env's own, rendered at `camera_resolution(env)`."""
        return {**env.simulator_kwargs(), "camera_resolution": self.camera_resolution(env)}

    @property
    def policy(self) -> nn.Module:
        """The policy (built on first use by `new_policy`, eval mode)."""
        if self._policy is None:
            self._policy = self.new_policy().eval()
        return self._policy

    def new_policy(self, zero3_init: bool = False) -> nn.Module:
        raise NotImplementedError

    def noise_head_note(self) -> str:
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
        layout, problems = self.layout, []
        shortest = min(len(e) for e in episodes)
        if layout.action_horizon > shortest:
            problems.append(f"the policy's action horizon {layout.action_horizon} is longer than the shortest "
                            f"demonstration ({shortest} steps): its chunks would be mostly padding; set "
                            f"{self.keys['horizon']} <= {shortest}")
        for what, width, size, key in (("actions", episodes[0].actions.shape[1], layout.action_dim, "action_dim"),
                                       ("states", episodes[0].state.shape[1], layout.state_dim, "state_dim")):
            if width > size:
                problems.append(f"the demonstrations' {what} are {width}-d, wider than the policy's {size}: set "
                                f"{self.keys[key]} >= {width}")
        for text in sorted({e.instruction for e in episodes}):
            state = episodes[0].state[0] if layout.state_in_prompt else None
            length = len(self.tokenizer.prompt_ids(text, state))
            if length > self.budget:
                problems.append(f"the instruction {text!r} makes a prompt of {length} tokens > the budget "
                                f"{self.budget}: set {self.keys['prompt']}={length}")
        return problems

    def with_demonstrations(self, key: str, episodes: Sequence[Episode]) -> FlowSource:
        """This source with statistics of the demonstrations' states and actions under `key`."""
        stats = {"state": norm_stats_of(np.concatenate([e.state for e in episodes])),
                 "actions": norm_stats_of(np.concatenate([e.actions for e in episodes]))}
        source = self.with_stats(stats, key)
        source.noise_level, source.stochastic_steps, source.kernels = (self.noise_level, self.stochastic_steps,
                                                                        self.kernels)
        source.rl_noise, source.noise_std = self.rl_noise, self.noise_std
        return source

    def demonstrations(self, episodes: Sequence[Episode], augmentation: str = "auto") -> FlowDemonstrations:
        """The examples of `episodes`, prepared once, with the training augmentation `augmentation` names."""
        from vla_scale.models.flow.demonstrations import FlowDemonstrations

        normalizer = self.normalizer()
        if normalizer is None:
            raise ValueError("no statistics to normalise the demonstrations with: with_demonstrations first")
        if augmentation not in ("auto", *self.augmentations):
            raise ValueError(f"sft.image_augmentation={augmentation}: choose one of {['auto', *self.augmentations]}")
        return FlowDemonstrations.build(episodes, self.layout, self.cameras, normalizer, self.tokenizer,
                                        self.augmentation(augmentation))

    def identity_stats(self) -> dict[str, NormStats]:
        """Statistics that leave states and actions as they are (up to an epsilon on the divisor): what a folder of
        a policy without statistics (a fresh one that RL trained) is written with."""
        zeros, ones = np.zeros(self.layout.action_dim), np.ones(self.layout.action_dim)
        same = NormStats(mean=zeros, std=ones, q01=-ones, q99=ones)
        return {"state": same, "actions": same}
