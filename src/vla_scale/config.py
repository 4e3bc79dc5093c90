"""Typed configuration: dataclass schemas registered with Hydra's ConfigStore, and `validate()`.

Every field carries a one-line docstring (a string literal right below it); `docs/CONFIG.md` lists them. Group YAMLs
under `configs/` only override fields of these schemas, so a typo in a key or a wrong type fails at load.
`validate()` checks what the types cannot (arithmetic between groups, names that must exist) and raises one
`ConfigError` listing every problem with the keys involved and a suggested fix, before any compute is spent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """An impossible or unknown configuration; the message names the keys and the fix."""


LORA_ALL_LINEAR = "all-linear"
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "qkv", "proj", "fc1",
                "fc2", "fc3")
"""The linear layers LoRA can adapt, by last name: Llama's attention and MLP, the ViT blocks' attention and MLP, the
projectors' layers (the LM head is never adapted: its action rows are what the loss reads)."""


@dataclass
class LoraConfig:
    rank: int = 0
    """Rank of the LoRA adapters the actor trains instead of the whole policy (0: full-parameter training; 32 is
    OpenVLA-OFT's and RLinf's)."""
    alpha: float = 16.0
    """The adapters' output is scaled by alpha / rank (OpenVLA-OFT fine-tunes with 16 at rank 32)."""
    target_modules: list[str] = field(default_factory=lambda: ["all-linear"])
    """Linear layers that get adapters, by their last name (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
    down_proj, qkv, proj, fc1, fc2, fc3), or all-linear: every linear layer but the LM head, as OpenVLA-OFT's LoRA
    fine-tuning does."""
    path: str = ""
    """An adapter folder in PEFT's layout (adapter_config.json, adapter_model.safetensors: a LoRA run's step folder,
    an OpenVLA-OFT or RLinf LoRA checkpoint) merged into the policy's weights when it is loaded."""


@dataclass
class ModelConfig:
    name: str = "tiny"
    """Name of the model preset (for run names and logs)."""
    image_size: int = 64
    """Input image side in pixels; camera images are resized to it."""
    patch_size: int = 8
    """Vision patch side in pixels; image_size must be a multiple of it."""
    vision_dim: int = 64
    """Width of the vision encoder."""
    vision_layers: int = 1
    """Transformer layers in the vision encoder."""
    hidden_size: int = 96
    """Width of the Llama backbone."""
    num_layers: int = 2
    """Decoder layers of the Llama backbone."""
    num_heads: int = 4
    """Attention heads of the Llama backbone (and of the vision encoder)."""
    intermediate_size: int = 192
    """MLP width of the Llama backbone."""
    chunk_len: int = 8
    """Actions per chunk, all decoded in one forward pass."""
    action_dim: int = 7
    """Dimensions of one action: [dx, dy, dz, droll, dpitch, dyaw, gripper]."""
    n_bins: int = 256
    """Discrete bins per action dimension over [-1, 1]."""
    use_proprio: bool = True
    """Feed the proprioceptive state as one projected token."""
    proprio_dim: int = 4
    """Size of the proprioceptive state the env returns."""
    learned_action_queries: bool = True
    """Give each action slot a learned input embedding (False: zeros, as in OpenVLA-OFT)."""
    ordinal_bin_init: float = 0.0
    """Scale of a smooth, order-aware component added to the action-bin rows of the LM head at init (0: off);
    helps small policies trained from scratch, see OFTPolicy._init_ordinal_bins."""
    max_text_len: int = 0
    """Prompt tokens after padding (BOS and prompt included); 0 sizes it to the suite's longest prompt, a longer
    prompt than a set value is an error before anything starts."""
    pad_to_multiple_of: int = 64
    """The vocabulary (text + action bins) is padded to a multiple of this."""
    vocab_size: int = 0
    """Padded vocabulary of the Llama backbone (OpenVLA: 32064); 0 sizes it from the tokenizer."""
    timm_model_ids: list[str] = field(default_factory=list)
    """Vision towers by timm id (two are fused per patch, e.g. DINOv2 + SigLIP); [] builds one small ViT from
    vision_dim, vision_layers, patch_size and num_heads."""
    attention: str = "bidirectional"
    """Attention of the Llama backbone over the whole sequence: bidirectional (official OFT) or causal."""
    center_crop: bool | None = None
    """Crop the centre 90% of each image's area and resize back, for checkpoints trained with random crops (null:
    a checkpoint's own setting, true for official ones as their evaluation does; false for a fresh policy)."""
    num_images: int = 0
    """Camera images per example, in the env's camera order (primary first); 0: a checkpoint's own (from its
    `vla_scale` section, else its robot platform: OFT LIBERO 2, third-person + wrist), 1 for a fresh policy."""
    image_resize: str = "bicubic"
    """How camera images are resized to image_size: bicubic (torch, antialiased) or jpeg_lanczos3 (the official
    OpenVLA-OFT evaluation's JPEG round trip + Lanczos-3; checkpoints use it)."""
    checkpoint: str = ""
    """The checkpoint to load: an OpenVLA-OFT folder (config.json, model.safetensors, tokenizer files, ...), a
    training run's `checkpoints/step_<k>` folder or the run directory itself (its latest step), or a hub id
    `<org>/<name>[@revision]`; '' starts from random weights with a word-level tokenizer of the suite's instructions."""
    unnorm_key: str = ""
    """Dataset of the checkpoint's norm_stats that normalises proprio and un-normalises actions ('': the only one;
    a checkpoint with several needs it named, e.g. libero_spatial_no_noops)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA: the adapters the actor trains (rank 0: none) and adapters to merge on load."""


