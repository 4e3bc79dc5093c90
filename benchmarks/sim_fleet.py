"""Env steps per second of a simulator fleet, envs side by side:
`python benchmarks/sim_fleet.py --envs metaworld_mt10 pick_place --sims 4 --procs 2 --seconds 20`.

Each env config (`configs/env/<name>.yaml`, `--override`s after it) gets `--procs` simulator processes
(`SimProcess`, what a sim worker runs) holding `--sims` simulators in all, every simulator reset to the suite's tasks
in turn on TRAIN init states; then for `--seconds` all processes step chunks of `--chunk` uniformly random actions
at once (cameras rendered once per chunk: where the policy looks), an episode that ends is reset to the next task.
No policy runs: this is the simulators' own throughput, without Ray. On a machine with a GPU the simulators render
with EGL on it (`render_device.render_environment`), as the trainer's do. Prints one row per env: env
steps/s, chunks/s, resets, the resolution and the processes; the last line of each is
`sim_fleet: env=<name> sims=<n> procs=<p> resolution=<px> env_steps_per_s=<r>`.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("MUJOCO_GL", "egl")

from hydra import compose, initialize_config_dir  # noqa: E402

from vla_scale.config import Config, init_state_ids, register_configs, to_config  # noqa: E402
from vla_scale.envs.registry import simulator  # noqa: E402
from vla_scale.envs.types import ChunkStep, TaskSpec  # noqa: E402
from vla_scale.parallel.sim.process import SimProcess  # noqa: E402
from vla_scale.parallel.sim.render_device import render_environment  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"


def env_config(name: str, overrides: list[str]) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=[f"env={name}", *overrides]))


def measure(cfg: Config, sims: int, procs: int, chunk: int, seconds: float) -> dict[str, float]:
    """Env steps, chunks and resets per second of `sims` simulators of `cfg.env` in `procs` processes stepping random
    chunks."""
    if sims % procs:
        raise SystemExit(f"--sims {sims} must divide over --procs {procs}")
    e = cfg.env
    sim = simulator(e.name)
    ids = init_state_ids(e, "train")
    specs = (TaskSpec(e.suite, k % e.num_tasks, ids[(k // e.num_tasks) % len(ids)]) for k in range(10**9))
    slots = sims // procs
    environment = render_environment(0 if _gpu() else None)
    fleet = [SimProcess(e.name, slots, e.simulator_kwargs(), boot_timeout_s=600.0, environment=environment)
             for _ in range(procs)]
    rng = np.random.default_rng(0)
    everyone = np.ones(slots, bool)
    try:
        for proc in fleet:
            proc.send_reset([next(specs) for _ in range(slots)])
        for proc in fleet:
            proc.recv(600.0)
        steps = chunks = resets = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            for proc in fleet:
                proc.send_step(rng.uniform(-1, 1, (slots, chunk, sim.action_dim)), everyone)
            for proc in fleet:
                results = proc.recv(600.0)
                done = np.array([isinstance(r, ChunkStep) and r.done for r in results])
                steps += sum(r.steps_taken for r in results if isinstance(r, ChunkStep))
                chunks += slots
                if done.any():
                    proc.send_reset([next(specs) if d else None for d in done], done)
                    proc.recv(600.0)
                    resets += int(done.sum())
        elapsed = time.perf_counter() - t0
    finally:
        for proc in fleet:
            proc.close()
    return {"env_steps_per_s": steps / elapsed, "chunks_per_s": chunks / elapsed, "resets": resets,
            "seconds": elapsed}


def _gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["metaworld_mt10", "pick_place"])
    parser.add_argument("--sims", type=int, default=4)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--chunk", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--override", nargs="*", default=[], help="config overrides for every env, e.g. "
                        "env.camera_resolution=64")
    args = parser.parse_args()
    rows = []
    for name in args.envs:
        cfg = env_config(name, args.override)
        row = measure(cfg, args.sims, args.procs, args.chunk, args.seconds)
        rows.append((name, cfg.env.camera_resolution, row))
        print(f"sim_fleet: env={name} sims={args.sims} procs={args.procs} resolution={cfg.env.camera_resolution} "
              f"env_steps_per_s={row['env_steps_per_s']:.1f}", flush=True)
    print(f"\n{'env':<16} {'px':>4} {'sims':>4} {'procs':>5} {'env steps/s':>11} {'chunks/s':>8} {'resets':>6}"
          f"  (chunks of {args.chunk} random actions, {'GPU' if _gpu() else 'CPU'} rendering, "
          f"{args.seconds:.0f} s each)")
    for name, px, row in rows:
        print(f"{name:<16} {px:>4} {args.sims:>4} {args.procs:>5} {row['env_steps_per_s']:>11.1f} "
              f"{row['chunks_per_s']:>8.1f} {row['resets']:>6}")


if __name__ == "__main__":
    main()
