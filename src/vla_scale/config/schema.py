"""The typed configuration: dataclass schemas registered with Hydra's ConfigStore.

Every field carries a one-line docstring (a string literal right below it); `docs/CONFIG.md` lists them
(`config/docs.py`). Group YAMLs under `configs/` only override fields of these schemas, so a typo in a key or a wrong
type fails at load; `config/checks.py` checks what the types cannot. Each simulator's own keys (`env.<name>.*`) are
declared by its settings class in its own module and listed by the env registry (`with_simulator_settings`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from vla_scale.envs.registry import SIMULATORS, simulator
from vla_scale.models.registry import FAMILIES


class ConfigError(ValueError):
    """An impossible or unknown configuration; the message names the keys and the fix."""


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


def with_family_settings(cls: type) -> type:
    """Give the model schema one field per policy family of the registry that has keys of its own, named after it
    and holding its settings dataclass (`model.pi0.*`): a family's keys are declared in its folder, not here."""
    for name, record in FAMILIES.items():
        if record.settings is not None:
            cls.__annotations__[name] = record.settings
            setattr(cls, name, field(default_factory=record.settings))
    return cls


@dataclass
@with_family_settings
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
    use_film: bool = False
    """FiLM (OpenVLA-OFT+): every vision block scales and shifts its features by projections of the prompt's average
    token embedding, so what the towers see depends on the instruction (helps a policy tell apart objects the
    instruction names; a checkpoint's own setting is kept)."""
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
    action_head: str = "auto"
    """How actions are read from the backbone's action rows: tokens (the LM head's action bins, a categorical per
    dimension), l1 (OpenVLA-OFT's L1-regression MLP head; RL samples a Gaussian around it) or auto (a checkpoint
    folder's own: l1 when it holds an action_head--*_checkpoint.pt, else tokens; tokens for a fresh policy)."""
    action_log_std_init: float = -1.0
    """The l1 head's Gaussian: initial log-std of every action dimension in the normalised action space (learned
    during RL; a checkpoint that saved its log-std keeps its own)."""
    lora: LoraConfig = field(default_factory=LoraConfig)
    """LoRA: the adapters the actor trains (rank 0: none) and adapters to merge on load."""
    family: str = "oft"
    """The policy family, a name of the family registry (models/registry.py): oft (OpenVLA-OFT; the keys above), or
    one with keys of its own under model.<family>.* (the tables below)."""
    kernels: str = "eager"
    """The kernels of the policy's RMS norms, gated MLPs and rotary embeddings, in the actor's update and the rollout
    engine's decode, both families: eager (torch's ops, any device) or liger (Liger Kernel's Triton kernels, on a
    CUDA GPU only: less activation memory and fewer passes over it; the optional `kernels` extra, `pip install -e
    '.[kernels]'`). The parameters and checkpoints are the same either way; OFT's compiled decode on the GPU fuses
    these layers itself and keeps its kernels."""


@dataclass
class RolloutConfig:
    pipeline_stage_num: int = 1
    """Pipeline stages S: while one stage's simulators run, the next stage is decoded (1: sequential)."""
    precision: str = "bf16"
    """The rollout engine's matrix products: bf16 (the weights' own dtype) or fp8 (e4m3 with per-channel weight and
    per-row activation scales, on FP8 tensor cores: compute capability 8.9+, e.g. H100/H200; OFT's fast forward,
    or the flow families' prefix pass: the vision tower's and the VLM's layers; log-probs of a slightly different
    policy, so it needs algo.old_logprobs=recompute; what it gains per family: README, FP8 rollouts)."""


@dataclass
class SyncConfig:
    bucket_mb: int = 64
    """Weight sync (actor -> rollout engine, and checkpoints' weight files) gathers parameters in buckets of at most
    this many MB."""
    verify_every: int = 1
    """Verify every k-th weight sync (bit comparison on every rank, checksum logged as `sync/checksum`); the first
    sync after start or resume is always verified. 1 verifies all; larger values trade proof for sync time."""


@dataclass
class DisaggSimConfig:
    enable: bool = False
    """Place sim workers only on Ray nodes offering the `sim` resource (simulation nodes)."""
    nnodes: int = 1
    """Simulation nodes the run expects to find in the Ray cluster."""