@dataclass
class RolloutConfig:
    pipeline_stage_num: int = 1
    """Pipeline stages S: while one stage's simulators run, the next stage is decoded (1: sequential)."""
    precision: str = "bf16"
    """The rollout engine's matrix products: bf16 (the weights' own dtype) or fp8 (e4m3 with per-channel weight and
    per-row activation scales, on FP8 tensor cores: compute capability 8.9+, e.g. H100/H200; the decode ~1.5x faster,
    its log-probs those of a slightly different policy, so it needs algo.old_logprobs=recompute; README, FP8
    rollouts)."""


@dataclass
class DisaggSimConfig:
    enable: bool = False
    """Place sim workers only on Ray nodes offering the `sim` resource (simulation nodes)."""
    nnodes: int = 1
    """Simulation nodes the run expects to find in the Ray cluster."""


@dataclass
class ReachConfig:
    max_delta: float = 0.03
    """End-effector displacement in metres per env step at |action| = 1."""
    physics_substeps: int = 0
    """MuJoCo physics steps (mj_step) run after each action (0: none, the task stays kinematic); real simulation work
    that gives its simulators the cost per env step of a heavier scene (benchmarks/rl_step.py)."""

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"max_delta": self.max_delta, "physics_substeps": self.physics_substeps}

    def startup_problems(self) -> list[str]:
        return []


@dataclass
class LiberoConfig:
    settle_steps: int = 10
    """No-op steps after each reset while the objects come to rest (OFT waits 10); not counted in env.max_steps."""
    assets: str = ""
    """Scene assets folder ('' uses the assets installed by `make libero`)."""
    texture_max_side: int = 0
    """Render from a copy of the assets with textures of at most this many pixels a side (0: LIBERO's own, as the
    official evaluation renders); 1024 takes ~0.5 GiB less per simulator, images within 2 intensity levels."""
    scenes: str = "per_episode"
    """Fixture layouts: per_episode (seeded by task and init state) or official (OFT's eval episode k scenes)."""
    mujoco: str = "3.3.2"
    """The MuJoCo release LIBERO must run under: the one whose renders match the data public LIBERO checkpoints were
    trained on (from 3.3.3 LIBERO-Object's floors render darker; from 3.4.0 libero_spatial task 5's bowl no longer
    settles on the ramekin). Another installed release is refused; name it here to run it anyway."""

    def simulator_kwargs(self) -> dict[str, Any]:
        return {"settle_steps": self.settle_steps, "assets_path": self.assets or None,
                "texture_max_side": self.texture_max_side, "scenes": self.scenes}

    def startup_problems(self) -> list[str]:
        """The scene mode, the LIBERO package and its scene assets, checked before any simulator starts."""
        from vla_scale.envs.libero import SCENES
        from vla_scale.envs.libero_install import LiberoNotInstalled, resolve_assets

        problems = []
        if self.scenes not in SCENES:
            problems.append(f"env.libero.scenes={self.scenes!r} is not a LIBERO scene mode; choose one of "
                            f"{list(SCENES)}")
        try:
            resolve_assets(self.assets or None)
        except LiberoNotInstalled as err:
            problems.append(str(err))
        import mujoco

        if mujoco.__version__ != self.mujoco:
            problems.append(f"MuJoCo {mujoco.__version__} is installed but LIBERO runs under MuJoCo {self.mujoco} "
                            "here (other releases render LIBERO's scenes unlike the data public checkpoints were "
                            f"trained on): install mujoco=={self.mujoco} (`make libero` does), or set "
                            f"env.libero.mujoco={mujoco.__version__} to run this one anyway")
        return problems


SIMULATOR_SETTINGS: dict[str, type] = {"reach": ReachConfig, "libero": LiberoConfig}
"""Each simulator of the env registry with its settings class; `EnvConfig` holds one field of that class per name
(`env.reach.*`, `env.libero.*`), and the class builds that simulator's kwargs and makes its start-up checks."""


