"""Evaluate a policy on a suite's held-out init states: `python launch/eval.py [model.checkpoint=PATH] [overrides]`.

Every task of the suite (ids 0..env.num_tasks-1) is played once from each EVAL init state (40-49 by default;
`env.eval_protocol=published`: LIBERO's 0-49 in the official scenes with the suite's step limit, as its published
success rates are measured, or Meta-World's placements 1000-1009 of LeRobot's evaluation), with greedy decoding, in
parallel over the simulator fleet (parallel.num_workers x parallel.sims_per_worker processes, one simulator each).
Writes to the run directory `eval_<suite>.csv` and `eval_<suite>.md` (success per task and the total; Meta-World's
difficulty groups and their macro average too), `videos/` (the first env.eval_videos_per_task episodes of every task
as MP4, default 1) and `tb/` (success rates and the videos). The last line printed is `eval: suite=<name>
[obs=<observation>] episodes=<n> success_rate=<r> stderr=<binomial standard error>` (Meta-World: `obs=` names what
the policy read beside the image, `env.metaworld.observation`, then the groups' `macro_success_rate=`). A held-out
evaluation wide enough to hold the published placements (Meta-World with `env.num_eval_init_states=50`: 500
episodes on 1000..1049, none of them TRAIN's) prints the published figure read off the same episodes beside its own,
and ends with `published_episodes=<n> published_success_rate=<r>`. With `record.path=DIR` the episodes played
(`record.episodes=all` or `successes`) are also written to DIR as a LeRobot dataset, every env step of them, for
launch/sft.py.

model.checkpoint= the policy to evaluate: a run directory of launch/train.py (its latest checkpoint), one of its
`checkpoints/step_<k>` folders, an OpenVLA-OFT folder, a π0 / π0.5 folder (openpi's or LeRobot's layout; decoded
noise-free: `models/flow/rollout.py`) or a hub id (README). Without it a freshly initialised policy is
evaluated: a smoke run of the whole path. Example:

    python launch/eval.py env=libero_spatial model.checkpoint=runs/my_run
"""

from __future__ import annotations

import csv
import logging
import math
import os
import sys
import time
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

os.environ.setdefault("MUJOCO_GL", "egl")  # before mujoco's import: record.path replays episodes here, headless
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

import torch  # noqa: E402

from vla_scale.config import (  # noqa: E402
    Config,
    ConfigError,
    EnvConfig,
    explicit_keys,
    init_state_ids,
    moved_key_error,
    record_problems,
    register_configs,
    to_config,
    validate,
)
from vla_scale.launcher import copy_console_to, hydra_argv, run_log_path  # noqa: E402

register_configs()
if moved := moved_key_error(sys.argv[1:]):
    sys.exit(moved)
sys.argv = hydra_argv(sys.argv)  # run_dir=X is Hydra's directory too: its record goes there, not to runs/<time>


def success_table(suite: str, instructions: list[str], results: dict[int, list[bool]]) -> list[list[str]]:
    """Rows [task, instruction, episodes, successes, success rate], then the total."""
    rows = [[str(t), instructions[t], str(len(r)), str(sum(r)), f"{sum(r) / len(r):.3f}"] for t, r in results.items()]
    every = [s for r in results.values() for s in r]
    rows.append(["total", suite, str(len(every)), str(sum(every)), f"{sum(every) / max(len(every), 1):.3f}"])
    return rows


def group_table(groups: dict[str, list[int]], task_rows: list[list[str]]) -> list[list[str]]:
    """Rows [group, tasks, episodes, successes, success rate (the mean of its tasks' rates)], then the macro
    average over the groups (Meta-World's difficulty groups, as LeRobot's and SmolVLA's evaluations report them)."""
    rows = []
    for name, ids in groups.items():
        mine = [task_rows[t] for t in ids]
        rate = sum(float(r[4]) for r in mine) / len(mine)
        rows.append([name, str(len(ids)), str(sum(int(r[2]) for r in mine)), str(sum(int(r[3]) for r in mine)),
                     f"{rate:.3f}"])
    macro = sum(float(r[4]) for r in rows) / len(rows)
    total = [sum(int(r[i]) for r in rows) for i in (1, 2, 3)]
    return [*rows, ["macro", *map(str, total), f"{macro:.3f}"]]


