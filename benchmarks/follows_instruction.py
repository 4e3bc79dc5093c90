"""Does a pick_place policy go for the cube its instruction names? `python benchmarks/follows_instruction.py RUN`.

On `--layouts` layouts of each task, the task's first observation is given with both cube colours in the
instruction (the task's bowl kept), and the policy's first chunk (greedy) is counted as following the instruction
when its summed xy motion points more nearly towards the named cube than towards the other (cosine of that motion to
each cube, from the gripper). Chance is half the chunks; the scripted demonstrator (`--demonstrator`, no RUN) scores
them all. It separates a policy that reads the cube's word from one that goes for a cube the layout suggests, which
the success rate alone does not (docs/performance.md, "Where the cube's word is needed").

Prints `follows_instruction: policy=<RUN or demonstrator> first_state=<i> start_spread=<m> towards_named_cube=<n>/<N>`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402

from vla_scale.envs.pick_place import CUBES, START_SPREAD, PickPlaceEnv, task_objects  # noqa: E402
from vla_scale.envs.pick_place_demo import Demonstrator  # noqa: E402
from vla_scale.envs.types import Observation, TaskSpec  # noqa: E402


def towards_named(move: np.ndarray, gripper: np.ndarray, named: np.ndarray, other: np.ndarray) -> bool:
    """Whether the xy `move` from `gripper` points more nearly at `named` than at `other` (cosines compared)."""
    def cosine(target: np.ndarray) -> float:
        to = target - gripper
        return float(move @ to) / (float(np.linalg.norm(move) * np.linalg.norm(to)) + 1e-12)

    return cosine(named) > cosine(other)


def demonstrator_chunks(env: PickPlaceEnv, task: TaskSpec, chunk_len: int) -> np.ndarray:
    """The scripted demonstrator's first `chunk_len` actions [2 cubes, chunk_len, 7], one cube named at a time, each
    played from the reset layout (the demonstrator acts on the scene, so the env steps through them)."""
    chunks = []
    for cube in CUBES:
        env.reset(task)
        actions = []
        for _ in range(chunk_len):
            action = Demonstrator().act(replace(env.scene(), cube=cube))
            actions.append(action)
            env.step(action[None])
        chunks.append(actions)
    return np.array(chunks)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", nargs="?", default="", help="a checkpoint folder or run directory (model.checkpoint=)")
    p.add_argument("--demonstrator", action="store_true", help="score the scripted demonstrator instead")
    p.add_argument("--layouts", type=int, default=20, help="layouts (init states) per task")
    p.add_argument("--first-state", type=int, default=0, help="first init state: 0 for TRAIN, 80 for EVAL")
    p.add_argument("--start-spread", type=float, default=START_SPREAD, help="env.pick_place.start_spread (m)")
    p.add_argument("--chunk", type=int, default=4, help="the demonstrator's chunk length")
    args = p.parse_args()
    if bool(args.run) == args.demonstrator:
        p.error("name a RUN or give --demonstrator, not both")
    vla = None
    if args.run:
        from vla_scale.models.checkpoint_folders import step_folder
        from vla_scale.models.oft import PretrainedVLA

        vla = PretrainedVLA.from_pretrained(step_folder(args.run), env="pick_place")
    size = vla.spec.towers[0].image_size if vla is not None else 64
    env = PickPlaceEnv(camera_resolution=size, max_steps=1000, start_spread=args.start_spread)
    right = total = 0
    for task_id in range(PickPlaceEnv.NUM_TASKS):
        _, bowl = task_objects(task_id)
        for state in range(args.first_state, args.first_state + args.layouts):
            task = TaskSpec("pick_place", task_id, state)
            obs = env.reset(task)
            scene = env.scene()
            if vla is not None:
                asked = [Observation(obs.images, obs.proprio, f"put the {c} cube in the {bowl} bowl") for c in CUBES]
                chunks = vla.predict(asked).env_actions
            else:
                chunks = demonstrator_chunks(env, task, args.chunk)
            gripper = np.array(scene.gripper[:2])
            for cube, chunk in zip(CUBES, chunks, strict=True):
                other = next(c for c in CUBES if c != cube)
                right += towards_named(chunk[:, :2].sum(axis=0), gripper, np.array(scene.cubes[cube][:2]),
                                       np.array(scene.cubes[other][:2]))
                total += 1
    env.close()
    print(f"follows_instruction: policy={args.run or 'demonstrator'} first_state={args.first_state} "
          f"start_spread={args.start_spread} towards_named_cube={right}/{total}", flush=True)


if __name__ == "__main__":
    main()