@dataclass
class EnvConfig:
    name: str = "reach"
    """Simulator name from the env registry (`vla_scale.envs.registry.ENVS`)."""
    suite: str = "reach"
    """Task suite: which tasks the sampler draws from."""
    num_tasks: int = 3
    """Tasks of the suite to train and evaluate on (ids 0..num_tasks-1)."""
    num_train_init_states: int = 40
    """Initial states 0..n-1 of every task are the TRAIN split."""
    num_eval_init_states: int = 10
    """The next n initial states of every task are the held-out EVAL split."""
    camera_resolution: int = 64
    """Rendered camera side in pixels."""
    max_steps: int = 40
    """Env steps per episode before it ends unsuccessfully (LIBERO: each configs/env/libero_*.yaml sets its suite's
    OpenVLA-OFT limit; SimpleVLA-RL used 512); 0 gives each task its own (LIBERO: the limit of the suite the task
    belongs to, what env=libero_130 plays)."""
    train_on_eval_states: bool = False
    """Train on the EVAL init states (SimpleVLA-RL's setting, for comparison); false keeps TRAIN and EVAL disjoint."""
    eval_protocol: str = "held_out"
    """Which episodes an evaluation plays: held_out (every task from the EVAL init states, right for RL, where the
    TRAIN ones are trained on) or published (LIBERO's published numbers: every task from all 50 init states 0..49,
    the official scenes, the suite's OpenVLA-OFT step limit)."""
    eval_videos_per_task: int = 0
    """Evaluation episodes per task saved as MP4 in the run directory and logged to TensorBoard (0: none)."""
    num_workers: int = 2
    """Sim workers (per trainer rank)."""
    sims_per_worker: int = 2
    """Simulator subprocesses per sim worker."""
    step_timeout_s: float = 60.0
    """Deadline for one simulator call (reset or one chunk)."""
    max_failures: int = 3
    """A simulator process that fails this many times in a row stops the run (each failure restarts it)."""
    sim_workers_in_trainer: bool = True
    """Colocated mode only: run the sim workers inside the trainer process, so a pipeline-stage hand-over is a pipe
    write and read to the simulator processes with no Ray call (false: Ray actors; disaggregated mode always uses
    Ray actors on the simulation nodes)."""
    reach: ReachConfig = field(default_factory=ReachConfig)
    """The embedded reach task's own settings (used when name=reach)."""
    libero: LiberoConfig = field(default_factory=LiberoConfig)
    """LIBERO's own settings (used when name=libero)."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """How the env loop overlaps simulation and decoding."""
    disagg_sim: DisaggSimConfig = field(default_factory=DisaggSimConfig)
    """Simulators on separate nodes (disaggregated mode)."""

    def simulator(self) -> ReachConfig | LiberoConfig:
        """The settings of the simulator `name` names (its field of the same name)."""
        if self.name not in SIMULATOR_SETTINGS:
            raise ConfigError(f"env.name={self.name!r} is not a known simulator; choose one of "
                              f"{sorted(SIMULATOR_SETTINGS)}")
        return getattr(self, self.name)

    def simulator_kwargs(self) -> dict[str, Any]:
        """The constructor kwargs of `name`'s simulator (`envs.registry.make_env(name, **kwargs)`)."""
        return {"camera_resolution": self.camera_resolution, "max_steps": self.max_steps or None,
                **self.simulator().simulator_kwargs()}

    def startup_problems(self) -> list[str]:
        """What keeps the simulator from starting that can be seen before it starts (LIBERO: its scene mode, package
        and assets), one line each naming the key or the install step."""
        return self.simulator().startup_problems()


