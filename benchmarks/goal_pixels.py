"""How many pixels of a Meta-World task's camera image show its goal, at each camera resolution:
`python benchmarks/goal_pixels.py --resolutions 32 64 128 480`.

A task whose goal is a position (reach, push, pick-place, ...) marks it with the scene's `goal` site, a sphere of
0.02 m radius (4 cm across; red in reach, green in push, blue in pick-place); under `env.metaworld.observation=agent`
the policy sees it only in the image (its state is the end effector and the gripper; `agent_goal` and `full` hand
it the goal's xyz).
For each task of `--suite` and each of `--placements` held-out placements (EVAL seeds 1000...), the corner2 image is
rendered as the policy's is (`MetaWorldEnv`, after the reset), then again with the goal site made transparent, and
the pixels that differ are counted. A task without a goal site prints `-`; 0 means the site is hidden behind the
scene at that placement. Prints a table (tasks by resolutions, the counts of each placement) and, per resolution,
`goal_pixels: resolution=<px> median=<m> min=<n>` over the tasks that have a goal site.
"""

from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from vla_scale.envs.metaworld import MetaWorldEnv, tasks  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402

EVAL_SEED = 1000
"""The first held-out placement (configs/env/metaworld_mt10.yaml's EVAL block: LeRobot's evaluation seeds)."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--suite", default="mt10", help="a Meta-World suite (mt10, mt50) or one task's name")
    p.add_argument("--resolutions", type=int, nargs="+", default=[32, 64, 128, 480])
    p.add_argument("--placements", type=int, default=3, help="held-out placements per task")
    return p.parse_args()


def goal_pixels(env: MetaWorldEnv, task: TaskSpec) -> int | None:
    """Pixels of the image after resetting to `task` that change when the goal site is not drawn (None: no site)."""
    env.reset(task)
    model = env.raw.model
    try:
        site = model.site("goal").id
    except KeyError:
        return None
    shown = env.render().astype(np.int16)
    alpha = model.site_rgba[site, 3]
    model.site_rgba[site, 3] = 0.0
    try:
        hidden = env.render().astype(np.int16)
    finally:
        model.site_rgba[site, 3] = alpha
    return int((shown != hidden).any(axis=-1).sum())


def main() -> None:
    args = parse()
    names = tasks(args.suite)
    counts: dict[int, list[list[int] | None]] = {}
    for resolution in args.resolutions:
        env = MetaWorldEnv(camera_resolution=resolution, tasks_kept=1)
        try:
            counts[resolution] = []
            for task_id in range(len(names)):
                found = [goal_pixels(env, TaskSpec(args.suite, task_id, EVAL_SEED + k)) for k in range(args.placements)]
                counts[resolution].append(None if found[0] is None else [int(n or 0) for n in found])
        finally:
            env.close()
    print("| task | " + " | ".join(f"{r} px" for r in args.resolutions) + " |")
    print("|---|" + "---|" * len(args.resolutions))
    for task_id, name in enumerate(names):
        cells = [("-" if (c := counts[r][task_id]) is None else " / ".join(map(str, c))) for r in args.resolutions]
        print(f"| {name} | " + " | ".join(cells) + " |")
    for resolution in args.resolutions:
        seen = [n for c in counts[resolution] if c is not None for n in c]
        print(f"goal_pixels: resolution={resolution} median={statistics.median(seen):g} min={min(seen)}", flush=True)


if __name__ == "__main__":
    main()
