"""PretrainedVLA: a policy together with everything that must agree with it, built in one place.

A policy only computes the right thing with its own tokenizer, image pipeline, proprio statistics and action
post-processing. `PretrainedVLA` reads all of them from one source and hands them out together:

- `from_pretrained(folder)`: an OpenVLA-OFT checkpoint folder (official layout, or one we saved): the architecture
  and statistics from config.json / dataset_statistics.json, the tokenizer from its tokenizer files, the image
  preprocessing from preprocessor_config.json plus the official evaluation's resize and crop, the number of images
  from our `vla_scale` section or the robot platform its statistics name (OFT LIBERO: third-person + wrist), actions
  post-processed into the env's convention (the env's `Simulator.action_postprocess`: OpenVLA gripper -> LIBERO's).
- `from_spec(spec, tokenizer, ...)`: a fresh policy of our own (its spec made from the run's `model.*` keys by
  `run_policy.fresh_vla`, which also makes its word-level tokenizer of the suite's instructions); its actions are
  already in the env's convention.
- `check_env(env)`: every way the policy does not fit an env (`run_policy.vla_for_env` refuses them before
  anything starts): images the env does not render or renders at another resolution, action or proprio sizes.

The policy's weights are built from the spec and the weights' folder (none: a random init) by `OFTPolicy.from_spec`
on first use of `.policy` (and again by `new_policy`, e.g. for the DeepSpeed actor under ZeRO-3), so the checks cost
no weight loading and a fresh policy draws its init where it always did. `predict` samples with the rollout engine's
sampler (`models/oft/sampling.py`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from vla_scale.datasets.episodes import Episode
from vla_scale.envs.registry import simulator
from vla_scale.envs.types import Observation
from vla_scale.models.interface import EnvKeys
from vla_scale.models.kernels import use_kernels
from vla_scale.models.oft.action_heads import l1_head_shapes
from vla_scale.models.oft.actions import DatasetStats
from vla_scale.models.oft.checkpoint_io import (
    CONFIG,
    PREPROCESSOR,
    STATS,
    action_head_files,
    diffusion_files,
    film_backbone_files,
    load_action_head_state,
    proprio_projector_file,
    read_proprio_dim,
    read_spec,
    weight_files,
    write_folder,
)
from vla_scale.models.oft.demonstrations import OFTDemonstrations, SupervisedExamples
from vla_scale.models.oft.processor import PolicyInputs, Processor
from vla_scale.models.oft.spec import OFFICIAL_EVALUATION, OFTSpec
from vla_scale.models.oft.statistics import dataset_statistics
from vla_scale.models.tokenizer import HFTokenizer, TextTokenizer, prompt_text

if TYPE_CHECKING:  # the policy module imports transformers' Llama: checking a policy against an env needs none
    from vla_scale.models.oft.decode import OFTDecoder, OFTScorer
    from vla_scale.models.oft.policy import OFTPolicy


class CheckpointError(ValueError):
    """A checkpoint folder that is missing, unreadable or does not fit; the message says what to change."""


@dataclass
class Prediction:
    """One batch of predicted chunks."""

    tokens: np.ndarray  # [B, chunk*action_dim]: int64 bin index 0..n_bins-1 in vocabulary order, or float32
    # normalised values (l1 head)
    actions: np.ndarray  # float64[B, chunk, action_dim]: un-normalised with the dataset statistics
    env_actions: np.ndarray  # float64[B, chunk, action_dim]: after the env's post-processing


class PretrainedVLA:
    """Policy, tokenizer, processor and action post-processing from one source (module docstring)."""

    augmentations = ("none",)
    """`sft.image_augmentation` values besides auto: OFT's fine-tuning here augments no image."""

    family = "oft"

    def __init__(self, spec: OFTSpec, tokenizer: TextTokenizer, processor: Processor, env: str, source: str,
                 weights: str = "", adapters: tuple[str, ...] = (), kernels: str = "eager"):
        self.spec, self.tokenizer, self.processor, self.env, self.source = spec, tokenizer, processor, env, source
        self.weights, self.adapters = weights, adapters
        """The checkpoint folder the policy's weights come from ('': a fresh random init); LoRA adapter folders
        merged into them."""
        self.kernels = kernels
        """The kernels every policy it builds runs (`model.kernels`, `models/kernels.py`)."""
        self.convention = spec.resolved_convention
        self.env_actions = simulator(env).action_postprocess(self.convention)
        """Un-normalised actions [..., A] -> what the env steps with (the env's post-processing)."""
        self._policy: OFTPolicy | None = None

    # ---- construction -----------------------------------------------------------------------------------------------
    @classmethod
    def from_pretrained(cls, folder: str, unnorm_key: str | None = None, center_crop: bool | None = None,
                        attention: str | None = None, *, use_proprio: bool | None = None,
                        num_images: int | None = None, env: str | None = None,
                        suite: str | None = None, max_text_len: int = 0, instructions: list[str] | None = None,
                        action_head: str = "auto", log_std_init: float | None = None) -> PretrainedVLA:
        """Everything from `folder`. `unnorm_key`: the statistics of this dataset (None: the suite's, as the official
        `check_unnorm_key` finds it, else the only one). `center_crop`, `attention`: override the checkpoint's.
        `use_proprio=False` drops the proprio token, as the official discrete-token evaluation does (default: feed
        it through the checkpoint's projector). `num_images`: images per example (None: the checkpoint's own).
        `env`: the env whose cameras and action convention apply (None: the platform the statistics name, e.g.
        libero). `max_text_len`: a fixed prompt budget checked against `instructions` (0: sized to them; without
        instructions each batch pads to its longest prompt). `action_head`: `auto` (the folder's: `l1` with an
        `action_head--*` file, else `tokens`) or the head expected, which must be the folder's (`folder_action_head`);
        `log_std_init`: the l1 Gaussian's initial log-std where the folder saved none (an official fine-tune)."""
        files = check_checkpoint_folder(folder)
        problems: list[str] = []  # every problem of the folder, reported together
        tokenizer: HFTokenizer | None = None
        try:
            tokenizer = HFTokenizer.from_folder(folder)
        except (FileNotFoundError, ValueError) as err:
            problems.append(str(err))
        proprio_dim = None
        try:
            proprio_dim = read_proprio_dim(folder)
        except Exception as err:  # torch.load raises several types for a corrupt archive
            problems.append(f"{proprio_projector_file(folder)} is unreadable ({err}): the download or copy is "
                            "incomplete")
        head, head_problems = folder_action_head(folder, action_head)
        problems += head_problems + film_problems(folder)
        overrides: dict[str, Any] = {k: v for k, v in (("center_crop", center_crop), ("attention", attention),
                                                       ("use_proprio", use_proprio), ("num_images", num_images),
                                                       ("log_std_init", log_std_init)) if v is not None}
        overrides["action_head"] = head
        if "vla_scale" not in files[CONFIG]:  # an official folder: its evaluation's images
            overrides = {**OFFICIAL_EVALUATION, **overrides}
        try:
            spec = read_spec(folder, proprio_dim=proprio_dim, files=files, **overrides)
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError("\n  - ".join([*problems, f"{folder}/{CONFIG} does not describe an OpenVLA-OFT "
                                                              f"policy: {err}"])) from err
        if head == "l1" and not head_problems:
            problems += head_shape_problems(folder, spec)
        try:
            unnorm_key = resolve_unnorm_key(spec, unnorm_key, suite, folder)
        except CheckpointError as err:
            problems.append(str(err))
        if tokenizer is not None and tokenizer.vocab_size > spec.llm["vocab_size"]:
            problems.append(f"{folder}: its tokenizer has {tokenizer.vocab_size} ids but the model embeds only "
                            f"{spec.llm['vocab_size']}: the tokenizer files belong to another model")
        if problems or tokenizer is None:
            raise CheckpointError(problems[0] if len(problems) == 1 else
                                  f"{len(problems)} problems:\n  - " + "\n  - ".join(problems))
        spec = replace(spec, unnorm_key=unnorm_key)
        env = env or _platform_env(spec, folder)
        preprocessor = files.get(PREPROCESSOR)
        budget = text_budget(tokenizer, instructions or [], max_text_len)
        processor = _processor(spec, tokenizer, env, preprocessor, budget)
        return cls(spec, tokenizer, processor, env, folder, weights=folder)

    @classmethod
    def from_spec(cls, spec: OFTSpec, tokenizer: TextTokenizer, env: str, instructions: list[str],
                  max_text_len: int, source: str) -> PretrainedVLA:
        """A fresh policy of `spec` (weights drawn on first use of `.policy` or `new_policy`: seed torch first) with
        `tokenizer`, its prompt budget checked against `instructions` (`text_budget`)."""
        processor = _processor(spec, tokenizer, env, None, text_budget(tokenizer, instructions, max_text_len))
        return cls(spec, tokenizer, processor, env, source)

    def with_adapters(self, folder: str) -> PretrainedVLA:
        """This source with a LoRA adapter folder (PEFT layout) merged into every policy it builds (`models/lora.py`);
        the folder is read now, so a broken one is refused before anything is built."""
        from vla_scale.models.lora import read_adapters

        read_adapters(folder)
        return PretrainedVLA(self.spec, self.tokenizer, self.processor, self.env, f"{self.source} + adapters {folder}",
                             self.weights, (*self.adapters, folder), self.kernels)

    def with_statistics(self, key: str, stats: dict[str, Any]) -> PretrainedVLA:
        """This source with `stats` (one `dataset_statistics.json` entry) as the statistics its actions and proprio
        are normalised with, under `key`, the actions staying in the env's convention: the policy supervised
        fine-tuning trains, and saves with its statistics. Weights and adapters are this source's."""
        spec = replace(self.spec, norm_stats={key: stats}, unnorm_key=key, action_convention="env")
        processor = Processor(self.tokenizer, self.processor.transform, self.cameras,
                              DatasetStats.from_json(stats, spec.normalization), self.max_text_len)
        return PretrainedVLA(spec, self.tokenizer, processor, self.env, f"{self.source} + statistics {key!r}",
                             self.weights, self.adapters, self.kernels)

    # ---- supervised fine-tuning (models/interface.PolicySource) -----------------------------------------------------
    @property
    def reads_state(self) -> bool:
        return bool(self.spec.use_proprio)

    @property
    def value_width(self) -> int:
        return int(self.spec.llm["hidden_size"])

    def rollout_problems(self) -> list[str]:
        return []

    def training_problems(self, critic: bool = False) -> list[str]:
        return []

    def recording_problems(self) -> list[str]:
        return []

    def chunk_decoder(self) -> OFTDecoder:
        """The rollout engine's decode of OFT: the head's `distribution` over the engine's logits."""
        from vla_scale.models.oft.decode import OFTDecoder

        return OFTDecoder()

    def chunk_scorer(self) -> OFTScorer:
        """The actor's score of OFT's tokens: the head's `distribution` over the update forward's output."""
        from vla_scale.models.oft.decode import OFTScorer

        return OFTScorer()

    def demonstration_problems(self, episodes: Sequence[Episode]) -> list[str]:
        """Demonstration instructions the policy cannot read as given: words its tokenizer does not know (a fresh
        policy's word-level vocabulary is the env suite's instructions) or prompts longer than its text budget."""
        problems = []
        unknown = getattr(self.tokenizer, "unk_id", None)
        for text in sorted({e.instruction for e in episodes}):
            ids = self.processor.prompt_ids(text)
            if unknown is not None and unknown in ids:
                problems.append(f"the instruction {text!r} has words the policy's tokenizer does not know: record "
                                "demonstrations of the env's own tasks, or fine-tune a checkpoint whose tokenizer "
                                "reads them")
            elif self.max_text_len and len(ids) > self.max_text_len:
                problems.append(f"the instruction {text!r} is {len(ids)} tokens > the policy's prompt budget "
                                f"{self.max_text_len}: set model.max_text_len={len(ids)} (or 0: sized to the suite)")
        return problems

    def with_demonstrations(self, key: str, episodes: Sequence[Episode]) -> PretrainedVLA:
        """`with_statistics` of the demonstrations' actions and proprio (`dataset_statistics.json`'s layout)."""
        return self.with_statistics(key, dataset_statistics([e.actions for e in episodes],
                                                            [e.state for e in episodes]))

    def demonstrations(self, episodes: Sequence[Episode], augmentation: str = "auto") -> OFTDemonstrations:
        """The examples of `episodes` (`models/oft/demonstrations.py`), images prepared once; no augmentation (auto and
        none; openpi's is π0's, refused)."""
        if augmentation not in ("auto", "none"):
            raise ValueError(f"sft.image_augmentation={augmentation}: OpenVLA-OFT's fine-tuning here augments no "
                             "image; set sft.image_augmentation=none (or auto)")
        spec = self.spec
        examples = SupervisedExamples.build(episodes, self.processor, self.processor.stats, spec.chunk_len,
                                            spec.action_head, spec.n_bins)
        return OFTDemonstrations(examples, self.processor)

    def write_folder(self, module: torch.nn.Module, tensors: dict[str, torch.Tensor], folder: str) -> None:
        """The trained `module`'s gathered `tensors` as an official-layout folder with the tokenizer's files."""
        preprocessor = module.preprocessor or module.image_transform().preprocessor_config()
        write_folder(tensors, module.spec, preprocessor, folder)
        self.tokenizer.save(folder)

    # ---- the stable surface -----------------------------------------------------------------------------------------
    @property
    def policy(self) -> OFTPolicy:
        """The policy (built on first use in torch's default dtype, eval mode)."""
        if self._policy is None:
            self._policy = self.new_policy().eval()
        return self._policy

    def save_pretrained(self, folder: str) -> None:
        """The policy (official layout, `OFTPolicy.save_pretrained`) and its tokenizer files: a folder
        `from_pretrained` reads back to the same computation."""
        self.policy.save_pretrained(folder)
        self.tokenizer.save(folder)

    def new_policy(self, zero3_init: bool = False) -> OFTPolicy:
        """Another copy from the same source (fresh: a new random init; checkpoint: its weights again), adapters
        merged, with `kernels`. `zero3_init`: the caller builds it inside `deepspeed.zero.Init`."""
        from vla_scale.models.oft.policy import OFTPolicy

        policy = OFTPolicy.from_spec(self.spec, self.weights, zero3_init)
        if self.adapters:
            from vla_scale.models.lora import merge_adapters

            for folder in self.adapters:
                merge_adapters(policy, folder, zero3_init)
        return use_kernels(policy, self.kernels)

    def unfilled_policy(self) -> OFTPolicy:
        """A policy of this one's shape holding no values yet (`OFTPolicy.unfilled`): for a rollout engine that a
        weight sync fills (the trainer's); nothing is read from the checkpoint."""
        from vla_scale.models.oft.policy import OFTPolicy

        return use_kernels(OFTPolicy.unfilled(self.spec), self.kernels)

    @property
    def cameras(self) -> tuple[str, ...]:
        """Observation image names the policy takes, primary first."""
        return self.processor.cameras

    @property
    def max_text_len(self) -> int:
        return self.processor.max_text_len

    def prompt_ids(self, instruction: str) -> np.ndarray:
        """int64 ids of the instruction's prompt: BOS ... the trailing empty token, as the official `predict_action`
        runs on them."""
        return np.asarray(self.processor.prompt_ids(instruction), dtype=np.int64)

    def inputs(self, observations: list[Observation]) -> PolicyInputs:
        return self.processor(observations)

    @torch.no_grad()
    def predict(self, observations: list[Observation], greedy: bool = True, temperature: float = 1.0,
                generator: torch.Generator | None = None) -> Prediction:
        """Decode one chunk per observation: the mode (greedy: the argmax bins, the RL decode, or the l1 head's
        output, as the official evaluation acts) or a sample (bins at `temperature`; the l1 head's Gaussian)."""
        policy = self.policy
        batch = self.inputs(observations)
        params = policy(batch).float()
        tokens_np = policy.distribution.sample(params, temperature, greedy, generator).cpu().numpy()
        actions = policy.tokens_to_actions(tokens_np, greedy=greedy)
        return Prediction(tokens_np, actions, self.env_actions(actions))

    # ---- fitting the env -------------------------------------------------------------------------------------------
    def camera_resolution(self, env: EnvKeys) -> int:
        """The side the env renders at: `env.camera_resolution`, or (0) the policy pipeline's (a checkpoint's
        official evaluation resolution, e.g. LIBERO's 256; else the towers' input size)."""
        return env.camera_resolution or self.spec.camera_resolution or self.spec.towers[0].image_size

    def simulator_kwargs(self, env: EnvKeys) -> dict[str, Any]:
        """The fleet's env kwargs for `env`: its own, rendered at `camera_resolution(env)`, and, where numpy can do
        it, the policy's image preparation made inside the simulator processes (`image_prep`; the env loop then
        takes the images as they come when it finds `image_prep` in the fleet's env kwargs)."""
        side = self.camera_resolution(env)
        kwargs = {**env.simulator_kwargs(), "camera_resolution": side}
        prep = self.processor.transform.simulator_prep(side, self.cameras)
        if prep is not None:
            kwargs["image_prep"] = asdict(prep)
        return kwargs

    def check_env(self, env: EnvKeys) -> list[str]:
        """Every way the policy does not fit `env` (empty when it fits), each naming the key to change."""
        problems = []
        face = simulator(env.name)
        spec = self.spec
        if spec.num_images > len(face.cameras):
            problems.append(f"the policy takes {spec.num_images} images per example but env {env.name!r} renders "
                            f"{len(face.cameras)} ({list(face.cameras)}): set model.num_images (or use another env)")
        if spec.camera_resolution and env.camera_resolution not in (0, spec.camera_resolution):
            problems.append(f"env.camera_resolution={env.camera_resolution} but {self.source}'s pipeline renders "
                            f"at {spec.camera_resolution} and resizes to {spec.towers[0].image_size}: set "
                            f"env.camera_resolution={spec.camera_resolution} (or 0)")
        if spec.action_dim != face.action_dim:
            problems.append(f"the policy decodes {spec.action_dim}-d actions, env {env.name!r} takes "
                            f"{face.action_dim}-d ones: use a model for this env (model.action_dim)")
        state = face.state_size(env.simulator_kwargs())
        if spec.proprio_dim and spec.use_proprio and spec.proprio_dim != state:
            problem = face.state_problem(spec.proprio_dim, env.simulator_kwargs(),
                                         "the policy's proprio projector takes")
            if not (face.observation_hint and face.observation_hint(spec.proprio_dim)):  # no setting gives its size
                problem += f" (a fresh policy: model.proprio_dim={state}, e.g. model=tiny_libero for LIBERO, or " \
                           "model.use_proprio=false)"
            problems.append(problem)
        return problems

    def describe(self, env: EnvKeys | None = None) -> str:
        """One line saying what the policy takes and how its inputs and actions are made."""
        spec, side = self.spec, self.spec.towers[0].image_size
        rendered = self.camera_resolution(env) if env is not None else 0
        resize = "as rendered" if rendered == side else f"{spec.image_resize} to {side}"
        render = f"rendered at {rendered} px, {resize}" if rendered else f"{spec.image_resize} to {side}"
        crop = ", centre crop" if spec.center_crop else ""
        crop += ", vision FiLMed by the prompt" if spec.use_film else ""
        proprio = f"{spec.proprio_dim}-d proprio" if spec.proprio_dim and spec.use_proprio else "no proprio"
        stats = f"statistics {spec.unnorm_key!r}" if spec.unnorm_key else "no statistics"
        head = ("action head l1 (L1-regression MLP; RL: Gaussian around it)" if spec.action_head == "l1" else
                "action head tokens (LM-head bins)")
        budget = f"prompts of up to {self.max_text_len} tokens" if self.max_text_len else "prompts padded per batch"
        return (f"{self.source}: images {'+'.join(self.cameras)} {render}{crop}; "
                f"{proprio}; {budget} ({self.tokenizer.name}); {stats}; {head}; {self.convention} actions -> "
                f"{self.env}")