def protocol_line(env: EnvConfig) -> str:
    """Which episodes ran and what the policy observed, for the `policy:` line and the tables' header."""
    ids = init_state_ids(env, "eval")
    states = f"init states {ids[0]}-{ids[-1]}" if ids else "no init states"
    if env.eval_protocol == "published":
        what = f"published: {env.name}'s published protocol"
    elif env.train_on_eval_states:
        what = "held_out with env.train_on_eval_states=true: the EVAL init states, which training also plays"
    else:
        what = "held_out: the EVAL init states, disjoint from training's"
    scenes = f", {env.libero.scenes} scenes" if env.name == "libero" else ""
    limit = f"step limit {env.max_steps}" if env.max_steps else "each task its own suite's step limit"
    observed = observation(env)
    seen = f"; observation {observed}" if observed else ""
    return f"protocol {what}; {len(ids)} episodes per task on {states}{scenes}, {limit}{seen}"


def observation(env: EnvConfig) -> str:
    """The name of what the policy reads beside its images, where the simulator offers a choice ('' elsewhere)."""
    from vla_scale.envs.registry import simulator

    return simulator(env.name).observation_name(env.simulator_kwargs())


def published_subset(env: EnvConfig) -> list[int]:
    """The simulator's published init states when a held-out evaluation plays them among more (Meta-World's
    LeRobot seeds 1000..1009 within `env.num_eval_init_states=50`'s 1000..1049): the published figure is then
    read off the same episodes and printed beside the wider one. Empty otherwise."""
    from vla_scale.envs.registry import simulator

    played = init_state_ids(env, "eval")
    published = list(simulator(env.name).published_init_states)
    if env.eval_protocol != "held_out" or len(played) <= len(published) or not set(published) <= set(played):
        return []
    return published


def rate_and_error(outcomes: list[bool]) -> tuple[float, float]:
    """The success rate and its binomial standard error, sqrt(p (1 - p) / n)."""
    n = max(len(outcomes), 1)
    rate = sum(outcomes) / n
    return rate, math.sqrt(rate * (1 - rate) / n)


TASK_HEADER = ["task", "instruction", "episodes", "successes", "success_rate"]
GROUP_HEADER = ["group", "tasks", "episodes", "successes", "success_rate"]


def write_tables(run_dir: str, suite: str, rows: list[list[str]], protocol: str = "",
                 groups: list[list[str]] | None = None) -> tuple[str, str]:
    """eval_<suite>.csv (and eval_<suite>_groups.csv with `groups`) and eval_<suite>.md with both tables."""
    csv_path, md_path = os.path.join(run_dir, f"eval_{suite}.csv"), os.path.join(run_dir, f"eval_{suite}.md")
    with open(csv_path, "w", newline="") as f:
        csv.writer(f).writerows([TASK_HEADER, *rows])
    text = f"# {suite}\n\n" + (f"{protocol}\n\n" if protocol else "") + _markdown(TASK_HEADER, rows, "total")
    if groups:
        with open(os.path.join(run_dir, f"eval_{suite}_groups.csv"), "w", newline="") as f:
            csv.writer(f).writerows([GROUP_HEADER, *groups])
        text += "\n" + _markdown(GROUP_HEADER, groups, "macro")
    with open(md_path, "w") as f:
        f.write(text)
    return csv_path, md_path