@dataclass
class AlgoConfig:
    name: str = "grpo"
    """Algorithm; only GRPO exists."""
    batch_size: int = 8
    """Task specs (groups) per RL step."""
    group_size: int = 8
    """Episodes per task spec; advantages are normalised within each group."""
    temperature: float = 1.6
    """Sampling temperature in rollout and in log-prob recomputation."""
    clip_low: float = 0.2
    """Lower clip of the probability ratio: 1 - clip_low."""
    clip_high: float = 0.28
    """Upper clip of the probability ratio (clip-higher): 1 + clip_high."""
    filter_low: float = 0.1
    """Groups whose mean success is below this carry no signal and are dropped."""
    filter_high: float = 0.9
    """Groups whose mean success is above this carry no signal and are dropped."""
    max_resample_rounds: int = 2
    """Extra rollout rounds per step to refill dropped groups (0 disables dynamic sampling refill)."""
    lr: float = 3e-4
    """Adam learning rate."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    mini_batches: int = 2
    """Optimizer updates per RL step; the step's samples are split into this many mini-batches."""
    micro_batches: int = 2
    """Gradient-accumulation micro-batches per mini-batch."""
    loss_agg: str = "token_mean"
    """How a mini-batch's token objectives make its loss: token_mean (every valid token weighs the same) or
    trajectory_mean (each episode's token mean, then the mean over episodes, as SimpleVLA-RL and RLinf do; mini-batches
    then hold whole episodes)."""
    old_logprobs: str = "rollout"
    """The PPO ratio's old log-probs: rollout (the engine's, no extra pass) or recompute (the actor's own on the
    rollout's inputs before the update, as SimpleVLA-RL does: the first ratio is then 1 even where the engine's
    kernels or precision differ from the actor's)."""
    tis_cap: float = 0.0
    """With old_logprobs=recompute: > 0 weighs each token by min(actor / rollout probability, tis_cap), the truncated
    importance-sampling correction for tokens the engine sampled; 0 leaves it out."""
    old_logprobs_from_update: bool = True
    """With old_logprobs=recompute: the first mini-batch's old log-probs are its own update forward's, detached (no
    optimizer step has run yet, so they are what a recompute would give), and only later mini-batches' samples are
    recomputed first; false recomputes every sample in a pass of its own (SimpleVLA-RL's way). With one mini-batch
    the recompute pass is gone."""


@dataclass
class ParallelConfig:
    ray_address: str = ""
    """Ray cluster to join ('' starts a local one)."""
    ray_dashboard: bool = False
    """Start Ray's dashboard (bound to 127.0.0.1)."""
    ray_num_cpus: int = 0
    """CPUs a local Ray advertises (0: all of this machine's)."""


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 3
    """ZeRO stage of the actor: 0, 1, 2 or 3."""
    bf16: bool = False
    """Train in bf16 (GPU); CPU runs stay fp32."""
    offload_optimizer: bool = False
    """Keep optimizer state on the CPU (ZeRO offload)."""
    offload_param: bool = False
    """Keep the ZeRO-3 parameter shards on the CPU, fetched for each layer as it runs (ZeRO-Infinity style)."""
    activation_checkpointing: bool = False
    """Recompute the activations of the Llama layers and the vision towers' blocks in the backward pass instead of
    storing them (only each block's input is kept)."""
    leaf_modules: bool = False
    """ZeRO-3: fetch each Llama layer's and vision block's parameters at once on entering it (DeepSpeed leaf modules)
    instead of hooking every submodule: far fewer hooks and gathers per step on big models."""
    param_persistence_threshold: int = 0
    """ZeRO-3: parameters of at most this many elements stay whole on every rank instead of being gathered at each
    use (0 shards everything; DeepSpeed's own default is 100000). Fewer, larger gathers per step on big models."""
    prefetch_bucket_size: int = 50_000_000
    """ZeRO-3: elements of the parameters used next that are gathered ahead of their use, overlapping compute."""
    max_live_parameters: int = 1_000_000_000
    """ZeRO-3: gathered parameter elements a rank may hold at once before releasing some."""
    offload_states_during_rollout: bool = False
    """Colocated memory: move the actor's optimizer state, fp32 weights and gradients to CPU memory from the end of
    each update until the next one begins (ZeRO-3, GPU), so the rollout engine has the GPU to itself."""
    release_engine_during_update: bool = False
    """Colocated memory: the rollout engine frees its weights' GPU memory while the actor updates; the weight sync
    after the update refills them."""
    stream_optimizer_states: bool = False
    """ZeRO-3: the optimizer's moments and fp32 master weights live in pinned CPU memory and visit the GPU one
    sub-group (`sub_group_size` elements) at a time for the optimizer step, so the update's forward and backward run
    without them: at 7B the GPU holds 12 GB of them at once instead of 90. Replaces
    offload_states_during_rollout's moves (the states never stay on the GPU)."""
    sub_group_size: int = 1_000_000_000
    """ZeRO-3: elements the optimizer steps at once (DeepSpeed's sub-groups; what stream_optimizer_states moves)."""
    trim_prompt_padding: bool = True
    """The update's and the recompute's forwards run on each micro-batch's longest prompt instead of the fixed prompt
    budget (the cut columns are masked keys; false keeps the budget's padding, as the anchors run it)."""
    sync_bucket_mb: int = 64
    """Weight sync gathers parameters in buckets of at most this many MB."""
    sync_verify_every: int = 1
    """Verify every k-th weight sync (bit comparison on every rank, checksum logged as `sync/checksum`); the first
    sync after start or resume is always verified. 1 verifies all; larger values trade proof for sync time."""


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """The simulators and their task suite."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """The RL algorithm."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Ray and process placement."""
    deepspeed: DeepSpeedConfig = field(default_factory=DeepSpeedConfig)
    """The DeepSpeed actor."""
    seed: int = 0
    """Seed of the task sampler, the model init and the rollout sampling."""
    deterministic: bool = False
    """Same-seed and resumed runs give identical numbers: one intra-op thread on CPU (float sums in one order),
    deterministic kernels on GPU (`torch.use_deterministic_algorithms`, cuBLAS workspace pinned)."""
    steps: int = 120
    """RL steps to train."""
    eval_every: int = 20
    """Evaluate on the held-out init states every this many steps (and at step 0 and at the end)."""
    save_every: int = 40
    """Write a checkpoint every this many steps (and at the end); 0 disables."""
    resume: bool = False
    """Continue from the latest checkpoint in the run directory."""
    run_dir: str = ""
    """Run directory ('' uses Hydra's output directory)."""
    progress: bool = True
    """Show progress bars."""



