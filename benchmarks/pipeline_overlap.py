"""Does pipelining hide simulation behind decoding? The same rollout with S = 1, 2 and 4 stages, side by side.

Real parts only: the OFT-shaped policy decodes on one core (torch with one thread, pinned to core 0); the embedded
MuJoCo task steps and renders in simulator processes pinned to core 1 (every thread of them, the renderer's too).
The sim worker runs in this process by default (`--placement trainer`, the direct path: a stage hand-over is a pipe
write and read, its receiving thread may run on either core) or as a Ray actor (`--placement actor`, placed by
`--worker-core`). The end-effector speed is set to zero so that no episode ends early and every S plays exactly
the same workload (N episodes x max_steps env steps, one render per chunk). Cameras render at the policy's input
size (no resize), as the default run does. Policy size, episodes and simulator count are options so decode and
simulation cost can be balanced: the defaults give sim busy / decode busy close to 1 on the 2-core machine (the
table prints both), and enough episodes per stage that a stage's work is long against the hand-over between the
two sides.

Columns: wall time, speedup over S=1, wall / max(sim busy, decode busy) (1.00 = perfect overlap), and the busy
seconds of each side. (What the fleet adds to a simulator process against a plain stepping loop was measured once;
the answer is in docs/performance.md.)

    python benchmarks/pipeline_overlap.py [--placement trainer|actor --episodes 256 --hidden 48 --layers 1 ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

import psutil  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402

from vla_scale.config import ModelConfig  # noqa: E402
from vla_scale.envs.reach import instructions  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402
from vla_scale.models.oft import PretrainedVLA  # noqa: E402
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.parallel.sim.cluster import start_ray  # noqa: E402
from vla_scale.parallel.sim.fleet import LocalWorkers, SimFleet  # noqa: E402
from vla_scale.rollout.engine import RolloutEngine  # noqa: E402
from vla_scale.rollout.env_loop import EnvLoop  # noqa: E402
from vla_scale.run_policy import fresh_vla  # noqa: E402

DECODE_CORE, SIM_CORE = 0, 1
EVERY_CORE = os.sched_getaffinity(0)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--episodes", type=int, default=256, help="episodes per rollout (all stages together)")
    p.add_argument("--sims", type=int, default=2, help="simulator processes (one sim worker)")
    p.add_argument("--placement", choices=["trainer", "actor"], default="trainer",
                   help="sim worker inside this process (the direct path) or as a Ray actor")
    p.add_argument("--max-steps", type=int, default=96, help="env steps per episode")
    p.add_argument("--chunk", type=int, default=8, help="actions per chunk")
    p.add_argument("--resolution", type=int, default=64, help="camera side = policy input side, in pixels")
    p.add_argument("--hidden", type=int, default=48, help="Llama width of the policy")
    p.add_argument("--layers", type=int, default=1, help="Llama layers of the policy")
    p.add_argument("--vision-dim", type=int, default=32, help="width of the policy's vision tower")
    p.add_argument("--worker-core", choices=["sim", "decode", "any"], default="any",
                   help="--placement actor: core of the sim worker's process (any: unpinned, like the rest of Ray)")
    p.add_argument("--repeats", type=int, default=2, help="timed rollouts per S (best kept)")
    return p.parse_args()


def pin(pids: list[int], cores: set[int]) -> None:
    if (os.cpu_count() or 1) >= 2:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):  # a thread or process that ended meanwhile
                os.sched_setaffinity(pid, cores)


def threads(pid: int) -> list[int]:
    """Thread ids of a process (affinity is per thread; a new thread inherits its creator's)."""
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        return []


def pin_fleet(fleet: SimFleet, worker_core: str) -> None:
    """Every thread of the simulator processes on the sim core; the sim worker where `--worker-core` says.

    A worker in this process has no process of its own: it sends from the decoding thread and receives on a thread
    that the decoding thread started, inherited core 0 from it and is let run on either core here (call this once
    the fleet has answered, so that the simulators' renderer threads and the receiving threads exist)."""
    pin([tid for pid in fleet.pids() for tid in threads(pid)], {SIM_CORE})
    if isinstance(fleet.workers, LocalWorkers):
        pin([tid for tid in threads(os.getpid()) if tid != os.getpid()], EVERY_CORE)  # all but the decoding thread
    elif worker_core != "any":
        actors = {psutil.Process(pid).ppid() for pid in fleet.pids()}  # the simulators' parents
        pin(sorted(actors), {SIM_CORE if worker_core == "sim" else DECODE_CORE})


def env_kwargs(args: argparse.Namespace, endless: bool = False) -> dict:
    """The end-effector never moves (max_delta 0), so episodes end only at max_steps (never, when `endless`)."""
    max_steps = 10**9 if endless else args.max_steps
    return {"camera_resolution": args.resolution, "max_steps": max_steps, "max_delta": 0.0}


def tasks(n: int) -> list[TaskSpec]:
    return [TaskSpec("reach", i % 3, i % 50) for i in range(n)]


def rollout_row(args: argparse.Namespace, stages: int, engine: RolloutEngine, vla: PretrainedVLA) -> dict:
    fleet = SimFleet("reach", env_kwargs(args), args.episodes, 1, args.sims, timeout_s=120, stages=stages,
                     in_process=args.placement == "trainer")
    try:
        loop = EnvLoop(fleet, engine, vla, max_chunks=-(-args.max_steps // args.chunk))
        specs, uids = tasks(args.episodes), [str(i) for i in range(args.episodes)]
        loop.run(specs, uids, 1.0, greedy=True)  # warm-up: renderers, allocator, receiving threads
        pin_fleet(fleet, args.worker_core)
        best = None
        for _ in range(args.repeats):
            loop.stats = type(loop.stats)()
            loop.run(specs, uids, 1.0, greedy=True)
            if best is None or loop.stats.wall_s < best.wall_s:
                best = loop.stats
        assert best is not None and best.env_steps == args.episodes * args.max_steps
        return {"S": stages, "wall": best.wall_s, "sim": best.sim_busy_s, "decode": best.decode_s,
                "steps": best.env_steps}
    finally:
        fleet.close()


def main() -> None:
    args = parse()
    torch.set_num_threads(1)
    torch.set_num_interop_threads(1)
    start_ray(num_cpus=2)
    pin([os.getpid()], {DECODE_CORE})  # the decoding thread only: Ray's threads, started above, stay unpinned
    cfg = ModelConfig(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_layers=args.layers,
                      num_heads=2, chunk_len=args.chunk, image_size=args.resolution, patch_size=16,
                      vision_dim=args.vision_dim)
    vla = fresh_vla(cfg, instructions())
    torch.manual_seed(0)
    engine = RolloutEngine(vla.policy, decoder=OFTDecoder())
    rows = [rollout_row(args, s, engine, vla) for s in (1, 2, 4)]
    base = rows[0]["wall"]
    print(f"\nworkload: {args.episodes} episodes x {args.max_steps} env steps, chunk {args.chunk}, "
          f"{args.sims} simulator processes on core {SIM_CORE}, decode on core {DECODE_CORE} "
          f"(Llama {args.layers}x{args.hidden}, vision {args.vision_dim}, {args.resolution} px), sim worker "
          + ("in this process" if args.placement == "trainer" else f"a Ray actor on {args.worker_core} core"))
    print(f"{'S':>3} {'wall s':>8} {'speedup':>8} {'wall/max':>9} {'sim busy s':>11} {'decode busy s':>14}")
    for r in rows:
        r["speedup"] = base / r["wall"]
        r["over_max"] = r["wall"] / max(r["sim"], r["decode"])
        print(f"{r['S']:>3} {r['wall']:>8.2f} {r['speedup']:>8.2f} {r['over_max']:>9.2f} {r['sim']:>11.2f} "
              f"{r['decode']:>14.2f}")
    ray.shutdown()
    s2 = rows[1]
    print(f"pipeline: s2_speedup={s2['speedup']:.2f} s2_wall_over_max={s2['over_max']:.2f}")


if __name__ == "__main__":
    main()
