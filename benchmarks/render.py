"""Embedded MuJoCo task (suite "reach") steps/s with rendering, by process count: `python benchmarks/render.py`.

    MUJOCO_GL=egl python benchmarks/render.py [--procs 1 4 16] [--resolution 224 128] [--seconds 4]

Each process (spawned, one ReachEnv, no torch) steps one-action chunks, so every env step renders one camera image
(`ReachEnv.step` renders once per chunk), for `--seconds` after a warm-up, all processes at once. Prints per
configuration: the GL renderer string (which GPU or software rasteriser drew), env steps/s together and per process,
CPU seconds per step (a process's CPU time over its steps: what one core pays per step). With `MUJOCO_GL=egl` the
NVIDIA driver renders when its EGL vendor library is found; on a machine without one, Mesa's llvmpipe does (CPU).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import time

import numpy as np


def worker(resolution: int, seconds: float, barrier, results) -> None:  # noqa: ANN001 (multiprocessing proxies)
    from vla_scale.envs.reach import ACTION_DIM, SUITE, ReachEnv
    from vla_scale.envs.types import TaskSpec

    env = ReachEnv(camera_resolution=resolution, max_steps=10**9)
    env.reset(TaskSpec(SUITE, 0, 0))
    rng = np.random.default_rng(os.getpid())
    chunks = rng.uniform(-0.3, 0.3, (64, 1, ACTION_DIM))
    for i in range(20):
        if env.step(chunks[i % 64]).done:
            env.reset(TaskSpec(SUITE, i % 3, i % 50))
    try:
        from OpenGL import GL

        renderer = GL.glGetString(GL.GL_RENDERER).decode()
    except Exception as error:  # noqa: BLE001 (informational only)
        renderer = f"unknown ({type(error).__name__})"
    barrier.wait()
    steps, cpu0, start = 0, time.process_time(), time.perf_counter()
    while time.perf_counter() - start < seconds:
        done = env.step(chunks[steps % 64]).done
        steps += 1
        if done:  # success ends an episode (resets are counted in the time, not as steps)
            env.reset(TaskSpec(SUITE, steps % 3, steps % 50))
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    env.close()
    results.put((steps, wall, cpu, renderer))


def run(procs: int, resolution: int, seconds: float) -> dict:
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(procs), ctx.Queue()
    workers = [ctx.Process(target=worker, args=(resolution, seconds, barrier, results)) for _ in range(procs)]
    for w in workers:
        w.start()
    out = [results.get(timeout=300) for _ in workers]
    for w in workers:
        w.join()
    steps = sum(o[0] for o in out)
    wall = max(o[1] for o in out)
    return {"procs": procs, "resolution": resolution, "steps_per_s": steps / wall,
            "per_proc": steps / wall / procs, "cpu_s_per_step": sum(o[2] for o in out) / steps,
            "renderer": out[0][3]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, nargs="+", default=[1, 4, 16])
    p.add_argument("--resolution", type=int, nargs="+", default=[224, 128])
    p.add_argument("--seconds", type=float, default=4.0)
    args = p.parse_args()
    print(f"MUJOCO_GL={os.environ.get('MUJOCO_GL', '')} cores={os.cpu_count()}")
    print(f"{'res':>4} {'procs':>5} {'steps/s':>9} {'per proc':>9} {'CPU ms/step':>12}  renderer")
    for resolution in args.resolution:
        for procs in args.procs:
            r = run(procs, resolution, args.seconds)
            print(f"{resolution:>4} {procs:>5} {r['steps_per_s']:>9.0f} {r['per_proc']:>9.0f} "
                  f"{1e3 * r['cpu_s_per_step']:>12.2f}  {r['renderer']}", flush=True)


if __name__ == "__main__":
    main()