def _markdown(header: list[str], rows: list[list[str]], bold: str) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(f"**{c}**" if row[0] == bold else c for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def evaluate(cfg: Config, run_dir: str, explicit: frozenset[str] = frozenset()) -> float:
    from vla_scale.run_setup import checked_policy, make_deterministic, resolved_config

    # the Ray address and the policy against the env before anything starts and before the rollout stack's imports
    vla = checked_policy(cfg, explicit, training=False)
    if cfg.record.path and (problems := vla.recording_problems()):
        raise ConfigError("cannot record:\n  - " + "\n  - ".join(problems))
    from vla_scale.envs.registry import simulator
    from vla_scale.rollout.engine import RolloutEngine
    from vla_scale.rollout.env_loop import EnvLoop, success_metrics
    from vla_scale.rollout.sampler import eval_specs
    from vla_scale.rollout.stack import max_chunks, play_eval, start_fleet, start_ray_for
    from vla_scale.run_log import RunLogger, progress

    cfg = resolved_config(cfg, vla)
    e = cfg.env
    sim = simulator(e.name)
    instructions = sim.instructions(e.suite)
    if sim.task_names is not None:  # tasks some instructions do not tell apart (Meta-World's push and push-back)
        instructions = [f"{name}: {text}" for name, text in zip(sim.task_names(e.suite), instructions, strict=True)]
    if cfg.deterministic:  # the same table twice: one intra-op thread (sums in one order), as training has it
        make_deterministic()
    torch.manual_seed(cfg.seed)
    policy = vla.policy
    source = f"{vla.source} (smoke run)" if not cfg.model.checkpoint else vla.source
    # the family's decode where the engine's own does not apply (π0: noise-free sample_actions from seeded noise)
    engine = RolloutEngine(policy, "cuda" if torch.cuda.is_available() else "cpu", seed=cfg.seed,
                           decoder=vla.chunk_decoder())
    specs = eval_specs(e)
    log = RunLogger(run_dir)
    protocol = protocol_line(e)
    print(f"evaluating {source} on {e.suite}: {len(specs)} episodes, run directory {run_dir}\n"
          f"policy: {vla.describe(e)}; {protocol}", flush=True)
    start_ray_for(cfg.parallel)
    stages = cfg.rollout.pipeline_stage_num
    p = cfg.parallel
    fleet = start_fleet(e, p, vla, p.num_workers * p.sims_per_worker * stages, stages)  # one simulator per slot
    loop = EnvLoop(fleet, engine, vla, max_chunks(e, cfg.model.chunk_len))
    bar = progress(len(specs), 0, cfg.progress, f"eval {e.suite}")
    t0 = time.perf_counter()
    try:
        trajs = play_eval(loop, specs, cfg.algo.temperature, "eval.", bar)
    finally:
        bar.close()
        fleet.close()
    results: dict[int, list[bool]] = {task: [] for task in range(e.num_tasks)}
    for traj in trajs:
        results[traj.task.task_id].append(traj.success)
    rows = success_table(e.suite, instructions, results)
    sim_groups = sim.groups(e.suite, e.num_tasks)
    groups = group_table(sim_groups, rows) if sim_groups else None
    csv_path, md_path = write_tables(run_dir, e.suite, rows, protocol, groups)
    rate = float(rows[-1][-1])
    log.scalars(success_metrics([(t.task, t.success) for t in trajs], e.num_tasks, sim_groups), 0)
    videos = log.episode_videos(trajs, e.eval_videos_per_task or 1, 0, os.path.join(run_dir, "videos"))
    log.close()
    width = max(len(row[1]) for row in rows)
    print(f"\n{protocol}\n{'task':>5}  {'instruction':<{width}}  episodes  success_rate")
    for task, instruction, episodes, _, task_rate in rows:
        print(f"{task:>5}  {instruction:<{width}}  {episodes:>8}  {task_rate:>12}")
    if groups:
        print(f"\n{'group':<10}  tasks  episodes  success_rate")
        for name, tasks, episodes, _, group_rate in groups:
            print(f"{name:<10}  {tasks:>5}  {episodes:>8}  {group_rate:>12}")
    print(f"\ntables: {csv_path} {md_path}\nvideos: {len(videos)} in {os.path.join(run_dir, 'videos')}"
          f"\ntime:   {time.perf_counter() - t0:.1f}s")
    if cfg.record.path:  # every step of the episodes played, replayed in a simulator here (rollout/recording.py)
        from vla_scale.rollout.recording import record_played

        recorded = record_played(vla, e, trajs, cfg.record)
        print(f"record: {recorded} episodes ({cfg.record.episodes}) -> {cfg.record.path}")
    macro = f" macro_success_rate={groups[-1][-1]}" if groups else ""
    observed = observation(e)
    obs = f" obs={observed}" if observed else ""
    _, error = rate_and_error([t.success for t in trajs])
    published = ""
    if subset := published_subset(e):
        shown = [t.success for t in trajs if t.task.init_state_id in set(subset)]
        p_rate, p_error = rate_and_error(shown)
        print(f"published protocol (init states {subset[0]}-{subset[-1]}, the same episodes): {len(shown)} episodes, "
              f"success_rate={p_rate:.3f} (standard error {p_error:.3f}); all {len(specs)}: {rate:.3f} "
              f"(standard error {error:.3f})")
        published = f" published_episodes={len(shown)} published_success_rate={p_rate:.3f}"
    print(f"eval: suite={e.suite}{obs} episodes={len(specs)} success_rate={rate:.3f} stderr={error:.3f}{macro}"
          f"{published}", flush=True)
    return rate


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg = to_config(dict_cfg)
    scenes_given = any(arg.startswith(("env.libero.scenes=", "++env.libero.scenes=")) for arg in sys.argv[1:])
    if not scenes_given:
        cfg.env.libero.scenes = "official"  # the scenes published success rates were measured on
    if cfg.env.eval_protocol == "published" and cfg.env.libero.scenes != "official":
        sys.exit(f"error: env.eval_protocol=published plays the official scenes; drop env.libero.scenes="
                 f"{cfg.env.libero.scenes}")
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    try:
        validate(cfg)
        if problems := record_problems(cfg.record):
            raise ConfigError(problems[0])
        os.makedirs(run_dir, exist_ok=True)
        copy_console_to(run_log_path(run_dir))  # eval.log holds what the console shows
        return evaluate(cfg, run_dir, explicit_keys(HydraConfig.get().overrides.task))
    except ConfigError as err:
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