# ---- helpers --------------------------------------------------------------------------------------------------------
def _read_json(path: str) -> dict[str, Any]:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not readable JSON ({err}); restore it from the original checkpoint") from err


def check_checkpoint_folder(folder: str) -> dict[str, Any]:
    """The files a checkpoint folder needs are there and readable (weights: their headers), else CheckpointError;
    returns its JSON files parsed, by name (config.json, and dataset_statistics.json and preprocessor_config.json
    where present), so that each is read once."""
    if not os.path.isdir(folder):
        raise CheckpointError(f"checkpoint folder {folder!r} does not exist (model.checkpoint names an OpenVLA-OFT "
                              "folder: config.json, model.safetensors, tokenizer files, dataset_statistics.json)")
    if not os.path.isfile(os.path.join(folder, CONFIG)):
        raise CheckpointError(f"{folder} has no {CONFIG}: not a checkpoint folder")
    parsed = {name: _read_json(os.path.join(folder, name)) for name in (CONFIG, STATS, PREPROCESSOR)
              if os.path.isfile(os.path.join(folder, name))}
    try:
        weights = weight_files(folder)
    except FileNotFoundError as err:
        raise CheckpointError(str(err)) from err
    from safetensors import safe_open

    for file in weights:
        try:
            with safe_open(file, framework="pt") as f:
                names = list(f.keys())
            if not names:
                raise ValueError("no tensors")
        except Exception as err:  # safetensors raises its own error type for a truncated or corrupt file
            raise CheckpointError(f"{file} is unreadable ({err}): the download or copy is incomplete") from err
    return parsed


