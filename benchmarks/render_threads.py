"""Env steps/s of the fleet with and without Mesa's rasterizer threads in the simulator processes.

On a machine without a GPU the embedded task renders through EGL on Mesa's llvmpipe. By default llvmpipe starts one
rasterizer thread per CPU in every process and hands each frame to them; simulator processes render in their own
thread instead (`LP_NUM_THREADS=0`, set by `SimProcess` unless the caller sets it). This measures both the way
training runs them: nothing pinned, every process free to use every core, the fleet driven with one request per
pipeline stage in flight. "threads" sets LP_NUM_THREADS to the number of CPUs this process may use, which is what
llvmpipe picks by itself (up to its cap of 16). The two ways alternate over rounds, because the machine's own speed
drifts; the ratio is the median of the rounds' ratios. CPU seconds are the simulator processes' (all their threads)
per 1000 env steps.

    python benchmarks/render_threads.py [--sims 4 --episodes 256 --chunks 24 --rounds 4]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("MUJOCO_GL", "egl")

import numpy as np  # noqa: E402
from fleet_drive import step_still  # noqa: E402

from vla_scale.envs.types import TaskSpec  # noqa: E402
from vla_scale.parallel.fleet import SimFleet  # noqa: E402

CHUNK, ACTION_DIM, STAGES = 8, 7, 2


def cpu_seconds(pids: list[int]) -> float:
    """User + system time of every thread of these processes so far."""
    ticks = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:  # the process line sums its threads, the exited ones included
            fields = stat.read().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


def measure(args: argparse.Namespace, threads: str) -> tuple[float, float]:
    """(env steps/s, simulator CPU seconds per 1000 env steps) through a fleet whose children get LP_NUM_THREADS."""
    os.environ["LP_NUM_THREADS"] = threads  # the children inherit it
    env_kwargs = {"camera_resolution": args.resolution, "max_steps": 10**9, "max_delta": 0.0}  # never ends
    fleet = SimFleet("reach", env_kwargs, args.episodes, 1, args.sims, timeout_s=120, stages=STAGES)
    try:
        fleet.send_reset([TaskSpec("reach", i % 3, i % 50) for i in range(args.episodes)],
                         np.ones(args.episodes, dtype=bool))
        fleet.recv()
        cpu_start, start = cpu_seconds(fleet.pids()), time.perf_counter()
        steps = step_still(fleet, args.chunks, CHUNK, ACTION_DIM)
        wall, cpu = time.perf_counter() - start, cpu_seconds(fleet.pids()) - cpu_start
        return steps / wall, 1000 * cpu / steps
    finally:
        fleet.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sims", type=int, default=4, help="simulator processes (the default run's 2 workers x 2)")
    p.add_argument("--episodes", type=int, default=256)
    p.add_argument("--chunks", type=int, default=24, help="chunk steps per stage")
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--rounds", type=int, default=4)
    args = p.parse_args()
    cpus = str(min(len(os.sched_getaffinity(0)), 16))
    ways = {"threads": cpus, "own thread": "0"}
    rows: dict[str, list[tuple[float, float]]] = {name: [] for name in ways}
    for r in range(args.rounds):
        for name in ways if r % 2 == 0 else reversed(ways):
            rows[name].append(measure(args, ways[name]))
    print(f"\n{args.sims} simulator processes, {args.episodes} envs ({args.resolution} px), {STAGES} stages, "
          f"{len(os.sched_getaffinity(0))} CPUs, nothing pinned")
    print(f"{'way':<34} {'env steps/s per round':<40} {'CPU s per 1000 steps (median)':>30}")
    for name, value in ways.items():
        rates = " ".join(f"{rate:.0f}" for rate, _ in rows[name])
        print(f"{name + ' (LP_NUM_THREADS=' + value + ')':<34} {rates:<40} "
              f"{np.median([c for _, c in rows[name]]):>30.3f}")
    ratio = float(np.median([o[0] / t[0] for o, t in zip(rows["own thread"], rows["threads"], strict=True)]))
    print(f"render_threads: own_thread_over_threads={ratio:.2f}")


if __name__ == "__main__":
    main()