PUBLISHED_INIT_STATES = 50
"""Init states per task that LIBERO's published success rates play (0..49)."""


def init_state_ids(env: EnvConfig, split: str) -> list[int]:
    """Init-state ids of a split: "train" is 0..n_train-1, "eval" the next n_eval (disjoint); with
    env.train_on_eval_states, "train" is the "eval" ids (SimpleVLA-RL trains on the states it evaluates on); with
    env.eval_protocol=published, "eval" is 0..49."""
    if split == "eval" and env.eval_protocol == "published":
        return list(range(PUBLISHED_INIT_STATES))
    first_eval = env.num_train_init_states
    eval_ids = list(range(first_eval, first_eval + env.num_eval_init_states))
    if split == "eval":
        return eval_ids
    if split == "train":
        return eval_ids if env.train_on_eval_states else list(range(env.num_train_init_states))
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")


def register_configs() -> None:
    """Register the schemas so YAML files are checked against them."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)


def to_config(cfg: DictConfig | Config) -> Config:
    """Turn a Hydra DictConfig into the typed dataclass tree."""
    if isinstance(cfg, Config):
        return cfg
    obj = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(Config), cfg))
    assert isinstance(obj, Config)
    return obj


CHOICES: dict[str, tuple[Any, ...]] = {
    "algo.name": ("grpo",),
    "model.attention": ("bidirectional", "causal"),
    "env.eval_protocol": ("held_out", "published"),
    "model.image_resize": ("bicubic", "jpeg_lanczos3"),
    "deepspeed.zero_stage": (0, 1, 2, 3),
    "env.rollout.precision": ("bf16", "fp8"),
}
"""Keys whose value must be one of a few names (the loss options, the LIBERO scene modes and env.name/env.suite are
checked against the modules that define them)."""

AT_LEAST_1, AT_LEAST_2, AT_LEAST_0 = (">= 1", 1, True), (">= 2", 2, True), (">= 0", 0, True)
POSITIVE = ("> 0", 0, False)

BOUNDS: dict[str, tuple[str, float, bool]] = {
    **{f"model.{k}": AT_LEAST_1 for k in ("image_size", "patch_size", "vision_dim", "vision_layers", "hidden_size",
                                         "num_layers", "num_heads", "intermediate_size", "chunk_len", "action_dim",
                                         "proprio_dim", "pad_to_multiple_of")},
    "model.n_bins": AT_LEAST_2,
    **{f"model.{k}": AT_LEAST_0 for k in ("ordinal_bin_init", "max_text_len", "vocab_size", "num_images",
                                         "lora.rank")},
    "model.lora.alpha": POSITIVE,
    "env.rollout.pipeline_stage_num": AT_LEAST_1,
    "env.disagg_sim.nnodes": AT_LEAST_1,
    **{f"env.{k}": AT_LEAST_1 for k in ("num_tasks", "num_eval_init_states", "num_workers", "sims_per_worker",
                                       "max_failures")},
    **{f"env.{k}": AT_LEAST_0 for k in ("num_train_init_states", "camera_resolution", "eval_videos_per_task",
                                       "max_steps",
                                       "reach.physics_substeps", "libero.settle_steps", "libero.texture_max_side")},
    "env.reach.max_delta": POSITIVE,
    "env.step_timeout_s": POSITIVE,
    **{f"algo.{k}": AT_LEAST_1 for k in ("batch_size", "mini_batches", "micro_batches")},
    "algo.group_size": AT_LEAST_2,
    **{f"algo.{k}": POSITIVE for k in ("temperature", "clip_low", "clip_high", "lr")},
    **{f"algo.{k}": AT_LEAST_0 for k in ("filter_low", "filter_high", "max_resample_rounds", "weight_decay",
                                        "grad_clip", "tis_cap")},
    "parallel.ray_num_cpus": AT_LEAST_0,
    "deepspeed.param_persistence_threshold": AT_LEAST_0,
    **{f"deepspeed.{k}": AT_LEAST_1 for k in ("prefetch_bucket_size", "max_live_parameters", "sync_bucket_mb",
                                             "sync_verify_every", "sub_group_size")},
    **{k: AT_LEAST_1 for k in ("steps", "eval_every")},
    **{k: AT_LEAST_0 for k in ("seed", "save_every")},
}
"""Every numeric key's range: (phrase, limit, limit allowed). A size or count that reaches a buffer, a division or a
split is >= 1 wherever zero has no meaning; a test keeps every int and float field listed here."""

UPPER: dict[str, tuple[float, bool]] = {"algo.clip_low": (1.0, False), "algo.filter_low": (1.0, True),
                                         "algo.filter_high": (1.0, True)}
"""Keys that must also stay below a limit: (limit, limit allowed); a clip_low of 1 would make the ratio floor 0."""


MOVED_KEYS = {"env.max_delta": "env.reach.max_delta", "env.reach_physics_substeps": "env.reach.physics_substeps",
              "env.settle_steps": "env.libero.settle_steps", "env.libero_assets": "env.libero.assets",
              "env.libero_texture_max_side": "env.libero.texture_max_side", "env.libero_scenes": "env.libero.scenes",
              "checkpoint": "model.checkpoint"}
"""Keys by their former names: settings that moved into their simulator's own group, and launch/eval.py's
`checkpoint=` (a training run's step folders are checkpoint folders, loaded through model.checkpoint)."""


def moved_key_error(overrides: list[str]) -> str | None:
    """The entry scripts' error for overrides that use former key names (checked before Hydra, which would only
    call such a key unknown), or None."""
    problems = moved_key_problems(overrides)
    return "error: invalid configuration:\n  - " + "\n  - ".join(problems) if problems else None


def moved_key_problems(overrides: list[str]) -> list[str]:
    """Command-line overrides that name a key by a former name, each with the name it has now; Hydra itself would
    only say that the key is unknown."""
    problems = []
    for arg in overrides:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in MOVED_KEYS:
            problems.append(f"{key} is now {MOVED_KEYS[key]}: write {MOVED_KEYS[key]}={value}")
        elif key.startswith("trainer."):
            problems.append(f"{key}: the trainer group (trainer.nnodes, trainer.n_rollout_gpus_per_node, "
                            "trainer.n_env_gpus_per_node) was never read and is gone; drop it")
    return problems


def explicit_keys(overrides: list[str]) -> frozenset[str]:
    """The dotted keys a command line sets (`model.chunk_len=4`, `+x.y=1`); group choices (`model=tiny`) are not
    keys."""
    return frozenset(key for arg in overrides if "." in (key := arg.lstrip("+~").partition("=")[0]))


def value_at(cfg: Any, key: str) -> Any:
    """`cfg`'s value under a dotted key (`env.rollout.pipeline_stage_num`)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def range_problems(cfg: Config) -> dict[str, str]:
    """{key: what is wrong and the fix} for every value outside its range (BOUNDS, UPPER) or its names (CHOICES)."""
    problems: dict[str, str] = {}
    for key, (phrase, limit, inclusive) in BOUNDS.items():
        value = value_at(cfg, key)
        if value < limit or (value == limit and not inclusive):
            problems[key] = f"{key}={value} must be {phrase}"
    for key, (top, inclusive) in UPPER.items():
        value = value_at(cfg, key)
        if value > top or (value == top and not inclusive):
            problems[key] = f"{key}={value} must be {'<=' if inclusive else '<'} {top}"
    for key, names in CHOICES.items():
        if value_at(cfg, key) not in names:
            problems[key] = f"{key}={value_at(cfg, key)!r}: choose one of {list(names)}"
    return problems


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def validate(cfg: Config, world_size: int = 1) -> Config:
    """Check the arithmetic and the names; raise one ConfigError listing every problem and its fix."""
    from vla_scale.envs.registry import ENVS, SUITES, suite_num_tasks, task_step_limits

    out_of_range = range_problems(cfg)
    problems = list(out_of_range.values())

    def sound(*keys: str) -> bool:  # the arithmetic below divides by these values
        return not out_of_range.keys() & set(keys)

    m, e, a = cfg.model, cfg.env, cfg.algo
    if e.name not in ENVS:
        problems.append(f"env.name={e.name!r} is not a known simulator; choose one of {sorted(ENVS)}")
    elif e.suite not in SUITES.get(e.name, ()):
        problems.append(f"env.suite={e.suite!r} is not a suite of env {e.name!r}; choose one of {SUITES[e.name]}")
    elif e.max_steps == 0 and task_step_limits(e.name, e.suite) is None:
        problems.append(f"env.max_steps=0 must be >= 1: env {e.name!r} has no step limit per task (0 gives each "
                        "LIBERO task its own suite's)")
    if sound("model.patch_size") and m.image_size % m.patch_size:
        problems.append(f"model.image_size={m.image_size} is not a multiple of model.patch_size={m.patch_size}")
    if sound("model.num_heads") and (m.hidden_size % m.num_heads or m.vision_dim % m.num_heads):
        problems.append(
            f"model.hidden_size={m.hidden_size} and model.vision_dim={m.vision_dim} must be multiples of "
            f"model.num_heads={m.num_heads}"
        )
    problems += lora_problems(m.lora)
    if e.disagg_sim.enable and not cfg.parallel.ray_address:
        problems.append("env.disagg_sim.enable=true places simulators on the simulation nodes of a Ray cluster, but "
                        "parallel.ray_address is empty (a local Ray has no simulation node): start the cluster "
                        "(README, Pipelined and disaggregated rollouts) and pass parallel.ray_address=<head>:6379 "
                        "or auto")
    if a.batch_size % world_size:
        problems.append(
            f"algo.batch_size={a.batch_size} must divide over the {world_size} ranks (whole groups per rank)"
        )
    from vla_scale.algo.grpo import LOSS_AGGREGATIONS, OLD_LOGPROBS

    if a.old_logprobs not in OLD_LOGPROBS:
        problems.append(f"algo.old_logprobs={a.old_logprobs!r}: choose one of {OLD_LOGPROBS}")
    if a.tis_cap > 0 and a.old_logprobs != "recompute":
        problems.append(f"algo.tis_cap={a.tis_cap} needs algo.old_logprobs=recompute (0 turns it off)")
    if e.rollout.precision == "fp8" and a.old_logprobs != "recompute":
        problems.append("env.rollout.precision=fp8 samples from the FP8 engine, whose log-probs are not the actor's: "
                        "set algo.old_logprobs=recompute (and algo.tis_cap, e.g. 2.0, to weigh each token by the gap)")
    if a.loss_agg not in LOSS_AGGREGATIONS:
        problems.append(f"algo.loss_agg={a.loss_agg!r} is not a loss aggregation; choose one of {LOSS_AGGREGATIONS}")
    if not 0.0 <= a.filter_low <= a.filter_high <= 1.0:
        problems.append(f"need 0 <= algo.filter_low ({a.filter_low}) <= algo.filter_high ({a.filter_high}) <= 1")
    episodes = a.batch_size * a.group_size
    stages = e.rollout.pipeline_stage_num
    slots = world_size * e.num_workers * e.sims_per_worker * stages
    if sound("env.num_workers", "env.sims_per_worker", "env.rollout.pipeline_stage_num") and episodes % slots:
        good = [d for d in _divisors(episodes) if d % world_size == 0]
        problems.append(
            f"episodes per step algo.batch_size*algo.group_size = {a.batch_size}*{a.group_size} = {episodes} must "
            f"divide over ranks*env.num_workers*env.sims_per_worker*env.rollout.pipeline_stage_num = {world_size}*"
            f"{e.num_workers}*{e.sims_per_worker}*{stages} = {slots}; make that product one of {good}, "
            "or change the batch"
        )
    filtering = a.filter_low > 0 or a.filter_high < 1  # else every group is kept
    fewest = a.group_size if filtering else episodes // world_size
    if a.mini_batches * a.micro_batches > fewest:
        problems.append(
            f"algo.mini_batches*algo.micro_batches = {a.mini_batches}*{a.micro_batches} exceeds {fewest}, the fewest "
            + ("episodes an update can get (one group kept by algo.filter_low/filter_high)" if filtering else
               "episodes a rank updates on") + "; lower them"
        )
    env_cls = ENVS.get(e.name)
    suite_tasks = suite_num_tasks(e.name, e.suite) if e.suite in SUITES.get(e.name, ()) else None
    if suite_tasks is not None and not 1 <= e.num_tasks <= suite_tasks:
        problems.append(f"env.num_tasks={e.num_tasks} but suite {e.suite!r} has {suite_tasks} tasks; "
                        f"use 1..{suite_tasks}")
    if env_cls is not None and e.num_train_init_states + e.num_eval_init_states > env_cls.NUM_INIT_STATES:
        problems.append(
            f"env.num_train_init_states + env.num_eval_init_states = {e.num_train_init_states} + "
            f"{e.num_eval_init_states} exceeds the {env_cls.NUM_INIT_STATES} init states per task; lower them"
        )
    if e.num_train_init_states < 1 and not e.train_on_eval_states:
        problems.append("env.num_train_init_states=0 leaves nothing to train on: set it >= 1, or "
                        "env.train_on_eval_states=true")
    problems += published_protocol_problems(e)
    if e.name in ENVS:
        problems += e.startup_problems()
    ds = cfg.deepspeed
    for key in ("offload_param", "leaf_modules", "stream_optimizer_states"):
        if getattr(ds, key) and ds.zero_stage != 3:
            problems.append(f"deepspeed.{key}=true needs deepspeed.zero_stage=3 (got {ds.zero_stage})")
    if ds.offload_states_during_rollout and (ds.zero_stage != 3 or ds.offload_optimizer or ds.offload_param):
        problems.append("deepspeed.offload_states_during_rollout=true needs deepspeed.zero_stage=3 with "
                        "offload_optimizer=false and offload_param=false (states already on the CPU cannot move)")
    if ds.stream_optimizer_states and ds.offload_optimizer:
        problems.append("deepspeed.stream_optimizer_states=true steps on the GPU: it needs "
                        "deepspeed.offload_optimizer=false (that one steps on the CPU)")
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return cfg


def published_protocol_problems(env: EnvConfig) -> list[str]:
    """What keeps env.eval_protocol=published from being the published protocol: another simulator than LIBERO's,
    another step limit than the suite's."""
    if env.eval_protocol != "published":
        return []
    if env.name != "libero":
        return [f"env.eval_protocol=published is LIBERO's published protocol; env={env.name} has none (use held_out)"]
    from vla_scale.envs.libero import OFT_MAX_STEPS, UNIFIED_SUITES

    if env.suite in UNIFIED_SUITES and env.max_steps != 0:
        return [f"env.eval_protocol=published plays each {env.suite} task with its own suite's step limit, but "
                f"env.max_steps={env.max_steps}: set env.max_steps=0 (or use env.eval_protocol=held_out)"]
    limit = OFT_MAX_STEPS.get(env.suite)
    if limit is not None and env.max_steps not in (0, limit):
        return [f"env.eval_protocol=published plays {env.suite}'s step limit {limit}, but env.max_steps="
                f"{env.max_steps}: drop the env.max_steps override (or use env.eval_protocol=held_out)"]
    return []


def lora_problems(lora: LoraConfig) -> list[str]:
    """`model.lora.*` settings that cannot work, one line each."""
    problems = []
    unknown = [name for name in lora.target_modules if name not in (LORA_ALL_LINEAR, *LORA_TARGETS)]
    if unknown:
        problems.append(f"model.lora.target_modules: {unknown} are not linear layers of the policy; choose from "
                        f"{[LORA_ALL_LINEAR, *LORA_TARGETS]}")
    if lora.rank > 0 and not lora.target_modules:
        problems.append(f"model.lora.rank={lora.rank} but model.lora.target_modules is empty: name the layers")
    if lora.path and not os.path.isfile(os.path.join(lora.path, "adapter_config.json")):
        problems.append(f"model.lora.path={lora.path!r} has no adapter_config.json: point it at an adapter folder "
                        "(PEFT layout: adapter_config.json, adapter_model.safetensors)")
    return problems


def as_yaml(cfg: Config | Any) -> str:
    """The resolved configuration as YAML text (logged with every run)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def field_docs() -> dict[str, list[tuple[str, str, str, str]]]:
    """{schema class: [(field, type, default, docstring)]} read from this file's field docstrings."""
    import ast
    import inspect
    import sys

    tree = ast.parse(inspect.getsource(sys.modules[__name__]))
    docs: dict[str, list[tuple[str, str, str, str]]] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Config"):
            continue
        rows = docs.setdefault(node.name, [])
        for stmt, nxt in zip(node.body, node.body[1:] + [None], strict=True):
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else ""
                default = ast.unparse(stmt.value) if stmt.value is not None else ""
                rows.append((stmt.target.id, ast.unparse(stmt.annotation), default, " ".join(str(doc).split())))
    return docs


def config_markdown() -> str:
    """docs/CONFIG.md: every field with its type, default and meaning."""
    sections = {"Config": "top level", "ModelConfig": "model", "LoraConfig": "model.lora", "EnvConfig": "env",
                "RolloutConfig": "env.rollout",
                "DisaggSimConfig": "env.disagg_sim", "ReachConfig": "env.reach", "LiberoConfig": "env.libero",
                "AlgoConfig": "algo", "ParallelConfig": "parallel", "DeepSpeedConfig": "deepspeed"}
    lines = ["# Configuration", "", "Generated from `src/vla_scale/config.py` by `python -m vla_scale.config`; "
             "override any field on the command line (`algo.lr=3e-4`) or pick a group option (`deepspeed=zero2`).", ""]
    docs = field_docs()
    for cls, group in sections.items():
        lines += [f"## `{group}` ({cls})", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        prefix = "" if cls == "Config" else f"{group}."
        lines += [f"| `{prefix}{name}` | {typ} | `{default}` | {doc} |" for name, typ, default, doc in docs[cls]]
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(config_markdown())
