"""Seconds per LIBERO env step and memory per simulator process: `python benchmarks/libero_sim.py [--procs 2]`.

Starts `--procs` simulator processes (SimProcess, one LiberoEnv each, 128x128 agentview + wrist), resets each to a
task of `--suite`, then steps `--chunks` chunks of 8 random actions in all processes at once. Prints, per process
and together: scene build + first reset, a reset of the built scene, seconds per env step (chunk wall time / 8,
cameras rendered once per chunk), env steps per second, RSS and peak RSS (VmHWM) of the process, and whether torch
is mapped into it.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from vla_scale.envs.types import TaskSpec  # noqa: E402
from vla_scale.parallel.sim.process import SimProcess  # noqa: E402

CHUNK = 8


def status_mib(pid: int, key: str) -> float:
    line = next(ln for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ln.startswith(key))
    return int(line.split()[1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--suite", default="libero_spatial")
    parser.add_argument("--chunks", type=int, default=10)
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--texture-max-side", type=int, default=0, help="env.libero.texture_max_side (0: LIBERO's)")
    args = parser.parse_args()
    kwargs = {"camera_resolution": args.resolution, "settle_steps": 10, "texture_max_side": args.texture_max_side}
    procs = [SimProcess("libero", 1, kwargs) for _ in range(args.procs)]
    try:
        t0 = time.perf_counter()
        for k, proc in enumerate(procs):
            proc.send_reset([TaskSpec(args.suite, k % 10, k)])
        for proc in procs:
            proc.recv(600.0)
        build = time.perf_counter() - t0
        t0 = time.perf_counter()
        for k, proc in enumerate(procs):
            proc.send_reset([TaskSpec(args.suite, k % 10, k + 1)])
        for proc in procs:
            proc.recv(600.0)
        reset = time.perf_counter() - t0
        rng = np.random.default_rng(0)
        t0 = time.perf_counter()
        steps = 0
        for _ in range(args.chunks):
            for proc in procs:
                proc.send_step(rng.uniform(-1, 1, (1, CHUNK, 7)) * [0.3, 0.3, 0.3, 0.1, 0.1, 0.1, 1], np.ones(1, bool))
            for proc in procs:
                steps += proc.recv(600.0)[0].steps_taken
        wall = time.perf_counter() - t0
        print(f"{args.procs} simulator process(es), {args.suite}, {args.resolution}x{args.resolution} agentview+wrist, "
              f"textures <= {args.texture_max_side or 'original'} px, {os.cpu_count()} CPUs, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"scene build + first reset: {build:.1f}s   reset: {reset:.2f}s   (all processes at once)")
        print(f"seconds per env step, per process: {wall * args.procs / steps:.3f}   "
              f"env steps/s, all processes: {steps / wall:.1f}")
        print("| pid | RSS MiB | peak RSS MiB | torch mapped |\n|---|---|---|---|")
        for proc in procs:
            torch_mapped = "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text()
            print(f"| {proc.pid} | {status_mib(proc.pid, 'VmRSS'):.0f} | {status_mib(proc.pid, 'VmHWM'):.0f} | "
                  f"{torch_mapped} |")
    finally:
        for proc in procs:
            proc.close()


if __name__ == "__main__":
    main()