def folder_action_head(folder: str, requested: str = "auto") -> tuple[str, list[str]]:
    """The action head a checkpoint folder was trained with (`l1` when it holds an `action_head--*` file, else
    `tokens`) and, when it cannot be used as `requested` (`auto`, `tokens` or `l1`), the problems: a diffusion head,
    two head files, or a head other than the one asked for. Token GRPO on an L1 fine-tune would train LM-head bins
    that fine-tune never trained, so it is refused rather than run."""
    heads, diffusion = action_head_files(folder), diffusion_files(folder)
    if diffusion:
        return "l1", [f"{folder} is a diffusion-head fine-tune (OpenVLA-OFT's use_diffusion recipe: "
                      f"{os.path.basename(diffusion[0])}, a DDIM noise-prediction head), which is not supported: "
                      "use an L1-regression fine-tune (model.action_head=l1) or a token-head one "
                      "(model.action_head=tokens)"]
    if len(heads) > 1:
        return "l1", [f"{folder} holds {len(heads)} action head files ({', '.join(map(os.path.basename, heads))}): "
                      "keep the one that was saved with its weights"]
    head = "l1" if heads else "tokens"
    if requested in ("auto", head):
        return head, []
    if requested == "tokens":
        return head, [f"model.action_head=tokens but {folder} is an L1-regression fine-tune "
                      f"({os.path.basename(heads[0])}): its LM-head action bins were never trained. Either keep its "
                      "head (model.action_head=l1 or auto: evaluation as the official pipeline, RL with a Gaussian "
                      "around it) or start token GRPO from a token-head SFT checkpoint (e.g. SimpleVLA-RL's)"]
    return head, [f"model.action_head=l1 but {folder} holds no action_head--*_checkpoint.pt: it decodes with its "
                  "LM-head bins (model.action_head=tokens or auto); an L1 head made up here would be untrained"]


