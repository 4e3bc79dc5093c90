"""The configuration's checks: `validate()` raises one `ConfigError` listing every problem with the keys involved
and a suggested fix, before any compute is spent: every numeric key's range (`BOUNDS`, `UPPER`), the names
(`choices`, and the modules that define the others), the arithmetic between groups and each simulator's start-up
checks (`EnvConfig.startup_problems`).
"""

from __future__ import annotations

import os
from typing import Any

from vla_scale.config.schema import (
    Config,
    ConfigError,
    EnvConfig,
    LoraConfig,
    RecordConfig,
)
from vla_scale.envs.registry import SIMULATORS, simulator
from vla_scale.envs.simulator import Simulator
from vla_scale.models.registry import FAMILIES


def choices() -> dict[str, tuple[Any, ...]]:
    """Keys whose value must be one of a few names, each list taken from the module whose code the names select (the
    loss options, the LIBERO scene modes and env.name/env.suite are checked against their modules further down).
    Imported when the check runs, so that reading the configuration (and refusing a moved key) imports no torch."""
    from vla_scale.algo.registry import algorithm_names
    from vla_scale.datasets.lerobot_format import VERSIONS, VIDEO_CODECS
    from vla_scale.models.critic import CRITIC_POSITIONS
    from vla_scale.models.fp8 import PRECISIONS
    from vla_scale.models.fp8_update import UPDATE_PRECISIONS
    from vla_scale.models.kernels import KERNELS
    from vla_scale.models.oft.spec import ACTION_HEADS, ATTENTION_MODES, IMAGE_RESIZES

    return {
        "algo.name": algorithm_names(),
        "algo.critic.position": CRITIC_POSITIONS,
        "model.attention": ATTENTION_MODES,
        "model.action_head": ("auto", *ACTION_HEADS),
        "env.eval_protocol": ("held_out", "published"),
        "model.image_resize": IMAGE_RESIZES,
        "model.family": tuple(FAMILIES),
        "model.kernels": KERNELS,
        "sft.image_augmentation": ("auto", "none", "openpi"),
        **{f"model.{name}.{key}": names for name, record in FAMILIES.items() if record.settings is not None
           for key, names in record.settings.choices().items()},
        "deepspeed.zero_stage": (0, 1, 2, 3),
        "rollout.precision": PRECISIONS,
        "deepspeed.update_precision": UPDATE_PRECISIONS,
        "record.episodes": ("all", "successes"),
        "demo.label": ("executed", "intended"),
        "record.version": VERSIONS,
        "record.codec": VIDEO_CODECS,
    }

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
    **{f"model.{name}.{k}": bound for name, record in FAMILIES.items() if record.settings is not None
       for k, bound in record.settings.BOUNDS.items()},
    "model.action_log_std_init": (">= -10", -10, True),
    "rollout.pipeline_stage_num": AT_LEAST_1,
    "sync.bucket_mb": AT_LEAST_1,
    "sync.verify_every": AT_LEAST_1,
    "parallel.disagg_sim.nnodes": AT_LEAST_1,
    **{f"parallel.{k}": AT_LEAST_1 for k in ("num_workers", "sims_per_worker", "max_failures")},
    **{f"env.{k}": AT_LEAST_1 for k in ("num_tasks", "num_eval_init_states")},
    **{f"env.{k}": AT_LEAST_0 for k in ("num_train_init_states", "extra_train_init_states", "camera_resolution",
                                       "eval_videos_per_task", "max_steps")},
    **{f"env.{name}.{k}": bound for name, sim in SIMULATORS.items() for k, bound in sim.settings.BOUNDS.items()},
    "parallel.step_timeout_s": POSITIVE,
    **{f"algo.{k}": AT_LEAST_1 for k in ("batch_size", "mini_batches", "micro_batches")},
    "algo.group_size": AT_LEAST_1,
    **{f"algo.{k}": AT_LEAST_0 for k in ("gamma", "gae_lambda", "vf_coef", "value_clip")},
    "algo.critic.width": AT_LEAST_1,
    **{f"algo.critic.{k}": AT_LEAST_0 for k in ("lr", "warmup_steps")},
    **{f"algo.{k}": POSITIVE for k in ("temperature", "clip_low", "clip_high", "lr")},
    **{f"algo.{k}": AT_LEAST_0 for k in ("filter_low", "filter_high", "max_resample_rounds", "weight_decay",
                                        "grad_clip", "tis_cap", "max_staleness")},
    "parallel.ray_num_cpus": AT_LEAST_0,
    "deepspeed.param_persistence_threshold": AT_LEAST_0,
    **{f"deepspeed.{k}": AT_LEAST_1 for k in ("prefetch_bucket_size", "max_live_parameters", "sub_group_size")},
    "deepspeed.resident_sub_groups": AT_LEAST_0,
    "deepspeed.recompute_layers": (">= -1 (-1: every layer)", -1, True),
    **{f"sft.{k}": AT_LEAST_1 for k in ("steps", "batch_size", "micro_batches", "log_every")},
    **{f"sft.{k}": AT_LEAST_0 for k in ("weight_decay", "grad_clip", "save_every", "first_steps")},
    "sft.lr": POSITIVE,
    "record.fps": AT_LEAST_1,
    "demo.episodes": AT_LEAST_1,
    "demo.noise": AT_LEAST_0,
    "steps": AT_LEAST_1,
    "eval_every": (">= 0 (0: no evaluation during the run; env.num_eval_init_states and env.num_tasks shrink each "
                   "one)", 0, True),
    **{k: AT_LEAST_0 for k in ("seed", "save_every")},
}
"""Every numeric key's range: (phrase, limit, limit allowed). A size or count that reaches a buffer, a division or a
split is >= 1 wherever zero has no meaning; a simulator's own keys come from its settings class (`BOUNDS`); a test
keeps every int and float field listed here."""