def with_simulator_settings(cls: type) -> type:
    """Give the env schema one field per simulator of the registry, named after it and holding its settings
    dataclass (`env.reach.*`, `env.libero.*`): a simulator's keys are declared in its own module
    (`envs/simulator.py`), not here."""
    for name, sim in SIMULATORS.items():
        cls.__annotations__[name] = sim.settings
        setattr(cls, name, field(default_factory=sim.settings))
    return cls


@dataclass
@with_simulator_settings
class EnvConfig:
    name: str = "reach"
    """Simulator name from the env registry (`vla_scale.envs.registry.SIMULATORS`)."""
    suite: str = "reach"
    """Task suite: which tasks the sampler draws from."""
    num_tasks: int = 3
    """Tasks of the suite to train and evaluate on (ids 0..num_tasks-1)."""
    num_train_init_states: int = 40
    """Initial states 0..n-1 of every task are the TRAIN split."""
    num_eval_init_states: int = 10
    """The next n initial states of every task are the held-out EVAL split."""
    extra_train_init_states: int = 0
    """Initial states after the EVAL block that join the TRAIN split: more layouts to train on while the EVAL split
    stays the same states (pick_place generates its layouts, 100000 per task)."""
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
    TRAIN ones are trained on) or published (the simulator's published numbers: LIBERO's every task from all 50
    init states 0..49, the official scenes, the suite's OpenVLA-OFT step limit; Meta-World's LeRobot evaluation
    seeds 1000..1009 with 500 steps)."""
    eval_videos_per_task: int = 0
    """Evaluation episodes per task saved as MP4 in the run directory and logged to TensorBoard (0: none)."""

    def simulator(self) -> Any:
        """The settings of the simulator `name` names (its field of the same name, `env.<name>.*`)."""
        try:
            simulator(self.name)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        return getattr(self, self.name)

    def simulator_kwargs(self) -> dict[str, Any]:
        """The constructor kwargs of `name`'s simulator (`envs.registry.make_env(name, **kwargs)`)."""
        return {"camera_resolution": self.camera_resolution, "max_steps": self.max_steps or None,
                **self.simulator().simulator_kwargs()}

    def startup_problems(self) -> list[str]:
        """What keeps the simulator from starting that can be seen before it starts (LIBERO: its scene mode, package
        and assets), one line each naming the key or the install step."""
        return self.simulator().startup_problems(self.suite)


@dataclass
class CriticConfig:
    position: str = "prompt_last"
    """Where the value head reads the backbone's last hidden state: prompt_last (the row of the last prompt token,
    which reads the first action slot) or action_mean (the mean over the rows the action slots are read from). π0 /
    π0.5: the PaliGemma prefix's last valid row, or the mean over its valid rows."""
    width: int = 256
    """Hidden width of the value head's MLP (hidden state -> width -> width -> 1, GELU)."""
    detach_backbone: bool = False
    """The value loss trains the value head only (the backbone's hidden state detached); false: the backbone is
    shared and learns from the value loss too."""
    lr: float = 0.0
    """Learning rate of the value head (0: algo.lr)."""
    warmup_steps: int = 0
    """First RL steps that train only the value head (the policy and the backbone keep their weights)."""
    bootstrap_truncated: bool = True
    """An episode the step limit cut goes on past its last chunk: its return adds the critic's value of its final
    observation (false: the step limit ends the task as a failure, nothing after it is worth anything, as after a
    success; right where success must come within the limit and the observation does not show the time)."""


@dataclass
class AlgoConfig:
    name: str = "grpo"
    """The RL algorithm: the name of its module in `algo/` (the table below; docs/ARCHITECTURE.md, "Adding an
    algorithm")."""
    batch_size: int = 8
    """Task specs (groups) per RL step."""
    group_size: int = 8
    """Episodes per task spec; group algorithms (grpo) compare the episodes of a group (ppo: 1 is allowed)."""
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
    max_staleness: int = 0
    """Rollouts ahead of the update: 0 (one step is its rollout, then its update); 1: while update k runs, the engine,
    still holding the weights update k started from, collects the rollout update k+1 trains on (the simulators and
    the GPU busy at once). The samples are then one version behind the actor: it needs old_logprobs=recompute and
    tis_cap > 0, so the ratio is clipped to the actor before the update and each token weighs min(actor / rollout
    probability, tis_cap) (decoupled PPO). A step followed by a checkpoint collects nothing ahead."""
    gamma: float = 0.99
    """ppo: discount per chunk step."""
    gae_lambda: float = 0.95
    """ppo: GAE's lambda (1: Monte-Carlo returns minus the value, 0: one-step TD errors)."""
    vf_coef: float = 0.5
    """ppo: weight of the value loss in the update's loss."""
    value_clip: float = 0.2
    """ppo: a value moves at most this far from the one its advantage was computed with before the loss stops
    pulling (0: plain squared error)."""
    normalize_advantages: bool = True
    """ppo: advantages scaled to mean 0 and std 1 over the step's chunk steps (every rank's)."""
    critic: CriticConfig = field(default_factory=CriticConfig)
    """ppo: the value head."""