def film_problems(folder: str) -> list[str]:
    """An official FiLM fine-tune is refused: its towers live in a side file of their own, which is not read here,
    and the ones in model.safetensors would act without the instruction."""
    files = film_backbone_files(folder)
    if not files:
        return []
    return [f"{folder} is a FiLM fine-tune (OpenVLA-OFT's use_film recipe: {os.path.basename(files[0])} holds its "
            "language-conditioned vision backbone), which cannot be loaded yet; the towers in its model.safetensors "
            "would ignore the instruction. Use a fine-tune made without FiLM, or one saved by launch/sft.py with "
            "model.use_film=true"]


def head_shape_problems(folder: str, spec: OFTSpec) -> list[str]:
    """Every way the folder's L1 head file does not fit its model (names, shapes), or cannot be read."""
    try:
        state = load_action_head_state(folder)
    except Exception as err:  # torch.load raises several types for a corrupt archive
        return [f"{action_head_files(folder)[0]} is unreadable ({err}): the download or copy is incomplete"]
    assert state is not None
    want = l1_head_shapes(int(spec.llm["hidden_size"]), spec.chunk_len, spec.action_dim)
    got = {name: tuple(t.shape) for name, t in state.items()}
    if got == want:
        return []
    wrong = [f"{n} {got.get(n)} (expected {want.get(n)})" for n in sorted(set(want) | set(got))
             if got.get(n) != want.get(n)]
    return [f"{action_head_files(folder)[0]} does not fit the model beside it (hidden size "
            f"{spec.llm['hidden_size']}, {spec.action_dim}-d actions): {'; '.join(wrong[:4])}"
            f"{f' and {len(wrong) - 4} more' if len(wrong) > 4 else ''}: it belongs to another checkpoint"]


