"""Scripted demonstrations as a LeRobot dataset: `python launch/demonstrate.py env=pick_place record.path=DIR`.

The simulator's scripted demonstrator (its record's `scripted_demo`: pick_place's waypoint controller,
`envs/pick_place_demo.py`; Meta-World's experts, `envs/metaworld_demo.py`; xyz noise `demo.noise`) plays
`demo.episodes` episodes on the suite's TRAIN init states (task i % num_tasks, init states in turn), so the EVAL ones
stay held out for `launch/eval.py`. Every env step is recorded (cameras, proprio state, the action taken, or with
`demo.label=intended` the action the demonstrator meant before its noise, and what else the simulator keeps) and
written to `record.path` (a new folder, the simulator's feature names; `record.episodes=successes` drops the
demonstrator's failures). A progress bar counts the episodes played and the successes so far (with `progress=false`
a plain line every tenth of the episodes instead). A line per task says how many episodes it played, succeeded and
dropped; the last line printed is `demonstrate: episodes=<n> recorded=<m> success_rate=<r> path=<dir>`.

The run directory is `run_dir=` (or `hydra.run.dir=`), else `<record.path>_run` beside the dataset: Hydra's record
(`.hydra/`) and `demonstrate.log` (everything the console shows) are written there once the checks pass, so a refused
command writes nothing anywhere and two commands never share one (each names its own new `record.path`).
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator

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
from vla_scale.launcher import checks_first_argv, write_run_record  # noqa: E402

register_configs()
sys.argv = checks_first_argv(sys.argv)  # Hydra writes nothing: the run directory is made once the checks pass


def run_directory(cfg: Config) -> str:
    """`run_dir`, else `<record.path>_run` beside the dataset."""
    return cfg.run_dir or os.path.normpath(cfg.record.path) + "_run"


class EpisodeCount:
    """The episodes played so far: a progress bar over them with the success rate (progress=true), else a plain line
    every tenth of them."""

    def __init__(self, total: int, bar: bool):
        from vla_scale.run_log import progress

        self.total, self.played, self.succeeded = total, 0, 0
        self.every = 0 if bar else max(1, math.ceil(total / 10))
        self.bar = progress(total, 0, bar, "demonstrate")

    def add(self, success: bool) -> None:
        self.played += 1
        self.succeeded += success
        self.bar.update(1)
        self.bar.set_postfix(success=f"{self.succeeded / self.played:.2f}")
        if self.every and (self.played % self.every == 0 or self.played == self.total):
            print(f"episodes {self.played}/{self.total}: {self.succeeded} succeeded", flush=True)

    def close(self) -> None:
        self.bar.close()


def demonstration_specs(cfg: Config) -> list[TaskSpec]:
    """`demo.episodes` task specs: tasks in turn, each task's TRAIN init states in turn."""
    ids = init_state_ids(cfg.env, "train")
    n = cfg.env.num_tasks
    return [TaskSpec(cfg.env.suite, i % n, ids[(i // n) % len(ids)]) for i in range(cfg.demo.episodes)]


def problems(cfg: Config) -> list[str]:
    from vla_scale.envs.registry import SIMULATORS

    found = []
    if cfg.env.name in SIMULATORS and not SIMULATORS[cfg.env.name].scripted_demo:
        scripted = [f"env={name}" for name, sim in SIMULATORS.items() if sim.scripted_demo]
        found.append(f"env.name={cfg.env.name!r} has no scripted demonstrator: use one of {', '.join(scripted)} "
                     "(Meta-World: env=metaworld_mt10, metaworld_mt50 or metaworld_mt1)")
    if not cfg.record.path:
        found.append("record.path is not set: name the new folder the dataset is written to")
    found += record_problems(cfg.record)
    if not init_state_ids(cfg.env, "train"):
        found.append("env.num_train_init_states=0: the demonstrations play TRAIN init states; raise it")
    return found


def demonstrate(cfg: Config, run_dir: str) -> float:
    """Plays the demonstrations and writes those `record.episodes` keeps as they are played (one held at a time)."""
    import numpy as np

    from vla_scale.datasets.episodes import Episode
    from vla_scale.datasets.lerobot import LeRobotKeys, NoEpisodes, write_dataset
    from vla_scale.envs.registry import make_env, simulator
    from vla_scale.envs.scripted import scripted_demo

    sim = simulator(cfg.env.name)
    play = scripted_demo(sim.scripted_demo)
    env = make_env(cfg.env.name, **cfg.env.simulator_kwargs())
    rng = np.random.default_rng(cfg.seed)
    outcomes: dict[int, list[bool]] = {}
    specs = demonstration_specs(cfg)
    print(f"demonstrating {len(specs)} episodes of {cfg.env.suite} into {cfg.record.path}, run directory {run_dir}",
          flush=True)
    count = EpisodeCount(len(specs), cfg.progress)

    def kept() -> Iterator[Episode]:
        for spec in specs:
            d = play(env, spec, cfg.demo.noise, rng)
            outcomes.setdefault(spec.task_id, []).append(d.success)
            count.add(d.success)
            if d.success or cfg.record.episodes == "all":
                actions = d.intended if cfg.demo.label == "intended" else d.actions
                yield Episode(d.instruction, d.images, d.state, actions, d.success, d.extras)

    keys = LeRobotKeys(cameras={c: sim.image_key(c) for c in sim.cameras}, setting="sft")
    try:
        write_dataset(cfg.record.path, kept(), keys, version=cfg.record.version, fps=cfg.record.fps,
                      video=cfg.record.video, codec=cfg.record.codec, robot_type=sim.name)
    except NoEpisodes:
        pass  # every demonstration failed and only successes are kept: nothing to write
    finally:
        count.close()
        env.close()
    names = sim.task_names(cfg.env.suite) if sim.task_names else sim.instructions(cfg.env.suite)
    for task, mine in sorted(outcomes.items()):
        dropped = 0 if cfg.record.episodes == "all" else mine.count(False)
        print(f"task {task} ({names[task]}): played={len(mine)} succeeded={sum(mine)} dropped={dropped}")
    played = [ok for mine in outcomes.values() for ok in mine]
    recorded = len(played) if cfg.record.episodes == "all" else sum(played)
    rate = sum(played) / len(played)
    print(f"demonstrate: episodes={len(played)} recorded={recorded} success_rate={rate:.3f} "
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
    run_dir = run_directory(cfg)
    write_run_record(run_dir, dict_cfg)
    return demonstrate(cfg, run_dir)


if __name__ == "__main__":
    main()