@dataclass
class ParallelConfig:
    ray_address: str = ""
    """Ray cluster to join ('': a local one, started only when something of the run runs on Ray)."""
    ray_dashboard: bool = False
    """Start Ray's dashboard (bound to 127.0.0.1)."""
    ray_num_cpus: int = 0
    """CPUs a local Ray advertises (0: all of this machine's)."""
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
    disagg_sim: DisaggSimConfig = field(default_factory=DisaggSimConfig)
    """Simulators on separate nodes (disaggregated mode)."""


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
    recompute_layers: int = -1
    """With activation_checkpointing: how many Llama layers (the first ones) recompute; the others keep their
    activations from the forward to the backward, spending memory to save their recompute (-1: every layer). The
    vision towers' blocks always recompute: they hold as many activations per sample as the Llama layers for a
    seventh of the FLOPs. `benchmarks/update_profile.py` measures the memory each layer costs."""
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
    resident_sub_groups: int = 0
    """With stream_optimizer_states: the states of this many sub-groups (the last ones stepped) stay on the GPU and
    only the others stream, for a card with room beside the update (12 GB a sub-group at 7B in fp32)."""
    trim_prompt_padding: bool = True
    """The update's and the recompute's forwards run on each micro-batch's longest prompt instead of the fixed prompt
    budget (the cut columns are masked keys; false keeps the budget's padding, as the anchors run it)."""
    update_precision: str = "bf16"
    """The actor's matrix products in the transformer blocks' linear layers, forward and backward: bf16 (the weights'
    own dtype), fp8 (e4m3 on FP8 tensor cores, each operand scaled per row along its product's contraction, the
    gradients e4m3 too; compute capability 8.9+, deepspeed.bf16=true; master weights and optimizer states as they
    are) or fp8_emulated (the same quantisation multiplied in float32, any device: CPU checks). Embeddings, norms,
    projectors and heads keep their dtype (`models/fp8_update.py`). At the 7B shape on an H100 fp8 is slower than
    bf16 and moves the log-probs ten times as far as bf16's own spread (README, FP8 in the update)."""


@dataclass
class SftConfig:
    dataset: str = ""
    """The LeRobot-format dataset (v2.1 or v3.0 folder) that launch/sft.py trains on."""
    cameras: dict[str, str] = field(default_factory=dict)
    """The policy's camera name -> the dataset's image feature key (cameras not named: the simulator's own,
    observation.images.<name>; Meta-World's corner2: observation.image, as LeRobot's Meta-World dataset has it)."""
    state_key: str = "observation.state"
    """The dataset feature holding the proprio state the env gives."""
    action_key: str = "action"
    """The dataset feature holding the actions the env took."""
    image_augmentation: str = "auto"
    """Random image augmentation of each training batch: openpi (π0's training augmentation as openpi's PyTorch model
    applies it: a 95 % crop and a turn of up to 5 degrees of the primary camera, brightness, contrast and saturation
    of every camera; `models/pi0/augment.py`), none, or auto (the family's default: openpi for π0 and π0.5, as
    there; none for OpenVLA-OFT, which openpi's is not)."""
    first_steps: int = 0
    """Train on the first this many env steps of each demonstration only (0: all of them). Where an instruction
    decides the first moves (which object to go for) and the rest follows from where the gripper is, a first stage
    on those steps, then the whole demonstrations from its checkpoint, teaches a small policy to read it (README)."""
    steps: int = 500
    """Optimizer steps of supervised fine-tuning."""
    batch_size: int = 64
    """Examples (env steps of the demonstrations) per optimizer step, over all ranks."""
    micro_batches: int = 1
    """Gradient accumulation steps each optimizer step is split into (per rank)."""
    lr: float = 5e-4
    """AdamW learning rate (OpenVLA-OFT's fine-tuning rate)."""
    weight_decay: float = 0.0
    """AdamW weight decay."""
    grad_clip: float = 1.0
    """Gradient norm clip."""
    save_every: int = 0
    """Write a checkpoint every this many steps besides the one at the end (0: only at the end)."""
    log_every: int = 10
    """Log the loss to TensorBoard every this many steps."""