UPPER: dict[str, tuple[float, bool]] = {"algo.clip_low": (1.0, False), "algo.filter_low": (1.0, True),
                                         "algo.gamma": (1.0, True), "algo.gae_lambda": (1.0, True),
                                         "algo.filter_high": (1.0, True), "model.action_log_std_init": (2.0, True)}
"""Keys that must also stay below a limit: (limit, limit allowed); a clip_low of 1 would make the ratio floor 0, a
log-std above 2 spreads the Gaussian far beyond the normalised action range [-1, 1]."""


def value_at(cfg: Any, key: str) -> Any:
    """`cfg`'s value under a dotted key (`rollout.pipeline_stage_num`)."""
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def range_problems(cfg: Config) -> dict[str, str]:
    """{key: what is wrong and the fix} for every value outside its range (BOUNDS, UPPER) or its names (`choices`)."""
    problems: dict[str, str] = {}
    for key, (phrase, limit, inclusive) in BOUNDS.items():
        value = value_at(cfg, key)
        if value < limit or (value == limit and not inclusive):
            problems[key] = f"{key}={value} must be {phrase}"
    for key, (top, inclusive) in UPPER.items():
        value = value_at(cfg, key)
        if value > top or (value == top and not inclusive):
            problems[key] = f"{key}={value} must be {'<=' if inclusive else '<'} {top}"
    for key, names in choices().items():
        if value_at(cfg, key) not in names:
            problems[key] = f"{key}={value_at(cfg, key)!r}: choose one of {list(names)}"
    return problems


