"""Scripted demonstrations as a LeRobot dataset: `python launch/demonstrate.py env=pick_place record.path=DIR`.

The pick_place task's scripted demonstrator (`envs/pick_place_demo.py`, xyz noise `demo.noise`) plays
`demo.episodes` episodes on the suite's TRAIN init states (task i % num_tasks, init states in turn), so the EVAL ones
stay held out for `launch/eval.py`. Every env step is recorded (cameras, proprio state, the action taken, or with
`demo.label=intended` the action the demonstrator meant before its noise) and written to `record.path` (a new
folder; `record.episodes=successes` keeps the successful episodes only). The last line printed is
`demonstrate: episodes=<n> recorded=<m> success_rate=<r> path=<dir>`.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco's import: the simulator renders headless here

import hydra  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from vla_scale.config import (  # noqa: E402
    Config,
    ConfigError,
    init_state_ids,
    record_problems,
    register_configs,
    to_config,
    validate,
)
from vla_scale.envs.types import TaskSpec  # noqa: E402

register_configs()


def demonstration_specs(cfg: Config) -> list[TaskSpec]:
    """`demo.episodes` task specs: tasks in turn, each task's TRAIN init states in turn."""
    ids = init_state_ids(cfg.env, "train")
    n = cfg.env.num_tasks
    return [TaskSpec(cfg.env.suite, i % n, ids[(i // n) % len(ids)]) for i in range(cfg.demo.episodes)]


def problems(cfg: Config) -> list[str]:
    found = []
    if cfg.env.name != "pick_place":
        found.append(f"env.name={cfg.env.name!r} has no scripted demonstrator: use env=pick_place")
    if not cfg.record.path:
        found.append("record.path is not set: name the new folder the dataset is written to")
    found += record_problems(cfg.record)
    if not init_state_ids(cfg.env, "train"):
        found.append("env.num_train_init_states=0: the demonstrations play TRAIN init states; raise it")
    return found


def demonstrate(cfg: Config) -> float:
    from vla_scale.datasets.episodes import Episode
    from vla_scale.datasets.lerobot import LeRobotKeys, write_dataset
    from vla_scale.envs.pick_place import CAMERAS
    from vla_scale.envs.pick_place_demo import Demonstrator, play
    from vla_scale.envs.registry import make_env

    env = make_env(cfg.env.name, **cfg.env.simulator_kwargs())
    demonstrator = Demonstrator(cfg.demo.noise, cfg.seed)
    played = [play(env, spec, demonstrator) for spec in demonstration_specs(cfg)]  # type: ignore[arg-type]
    env.close()
    kept = [d for d in played if d.success or cfg.record.episodes == "all"]
    episodes = [Episode(d.instruction, d.images, d.state, d.intended if cfg.demo.label == "intended" else d.actions,
                        d.success) for d in kept]
    keys = LeRobotKeys(cameras={c: f"observation.images.{c}" for c in CAMERAS}, setting="sft")
    if episodes:
        write_dataset(cfg.record.path, episodes, keys, version=cfg.record.version, fps=cfg.record.fps,
                      video=cfg.record.video, codec=cfg.record.codec)
    rate = sum(d.success for d in played) / len(played)
    print(f"demonstrate: episodes={len(played)} recorded={len(episodes)} success_rate={rate:.3f} "
          f"path={cfg.record.path}", flush=True)
    return rate


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg = to_config(dict_cfg)
    try:
        validate(cfg)
        found = problems(cfg)
        if found:
            raise ConfigError("cannot record demonstrations:\n  - " + "\n  - ".join(found))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    return demonstrate(cfg)


if __name__ == "__main__":
    main()
