"""What the entry scripts read off the command line before Hydra: keys that the schema lacks but whose setting
another key holds (Hydra would only call them unknown), and the dotted keys a command line sets."""

from __future__ import annotations

PLACEMENT_KEYS = ("num_workers", "sims_per_worker", "step_timeout_s", "max_failures", "sim_workers_in_trainer",
                  "disagg_sim", "disagg_sim.enable", "disagg_sim.nnodes")
"""The simulators' placement, once `env.*`, now `parallel.*`."""

MOVED_KEYS = {"env.max_delta": "env.reach.max_delta", "env.reach_physics_substeps": "env.reach.physics_substeps",
              "env.settle_steps": "env.libero.settle_steps", "env.libero_assets": "env.libero.assets",
              "env.libero_texture_max_side": "env.libero.texture_max_side", "env.libero_scenes": "env.libero.scenes",
              "checkpoint": "model.checkpoint",
              "env.rollout.pipeline_stage_num": "rollout.pipeline_stage_num",
              "env.rollout.precision": "rollout.precision",
              "deepspeed.sync_bucket_mb": "sync.bucket_mb", "deepspeed.sync_verify_every": "sync.verify_every",
              **{f"env.{key}": f"parallel.{key}" for key in PLACEMENT_KEYS}}
"""{key the schema lacks: the key that holds its setting}: a simulator's settings live in its own group
(`env.reach.*`, `env.libero.*`); every policy, a training run's step folders included, is loaded through
model.checkpoint; the rollout engine's settings are `rollout.*`, the weight sync's `sync.*` and the simulators'
placement `parallel.*`, as the packages they configure."""


def moved_key_error(overrides: list[str]) -> str | None:
    """The entry scripts' error for overrides that name a key of `MOVED_KEYS` or the trainer group (checked before
    Hydra, which would only call such a key unknown), or None."""
    problems = moved_key_problems(overrides)
    return "error: invalid configuration:\n  - " + "\n  - ".join(problems) if problems else None


def moved_key_problems(overrides: list[str]) -> list[str]:
    """Command-line overrides that name a key of `MOVED_KEYS`, each with the key that holds its setting, or of a
    trainer group, which the configuration has not."""
    problems = []
    for arg in overrides:
        key, _, value = arg.lstrip("+~").partition("=")
        if key in MOVED_KEYS:
            problems.append(f"{key} is now {MOVED_KEYS[key]}: write {MOVED_KEYS[key]}={value}")
        elif key.startswith("trainer."):
            problems.append(f"{key}: the trainer group (trainer.nnodes, trainer.n_rollout_gpus_per_node, "
                            "trainer.n_env_gpus_per_node) is not part of the configuration (the launcher sets the "
                            "ranks, parallel.* places the simulators); drop it")
    return problems


def explicit_keys(overrides: list[str]) -> frozenset[str]:
    """The dotted keys a command line sets (`model.chunk_len=4`, `+x.y=1`); group choices (`model=tiny`) are not
    keys."""
    return frozenset(key for arg in overrides if "." in (key := arg.lstrip("+~").partition("=")[0]))