@dataclass
class RecordConfig:
    path: str = ""
    """Write the episodes launch/eval.py (or launch/demonstrate.py) plays to this new folder as a LeRobot dataset
    ('': record nothing)."""
    episodes: str = "all"
    """Which episodes to record: all, or successes."""
    version: str = "v3.0"
    """LeRobot layout to write: v3.0 or v2.1."""
    video: bool = True
    """Cameras as .mp4 files encoded with record.codec (false: PNG images inside the data files, bit-exact)."""
    codec: str = "h264_yuv444"
    """Video codec: h264_yuv444 (lossless H.264 on YUV 4:4:4, frames within 2 levels, read by LeRobot's tools),
    h264_rgb (lossless H.264 on RGB planes, bit-exact frames; LeRobot's get_video_info() refuses its gbrp) or av1
    (LeRobot's default, lossy)."""
    fps: int = 10
    """Frames per second the dataset declares."""


@dataclass
class DemoConfig:
    episodes: int = 100
    """Demonstrations launch/demonstrate.py plays, spread evenly over the suite's tasks on TRAIN init states."""
    noise: float = 0.2
    """Std of the Gaussian noise on the scripted demonstrator's xyz actions (action units)."""
    label: str = "executed"
    """The actions recorded: executed (what the env ran, noise included) or intended (what the demonstrator meant
    before the noise: noise-injected states with corrective labels, as DART trains)."""


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
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """The rollout engine and how the env loop overlaps simulation and decoding."""
    sync: SyncConfig = field(default_factory=SyncConfig)
    """The weight sync from the actor to the rollout engine."""
    sft: SftConfig = field(default_factory=SftConfig)
    """Supervised fine-tuning on demonstrations (launch/sft.py)."""
    record: RecordConfig = field(default_factory=RecordConfig)
    """Recording played episodes as a LeRobot dataset (launch/eval.py, launch/demonstrate.py)."""
    demo: DemoConfig = field(default_factory=DemoConfig)
    """The scripted demonstrations of launch/demonstrate.py."""
    seed: int = 0
    """Seed of the task sampler, the model init and the rollout sampling."""
    deterministic: bool = False
    """Same-seed and resumed runs give identical numbers: one intra-op thread on CPU (float sums in one order),
    deterministic kernels on GPU (`torch.use_deterministic_algorithms`, cuBLAS workspace pinned)."""
    steps: int = 120
    """RL steps to train."""
    eval_every: int = 20
    """Evaluate on the held-out init states every this many steps (and at step 0 and at the end); 0 disables. Each
    evaluation plays env.num_tasks x env.num_eval_init_states episodes."""
    save_every: int = 40
    """Write a checkpoint every this many steps (and at the end); 0 disables."""
    resume: bool = False
    """Continue from the latest checkpoint in the run directory."""
    run_dir: str = ""
    """Run directory ('' uses Hydra's output directory)."""
    progress: bool = True
    """Show progress bars."""


def init_state_ids(env: EnvConfig, split: str) -> list[int]:
    """Init-state ids of a split: "train" is 0..n_train-1 and the n_extra after the EVAL block, "eval" the n_eval
    after n_train (disjoint); with
    env.train_on_eval_states, "train" is the "eval" ids (SimpleVLA-RL trains on the states it evaluates on); with
    env.eval_protocol=published, "eval" is the simulator's published ones (LIBERO: 0..49; Meta-World: 1000..1009)."""
    if split == "eval" and env.eval_protocol == "published":
        return list(simulator(env.name).published_init_states)
    first_eval = env.num_train_init_states
    eval_ids = list(range(first_eval, first_eval + env.num_eval_init_states))
    if split == "eval":
        return eval_ids
    if split == "train":
        if env.train_on_eval_states:
            return eval_ids
        after_eval = first_eval + env.num_eval_init_states
        return [*range(first_eval), *range(after_eval, after_eval + env.extra_train_init_states)]
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


def as_yaml(cfg: Config | Any) -> str:
    """The resolved configuration as YAML text (logged with every run)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