def resolve_unnorm_key(spec: OFTSpec, unnorm_key: str | None, suite: str | None, folder: str) -> str:
    """The statistics key: the one named (it must exist); else, with a suite, the suite's, `<suite>_no_noops` (the
    official `check_unnorm_key`) or `<suite>_no_noops_trajall` (RLinf's LIBERO-90 and LIBERO-130 uploads); else the
    only one; '' without statistics."""
    keys = sorted(spec.norm_stats)
    named = unnorm_key or spec.unnorm_key
    if named:
        if named not in spec.norm_stats:
            raise CheckpointError(f"model.unnorm_key={named!r} is not among {folder}'s dataset statistics {keys}")
        return named
    if not keys:
        return ""
    if suite:
        candidates = (suite, f"{suite}_no_noops", f"{suite}_no_noops_trajall")
        for key in candidates:
            if key in spec.norm_stats:
                return key
        raise CheckpointError(f"{folder} has no statistics for suite {suite!r} (any of {list(candidates)}; it has "
                              f"{keys}): name the dataset to use with model.unnorm_key=<one of them>")
    if len(keys) == 1:
        return keys[0]
    raise CheckpointError(f"{folder} has statistics of several datasets {keys}: pass unnorm_key")


def text_budget(tokenizer: TextTokenizer, instructions: list[str], max_text_len: int) -> int:
    """The prompt budget: `max_text_len` when every prompt fits it, else an error naming the longest; 0 sizes it to
    the longest prompt (0 as well without instructions: each batch pads to its own longest)."""
    lengths = {t: len(tokenizer.prompt_ids(prompt_text(t))) for t in instructions}
    longest = max(lengths.values(), default=0)
    if max_text_len and longest > max_text_len:
        worst = max(lengths, key=lengths.__getitem__)
        raise ValueError(f"the suite's longest prompt has {longest} tokens > model.max_text_len={max_text_len} "
                         f"({worst!r}): set model.max_text_len={longest} or 0 (sized to the suite)")
    return max_text_len or longest


def _platform_env(spec: OFTSpec, folder: str) -> str:
    names = {key.split("_")[0].lower() for key in spec.norm_stats}
    if "libero" in names:
        return "libero"
    raise CheckpointError(f"{folder}: cannot tell which env its statistics {sorted(spec.norm_stats)} belong to; "
                          "pass env=...")


def _processor(spec: OFTSpec, tokenizer: TextTokenizer, env: str, preprocessor: dict[str, Any] | None,
               max_text_len: int) -> Processor:
    """The processor of `spec` (its `unnorm_key` already resolved: `resolve_unnorm_key`)."""
    cameras = simulator(env).cameras[: spec.num_images]
    return Processor.for_spec(spec, tokenizer, cameras, preprocessor, max_text_len)