def _divisors(n: int, limit: int = 64) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def validate(cfg: Config, world_size: int = 1) -> Config:
    """Check the arithmetic and the names; raise one ConfigError listing every problem and its fix."""
    out_of_range = range_problems(cfg)
    problems = list(out_of_range.values())

    def sound(*keys: str) -> bool:  # the arithmetic below divides by these values
        return not out_of_range.keys() & set(keys)

    m, e, a = cfg.model, cfg.env, cfg.algo
    sim, env_problems = known_simulator(e)
    problems += env_problems
    if sound("model.patch_size") and m.image_size % m.patch_size:
        problems.append(f"model.image_size={m.image_size} is not a multiple of model.patch_size={m.patch_size}")
    if sound("model.num_heads") and (m.hidden_size % m.num_heads or m.vision_dim % m.num_heads):
        problems.append(
            f"model.hidden_size={m.hidden_size} and model.vision_dim={m.vision_dim} must be multiples of "
            f"model.num_heads={m.num_heads}"
        )
    problems += lora_problems(m.lora)
    problems += [problem for name, record in FAMILIES.items() if record.settings is not None
                 for problem in getattr(m, name).problems(f"model.{name}")]
    if cfg.parallel.disagg_sim.enable and not cfg.parallel.ray_address:
        problems.append("parallel.disagg_sim.enable=true places simulators on the simulation nodes of a Ray "
                        "cluster, but parallel.ray_address is empty (a local Ray has no simulation node): start the "
                        "cluster (README, Pipelined and disaggregated rollouts) and pass "
                        "parallel.ray_address=<head>:6379 or auto")
    if a.batch_size % world_size:
        problems.append(
            f"algo.batch_size={a.batch_size} must divide over the {world_size} ranks (whole groups per rank)"
        )
    from vla_scale.objectives import LOSS_AGGREGATIONS, OLD_LOGPROBS

    if a.old_logprobs not in OLD_LOGPROBS:
        problems.append(f"algo.old_logprobs={a.old_logprobs!r}: choose one of {OLD_LOGPROBS}")
    if a.tis_cap > 0 and a.old_logprobs != "recompute":
        problems.append(f"algo.tis_cap={a.tis_cap} needs algo.old_logprobs=recompute (0 turns it off)")
    if cfg.rollout.precision == "fp8" and a.old_logprobs != "recompute":
        problems.append("rollout.precision=fp8 samples from the FP8 engine, whose log-probs are not the actor's: "
                        "set algo.old_logprobs=recompute (and algo.tis_cap, e.g. 2.0, to weigh each token by the gap)")
    if cfg.deepspeed.update_precision == "fp8" and not cfg.deepspeed.bf16:
        problems.append("deepspeed.update_precision=fp8 writes its products in bf16 (torch's row-scaled FP8 kernel) "
                        "and the actor trains in float32: set deepspeed.bf16=true (a GPU run: deepspeed=zero3_bf16), "
                        "or deepspeed.update_precision=fp8_emulated to check the arithmetic in float32")
    if a.max_staleness > 1:
        problems.append(f"algo.max_staleness={a.max_staleness}: 0 or 1 (one rollout collected during the update)")
    if a.max_staleness and not (a.old_logprobs == "recompute" and a.tis_cap > 0):
        problems.append(f"algo.max_staleness={a.max_staleness} trains on samples of the weights before the last "
                        "update: correct for them with algo.old_logprobs=recompute algo.tis_cap=2.0 (any cap > 0)")
    for key in ("release_engine_during_update", "offload_states_during_rollout"):
        if a.max_staleness and getattr(cfg.deepspeed, key):
            problems.append(f"algo.max_staleness={a.max_staleness} decodes while the actor trains, so the engine's "
                            f"weights and the actor's states stay on the GPU: set deepspeed.{key}=false "
                            "(deepspeed.stream_optimizer_states=true keeps the optimizer states on the host instead)")
    problems += algorithm_problems(cfg)
    if a.loss_agg not in LOSS_AGGREGATIONS:
        problems.append(f"algo.loss_agg={a.loss_agg!r} is not a loss aggregation; choose one of {LOSS_AGGREGATIONS}")
    if not 0.0 <= a.filter_low <= a.filter_high <= 1.0:
        problems.append(f"need 0 <= algo.filter_low ({a.filter_low}) <= algo.filter_high ({a.filter_high}) <= 1")
    episodes = a.batch_size * a.group_size
    stages = cfg.rollout.pipeline_stage_num
    p = cfg.parallel
    slots = world_size * p.num_workers * p.sims_per_worker * stages
    if sound("parallel.num_workers", "parallel.sims_per_worker", "rollout.pipeline_stage_num") and episodes % slots:
        good = [d for d in _divisors(episodes) if d % world_size == 0]
        problems.append(
            f"episodes per step algo.batch_size*algo.group_size = {a.batch_size}*{a.group_size} = {episodes} must "
            "divide over ranks*parallel.num_workers*parallel.sims_per_worker*rollout.pipeline_stage_num = "
            f"{world_size}*{p.num_workers}*{p.sims_per_worker}*{stages} = {slots}; make that product one of {good}, "
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
    suite_tasks = sim.num_tasks(e.suite) if sim is not None and e.suite in sim.suites else None
    if suite_tasks is not None and not 1 <= e.num_tasks <= suite_tasks:
        problems.append(f"env.num_tasks={e.num_tasks} but suite {e.suite!r} has {suite_tasks} tasks; "
                        f"use 1..{suite_tasks}")
    if sim is not None and sim.max_resolution and e.camera_resolution > sim.max_resolution:
        problems.append(f"env.camera_resolution={e.camera_resolution} is beyond the {sim.max_resolution} px env "
                        f"{e.name!r} renders at most: lower it (0: the policy's own)")
    used = e.num_train_init_states + e.num_eval_init_states + e.extra_train_init_states
    if sim is not None and used > sim.num_init_states:
        problems.append(
            f"env.num_train_init_states + env.num_eval_init_states + env.extra_train_init_states = "
            f"{e.num_train_init_states} + {e.num_eval_init_states} + {e.extra_train_init_states} exceeds the "
            f"{sim.num_init_states} init states per task; lower them"
        )
    if e.num_train_init_states < 1 and not e.train_on_eval_states:
        problems.append("env.num_train_init_states=0 leaves nothing to train on: set it >= 1, or "
                        "env.train_on_eval_states=true")
    problems += published_protocol_problems(e)
    if sim is not None:
        problems += e.startup_problems()
    ds = cfg.deepspeed
    for key in ("offload_param", "leaf_modules", "stream_optimizer_states"):
        if getattr(ds, key) and ds.zero_stage != 3:
            problems.append(f"deepspeed.{key}=true needs deepspeed.zero_stage=3 (got {ds.zero_stage})")
    if ds.offload_states_during_rollout and (ds.zero_stage != 3 or ds.offload_optimizer or ds.offload_param):
        problems.append("deepspeed.offload_states_during_rollout=true needs deepspeed.zero_stage=3 with "
                        "offload_optimizer=false and offload_param=false (states already on the CPU cannot move)")
    if ds.resident_sub_groups and not ds.stream_optimizer_states:
        problems.append(f"deepspeed.resident_sub_groups={ds.resident_sub_groups} keeps some streamed states on the "
                        "GPU: it needs deepspeed.stream_optimizer_states=true")
    if ds.stream_optimizer_states and ds.offload_optimizer:
        problems.append("deepspeed.stream_optimizer_states=true steps on the GPU: it needs "
                        "deepspeed.offload_optimizer=false (that one steps on the CPU)")
    if problems:
        raise ConfigError("invalid configuration:\n  - " + "\n  - ".join(problems))
    return cfg


def algorithm_problems(cfg: Config) -> list[str]:
    """What contradicts itself between the algorithm and the other `algo.*` keys, the algorithm's own checks
    (`Algorithm.config_problems`: GRPO's groups of one, PPO with GRPO's group filter, a critic warm-up as long as the
    run); nothing for an unknown name, which `choices` refuses."""
    from vla_scale.algo.registry import algorithm_class, algorithm_names

    if cfg.algo.name not in algorithm_names():
        return []
    return algorithm_class(cfg.algo.name).config_problems(cfg.algo, cfg.steps)


def sft_problems(cfg: Config, world_size: int = 1) -> list[str]:
    """What keeps launch/sft.py from running `cfg` on `world_size` ranks (beyond `validate`'s checks)."""
    s, problems = cfg.sft, []
    if not s.dataset:
        problems.append("sft.dataset is not set: name a LeRobot-format dataset folder (launch/demonstrate.py or "
                        "launch/eval.py record.path=... write one)")
    sim = SIMULATORS.get(cfg.env.name)
    if sim is not None and (foreign := sorted(set(s.cameras) - set(sim.cameras))):
        problems.append(f"sft.cameras maps {foreign}, camera(s) env {cfg.env.name!r} has not (its cameras: "
                        f"{', '.join(sim.cameras)}): map the env's cameras to the dataset's image features")
    if s.micro_batches >= 1 and s.batch_size % (world_size * s.micro_batches):
        problems.append(f"sft.batch_size={s.batch_size} must split evenly into {world_size} rank(s) x "
                        f"sft.micro_batches={s.micro_batches}: use a multiple of {world_size * s.micro_batches}")
    return problems


def record_problems(record: RecordConfig) -> list[str]:
    """What keeps `record.path` from taking a new dataset (empty when it can): an existing file or non-empty folder."""
    if record.path and os.path.exists(record.path) and (not os.path.isdir(record.path) or os.listdir(record.path)):
        return [f"record.path={record.path} is not empty: a dataset is written only into a new folder; name another "
                "one or remove it"]
    return []


def known_simulator(env: EnvConfig) -> tuple[Simulator | None, list[str]]:
    """The simulator env.name names (None: none), and what keeps env.suite or env.max_steps=0 from fitting it."""
    try:
        sim = simulator(env.name)
    except ValueError as err:
        return None, [str(err)]
    if env.suite not in sim.suites:
        return sim, [f"env.suite={env.suite!r} is not a suite of env {env.name!r}; choose one of {sim.suites}"]
    if env.max_steps == 0 and sim.step_limits is None:
        return sim, [f"env.max_steps=0 must be >= 1: env {env.name!r} has no step limit per task (0 gives each "
                     "LIBERO task its own suite's)"]
    return sim, []


def published_protocol_problems(env: EnvConfig) -> list[str]:
    """What keeps env.eval_protocol=published from being the published protocol: a simulator without one (LIBERO
    and Meta-World have one), another step limit than the suite's."""
    if env.eval_protocol != "published":
        return []
    sim = SIMULATORS.get(env.name)
    if sim is None or sim.published_step_limit is None:
        return [f"env.eval_protocol=published is a simulator's published protocol (LIBERO's, Meta-World's); "
                f"env={env.name} has none (use held_out)"]
    limit = sim.published_step_limit(env.suite)
    if limit == 0 and env.max_steps != 0:
        return [f"env.eval_protocol=published plays each {env.suite} task with its own suite's step limit, but "
                f"env.max_steps={env.max_steps}: set env.max_steps=0 (or use env.eval_protocol=held_out)"]
    if limit and env.max_steps not in (0, limit):
        return [f"env.eval_protocol=published plays {env.suite}'s step limit {limit}, but env.max_steps="
                f"{env.max_steps}: drop the env.max_steps override (or use env.eval_protocol=held_out)"]
    return []


def lora_problems(lora: LoraConfig) -> list[str]:
    """`model.lora.*` settings that cannot work, one line each."""
    from vla_scale.models.lora import LORA_ALL_LINEAR, LORA_TARGETS

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
