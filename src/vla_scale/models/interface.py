"""One policy interface, two families: what the supervised trainer and the actor ask of a policy.

A family (OpenVLA-OFT: `models/oft/pretrained.PretrainedVLA`; π0 / π0.5: `models/pi0/source.Pi0Source`) hands out a
`PolicySource`: the policy together with everything that must agree with it (tokenizer, image pipeline,
statistics). The run's code above the model layer talks to it only through the members below, so it never asks
which family it holds:

    SupervisedTrainer                                PolicySource
      demonstration_problems(episodes)  ---------->  what the demonstrations lack for this policy (before compute)
      with_demonstrations(key, episodes) --------->  the source with the demonstrations' statistics made its own
      demonstrations(episodes)  ------------------>  Demonstrations: examples prepared once
        .draw(generator, batch_size)                 one step's randomness, the same on every rank
        .batch(draw, positions, device)  --------->  SupervisedBatch: a micro-batch
    Actor.supervised_update
      batch.loss(forward, policy, device, trim) -->  the supervised loss and its measures, through DeepSpeed's forward
      new_policy(zero3_init)  -------------------->  the module; its parameters with requires_grad are what trains
    checkpoint.write_checkpoint
      write_folder(module, tensors, folder)  ----->  the policy as a checkpoint folder of the family's layout

What the rollout engine and the env loop ask of it (evaluation: `launch/eval.py`, `rollout/stack.play_eval`):

    run_setup.checked_policy
      rollout_problems(), training_problems() ->  why it cannot be rolled out / trained by RL (refused before start)
    start_fleet: simulator_kwargs(env)  ------>  the simulators' kwargs (resolution, image preparation)
    EnvLoop
      processor.prepare(observations)  ------->  the images as the policy sees them + raw proprio (recorded)
      processor.from_prepared(...)  ---------->  the model's inputs on the engine's device
      RolloutEngine(policy, decoder=chunk_decoder())
        .decode(inputs, temperature, greedy) ->  Decoded; the family's `ChunkDecoder` decodes the batch (OFT: the
                                                 head's bins / L1 Gaussian over the engine's logits, its fast forward
                                                 on a GPU; π0: noise-free `sample_actions`, or with `greedy=False` a
                                                 Flow-SDE or Flow-Noise chain whose record, `Decoded.sampled`, the
                                                 update scores again)
      env_actions(decoded.actions)  ---------->  the chunk in the env's convention

What the RL update asks of it (`launch/train.py`):

    Actor(new_policy, ..., scorer=chunk_scorer())
      scorer.logprobs(forward, ..., sampled) ->  the recorded chunks' log-probs with gradients (OFT: the head's
                                                    `distribution` of the tokens; π0: the chain's stochastic steps
                                                    again, `Pi0Policy.chain_logprobs`), with a critic its values
                                                    from the same pass
      value_width  --------------------------->  the width of the hidden state a value head reads (PPO)

OFT's loss is the cross-entropy over bins or the L1 regression of its head; π0's is the flow-matching loss masked over
padded chunk steps and action dimensions (`models/pi0/demonstrations.py`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from vla_scale.models.registry import FAMILIES

POLICY_FAMILIES = tuple(FAMILIES)
"""`model.family`: the families of the registry (`models/registry.py`)."""

if TYPE_CHECKING:
    import torch
    from torch import Tensor, nn

    from vla_scale.datasets.episodes import Episode


class EnvKeys(Protocol):
    """The env keys a policy is fitted to (the run's `env.*` group)."""

    name: str
    suite: str
    num_tasks: int
    camera_resolution: int

    def simulator_kwargs(self) -> dict[str, Any]: ...


class SupervisedBatch(Protocol):
    """One micro-batch of demonstrations as the family's policy trains on it."""

    @property
    def examples(self) -> int:
        """How many examples it holds (micro-batches weigh by it)."""
        ...

    def loss(self, forward: Callable[..., Any], policy: nn.Module, device: torch.device | str, trim: bool
             ) -> tuple[Tensor, dict[str, float]]:
        """The mean supervised loss over its examples and the family's measures, the policy run through `forward`
        (the DeepSpeed engine, which gathers ZeRO-3 shards); `trim`: drop prompt padding where the family can."""
        ...


class Demonstrations(Protocol):
    """Every example of a dataset, prepared once."""

    def __len__(self) -> int: ...

    def draw(self, generator: np.random.Generator, batch_size: int) -> Any:
        """One optimizer step's randomness (which examples; the family's own noise), drawn alike on every rank."""
        ...

    def batch(self, draw: Any, positions: np.ndarray, device: torch.device | str = "cpu") -> SupervisedBatch:
        """The micro-batch of the `positions` of a step's `draw` (this rank's share, split)."""
        ...


class RolloutProcessor(Protocol):
    """Observations -> a family's model inputs (OFT: `models/oft/processor.Processor`; flow families:
    `models/flow/rollout.py`)."""

    def prepare(self, observations: list[Any], prepared: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(images uint8 [B, cameras, S, S, 3] as the policy sees them, raw proprio [B, d]): what a rollout records."""
        ...

    def from_prepared(self, images: np.ndarray, instructions: list[str], proprio: np.ndarray,
                      device: torch.device | str = "cpu") -> Any:
        """The model's inputs of a prepared batch, on `device`."""
        ...


Sampled = dict[str, np.ndarray]
"""What a family's decode sampled beyond the tokens, per row of the batch (each array's first axis): what the actor
needs to score the chunk again (π0: the denoising chain, its stochastic step, the noise level); empty for OFT."""


class DecodingEngine(Protocol):
    """What a `ChunkDecoder` reads of the rollout engine (`rollout/engine.RolloutEngine`)."""

    policy: nn.Module
    generator: torch.Generator

    def inputs(self, batch: Any) -> Any:
        """The batch on the engine's device (prompt padding trimmed on the fast path)."""
        ...

    def logits(self, batch: Any, prompt_lengths: list[int] | None = None) -> Tensor:
        """The policy's output for a batch on the device: its own forward's, or the fast forward's."""
        ...


class ChunkDecoder(Protocol):
    """How the rollout engine decodes a family's batch with its own copy of the policy (`RolloutEngine(decoder=)`)."""

    def fp8_weights(self, emulate: bool) -> Any:
        """The FP8 copies of the policy's matrices that its decode multiplies with under `rollout.precision=fp8` (an
        object with `refresh(policy)`, `release()`, `nbytes()` and `needs_fast_forward`: whether only `fast_forward`
        uses them, or the policy's own forward), or None where the family has no FP8 products."""
        ...

    def fast_forward(self, policy: nn.Module, compile: bool, fp8: Any) -> Callable[..., Tensor] | None:
        """The engine's faster forward of `policy` (compiled, FP8 products where `fp8` holds the weights' copies),
        or None where the family has none."""
        ...

    def decode(self, engine: DecodingEngine, batch: Any, temperature: float, greedy: bool
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Sampled]:
        """(tokens [B, K], logprobs float32[B, K], actions float64[B, chunk, env action size], what was sampled)
        of `batch` with the engine's policy, its randomness from the engine's seeded `generator`
        (`rollout/engine.Decoded`)."""
        ...


class ChunkScorer(Protocol):
    """How the actor scores a family's recorded chunks again (`Actor(scorer=)`)."""

    def logprobs(self, forward: Callable[..., Any], policy: nn.Module, inputs: Any, tokens: Tensor,
                 sampled: dict[str, Tensor], device: torch.device, temperature: float, trim: bool, **critic: bool
                 ) -> tuple[Tensor, Callable[[], Tensor], Tensor | None]:
        """(log-probs float32[B, width], how to read the entropy float32[B, width] (no gradient, after the step),
        values float32[B] or None) of the recorded chunks (`tokens` and the family's record `sampled`), with
        gradients, the policy run through `forward` (the DeepSpeed engine) at the sampling `temperature` (`trim`:
        prompt padding dropped where the family can); the width is the rollout's record's. `critic`
        (`detach_backbone=`) is given when the engine holds a value head beside the policy
        (`models/critic.PolicyWithValue`): its values come from the same pass."""
        ...


class PolicySource(Protocol):
    """A policy and what must agree with it, as the trainers and the entry scripts use it."""

    family: str  # one of POLICY_FAMILIES: what `model.family` the run logs
    augmentations: tuple[str, ...]  # the `sft.image_augmentation` values its fine-tuning takes besides auto
    source: str
    weights: str
    kernels: str  # `model.kernels`: what every policy it builds runs its norms, MLPs and rotary embeddings with

    @property
    def cameras(self) -> tuple[str, ...]: ...

    @property
    def reads_state(self) -> bool:
        """Whether the policy reads the proprio state (the dataset must hold one)."""
        ...

    @property
    def value_width(self) -> int:
        """The width of the hidden state a value head reads (`models/critic.py`)."""
        ...

    def camera_resolution(self, env: EnvKeys) -> int: ...

    def check_env(self, env: EnvKeys) -> list[str]: ...

    def describe(self, env: EnvKeys | None = None) -> str: ...

    def rollout_problems(self) -> list[str]:
        """Why this policy cannot be rolled out by the engine yet (evaluation); empty when it can."""
        ...

    def training_problems(self, critic: bool = False) -> list[str]:
        """Why RL (launch/train.py) cannot train this policy yet (`critic`: with PPO's value head); empty when it
        can."""
        ...

    def recording_problems(self) -> list[str]:
        """Why the episodes it plays cannot be replayed into a LeRobot dataset (launch/eval.py record.path); empty
        when they can."""
        ...

    @property
    def processor(self) -> RolloutProcessor: ...

    @property
    def policy(self) -> nn.Module:
        """The policy, built on first use, eval mode (what an evaluation's engine decodes with)."""
        ...

    def chunk_decoder(self) -> ChunkDecoder:
        """The engine's decoder for this family."""
        ...

    def chunk_scorer(self) -> ChunkScorer:
        """The actor's scorer of recorded chunks for this family."""
        ...

    def unfilled_policy(self) -> nn.Module:
        """A policy of this shape for a rollout engine that the first weight sync fills."""
        ...

    def env_actions(self, actions: np.ndarray) -> np.ndarray: ...

    def simulator_kwargs(self, env: EnvKeys) -> dict[str, Any]: ...

    def demonstration_problems(self, episodes: Sequence[Episode]) -> list[str]: ...

    def with_demonstrations(self, key: str, episodes: Sequence[Episode]) -> PolicySource: ...

    def demonstrations(self, episodes: Sequence[Episode], augmentation: str = "auto") -> Demonstrations:
        """The examples of `episodes`, prepared once; `augmentation` (`sft.image_augmentation`): auto (the family's
        default), none or openpi (π0's training augmentation); a family refuses one it cannot apply."""
        ...

    def new_policy(self, zero3_init: bool = False) -> nn.Module: ...

    def write_folder(self, module: nn.Module, tensors: dict[str, Tensor], folder: str) -> None: ...


def draw_batches(generator: np.random.Generator, size: int, batch_size: int) -> np.ndarray:
    """One step's example indices [batch_size]: a uniform draw without replacement (with it when the dataset has
    fewer examples than a batch)."""
    return generator.choice(size, batch_size, replace=size < batch_size)


def chunk_index(steps: int, horizon: int) -> tuple[np.ndarray, np.ndarray]:
    """(index int[steps, horizon], pad bool[steps, horizon]): at each step t the steps t .. t+horizon-1, the last
    one repeated past the episode's end, and where it was (LeRobot's `action_is_pad`)."""
    wanted = np.arange(steps)[:, None] + np.arange(horizon)[None, :]
    return np.minimum(wanted, steps - 1), wanted >= steps
