"""From demonstrations to a better policy, as a new user runs it, for several seeds: on the embedded pick_place task
or on Meta-World's MT10 (`--env`), with the tiny OFT policy, the tiny π0 or the tiny SmolVLA (`--family`), GRPO or
PPO (`--algo`).

    python benchmarks/sft_rl.py --seeds 0 1 2                                  # pick_place, OFT, PPO
    python benchmarks/sft_rl.py --env metaworld_mt10 --family pi0 --algo grpo --seeds 0
    python benchmarks/sft_rl.py --dry-run                                      # the pipeline at toy sizes

Per seed, the commands run one after another, each as the README gives it (their own processes, their own last
lines parsed): scripted demonstrations on the TRAIN init states (launch/demonstrate.py; pick_place's scripted
demonstrator with the gripper starting anywhere over the table, Meta-World's experts) -> supervised fine-tuning
(launch/sft.py; on pick_place in two stages, the first on the first steps of each demonstration, where the
instruction's cube decides the moves, the second on whole demonstrations from the first's checkpoint) ->
evaluation of the SFT policy on the held-out EVAL init states (launch/eval.py; MT10: 50 a task, 500 episodes, none
of them TRAIN's, the published 10 a task read off the same episodes) -> RL from the SFT checkpoint (launch/train.py,
no evaluation of its own) -> evaluation of the RL policy. On Meta-World `--obs` chooses what the policy reads beside
the image (`env.metaworld.observation`: agent, LeRobot's 4-D state; agent_goal, with the goal's xyz; full, the
39-D observation). Every command runs with `deterministic=true`, so a seed's figures repeat bit for bit on the same
machine. Everything a run writes stays in `--out/seed_<s>/`, with each phase's minutes in `minutes.json`;
`--sft-from <earlier out>` reuses an earlier run's demonstrations and SFT policies (another RL from the same start),
counting their minutes as measured. Prints one row per seed, a row per task (SFT -> RL, each seed) where the env
has several, and per seed the line
`sft_rl: env=<env> [obs=<observation>] family=<oft|pi0|smolvla> algo=<grpo|ppo> seed=<s> sft=<x.xx> rl=<y.yy>
episodes=<n> minutes=<m>` (obs on Meta-World; episodes: each evaluation's; minutes: the wall time of the
demonstrations, SFT and RL commands, the evaluations not counted; the line's figures are cut, never rounded up,
the table's have three decimals).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PICK_PLACE_POLICIES = {
    "oft": ["model=tiny_pick_place", "model.attention=bidirectional", "model.use_film=true"],
    "pi0": ["model=pi0_tiny", f"model.pi0.tokenizer={ROOT / 'tests/fixtures/openpi_reference/tokenizer.model'}",
            "model.pi0.max_token_len=24", "model.pi0.image_size=32", "model.pi0.patch_size=8"],
    "smolvla": ["model=smolvla_tiny"],
}
"""pick_place's policy of each family (`--family`). OFT: the tiny policy with every position attending to every
other and the vision FiLMed by the prompt, the two letting the image patches read the instruction
(docs/performance.md, "Where the cube's word is needed"). π0: the tiny π0 (two 2-layer Gemmas) with 16 patches of
8 px per 32 px image, the parity fixture's SentencePiece model and room for pick_place's prompts. SmolVLA: the tiny
SmolVLA (4 VLM layers 32 wide, a 24-wide expert, 32 px images) with the parity fixture's tokenizer."""
METAWORLD_POLICIES = {
    "oft": ["model=tiny_metaworld", "model.attention=bidirectional", "model.use_film=true"],
    "pi0": ["model=pi0_tiny", f"model.pi0.tokenizer={ROOT / 'tests/fixtures/openpi_reference/tokenizer.model'}",
            "model.pi0.max_token_len=32", "model.pi0.image_size=32", "model.pi0.patch_size=8",
            "model.pi0.action_horizon=8"],
    "smolvla": ["model=smolvla_tiny", "model.smolvla.chunk_size=8"],
}
"""Meta-World's: the same three, on its one 64 px corner2 camera, 4-D actions and state, chunks of 8; π0's and
SmolVLA's prompt budgets hold MT10's instructions."""
RL = {"ppo": ["algo=ppo", "algo.mini_batches=4", "algo.micro_batches=1", "algo.lr=1e-4", "algo.temperature=1.0",
              "algo.critic.warmup_steps=5"],
      "grpo": ["algo=grpo", "algo.mini_batches=4", "algo.micro_batches=1", "algo.lr=1e-4", "algo.temperature=1.0"]}
"""RL from the SFT policy (`--algo`): PPO with a critic (configs/algo/ppo.yaml: 64 episodes a step, chunk-level GAE,
the step limit ends a failure; the value head trained alone for its first 5 steps), the recipe; or GRPO
(configs/algo/grpo.yaml, SimpleVLA-RL's recipe). Both at lr 1e-4 and temperature 1.0 (docs/performance.md: the tiny
policy falls back at grpo.yaml's 3e-4 and 1.6 on pick_place; a recipe may set its own, as MT10's OFT at 3e-4),
four optimizer steps per RL step. `--rl-args` adds overrides."""


@dataclass(frozen=True)
class Recipe:
    """One env's pipeline: what every command of a seed gets (`task`), the demonstrations' own overrides, the
    policies, the sizes, and RL's extra overrides."""

    task: list[str]
    demo: list[str]
    policies: dict[str, list[str]]
    demos: int
    first_steps: int
    sft_steps: int
    sft_lr: float
    rl_steps: int
    eval_states: int = 0
    """Held-out init states per task of the evaluations (env.num_eval_init_states; 0: the env config's)."""
    algo_rl: dict[str, list[str]] = field(default_factory=dict)
    family_rl: dict[str, list[str]] = field(default_factory=dict)
    rl_env: list[str] = field(default_factory=list)
    """The RL run's own env overrides (left out of a dry run, whose env is the toy one)."""
    dry_run: list[str] = field(default_factory=list)


RECIPES = {
    "pick_place": Recipe(
        task=["env=pick_place"], demo=["env.pick_place.start_spread=0.15", "demo.noise=0.0"],
        policies=PICK_PLACE_POLICIES, demos=320, first_steps=8, sft_steps=1000, sft_lr=1e-3, rl_steps=200,
        dry_run=["env.num_eval_init_states=1", "env.max_steps=8"]),
    "metaworld_mt10": Recipe(
        task=["env=metaworld_mt10", "env.camera_resolution=64"], demo=[],
        policies=METAWORLD_POLICIES, demos=200, first_steps=0, sft_steps=2000, sft_lr=1e-3, rl_steps=30,
        eval_states=50,
        algo_rl={"grpo": ["algo.batch_size=10"], "ppo": ["algo.batch_size=80"]},
        family_rl={"oft": ["algo.lr=3e-4"], "pi0": ["model.pi0.rl_noise=flow_noise"],
                   "smolvla": ["model.smolvla.rl_noise=flow_noise"]},
        rl_env=["env.max_steps=200"],
        dry_run=["env.num_tasks=2", "env.num_eval_init_states=1", "env.max_steps=60", "env.camera_resolution=32"]),
}
"""The recipes docs/performance.md's tables were measured with. pick_place: one noise-free demonstration per task
and TRAIN init state (4 x 80), the gripper starting within 0.15 m of the table's centre; 1000 SFT steps of 64
examples on the first 8 steps of each demonstration, then 1000 on whole demonstrations; 200 RL steps. MT10: 20
noise-free expert demonstrations a task (docs/performance.md says why so few), 2000 SFT steps on whole
demonstrations, 30 RL steps of 80 episodes cut at 200 steps (a failure costs 200 env steps, not 500; GRPO: 10
groups of 8, each of the ten tasks once a group; PPO: 80 episodes of groups of one, each task 8 times), OFT at lr
3e-4, π0 and SmolVLA with Flow-Noise (the levers that moved each most on seed 0 under `agent`: docs/performance.md),
and every evaluation on 50 held-out placements a task (500 episodes)."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", choices=sorted(RECIPES), default="pick_place",
                   help="the benchmark, with its recipe (RECIPES): the sizes below default to it")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--obs", choices=["agent", "agent_goal", "full"], default="",
                   help="Meta-World's env.metaworld.observation (what the policy reads beside the image; default: "
                        "the env config's, agent)")
    p.add_argument("--eval-states", type=int,
                   help="held-out init states per task of each evaluation (MT10's recipe: 50, 500 episodes, the "
                        "published 10 read off the same episodes)")
    p.add_argument("--demos", type=int, help="scripted demonstrations recorded, spread evenly over the tasks")
    p.add_argument("--noise", type=float, default=0.0, help="the demonstrator's xyz noise")
    p.add_argument("--start-spread", type=float, default=0.15,
                   help="env.pick_place.start_spread of pick_place's demonstrations (m)")
    p.add_argument("--first-steps", type=int,
                   help="sft.first_steps of a first SFT stage (0: one stage on whole demonstrations)")
    p.add_argument("--sft-steps", type=int, help="supervised optimizer steps (of each stage)")
    p.add_argument("--sft-lr", type=float, help="supervised learning rate")
    p.add_argument("--sft-args", nargs="*", default=[], help="more launch/sft.py overrides of every SFT stage")
    p.add_argument("--rl-steps", type=int, help="RL steps from the SFT policy (0: stop after the SFT policy's eval)")
    p.add_argument("--family", choices=["oft", "pi0", "smolvla"], default="oft", help="the policy family")
    p.add_argument("--algo", choices=sorted(RL), default="ppo", help="the RL algorithm")
    p.add_argument("--rl-args", nargs="*", default=[], help="more launch/train.py overrides of the RL run")
    p.add_argument("--sft-from", default="",
                   help="an earlier --out whose demonstrations, SFT policies and their evaluation this run reuses (its "
                        "measured minutes count in each seed's total)")
    p.add_argument("--demos-from", default="",
                   help="an earlier --out whose demonstrations this run trains on (instead of recording them)")
    p.add_argument("--out", default="runs/sft_rl", help="where every run of every seed is written")
    p.add_argument("--dry-run", action="store_true", help="toy sizes: the pipeline end to end, not its figures")
    args = p.parse_args()
    recipe = RECIPES[args.env]
    for key in ("demos", "first_steps", "sft_steps", "sft_lr", "rl_steps", "eval_states"):
        if getattr(args, key) is None:
            setattr(args, key, getattr(recipe, key))
    if args.obs and not args.env.startswith("metaworld"):
        p.error(f"--obs chooses Meta-World's observation; --env {args.env} has one")
    if args.dry_run:
        args.demos, args.sft_steps, args.rl_steps, args.eval_states = 4, 2, 1, 0
    return args


def run(script: str, *args: str) -> str:
    """`launch/<script>.py args` in its own process; its stdout (exit on failure, with its output)."""
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        sys.exit(f"launch/{script}.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def timed(script: str, *args: str) -> tuple[str, float]:
    """`run`, and its wall time in minutes."""
    start = time.perf_counter()
    stdout = run(script, *args)
    return stdout, (time.perf_counter() - start) / 60


def evaluate(task: list[str], args: argparse.Namespace, checkpoint: Path, run_dir: Path) -> tuple[float, int]:
    """launch/eval.py of `checkpoint` on the held-out states (`--eval-states` a task): success rate, episodes."""
    wide = [f"env.num_eval_init_states={args.eval_states}"] if args.eval_states else []
    stdout = run("eval", *task, *wide, f"model.checkpoint={checkpoint}", f"run_dir={run_dir}")
    return last_value(stdout, "success_rate"), int(last_value(stdout, "episodes"))


def last_value(stdout: str, key: str) -> float:
    found = re.findall(rf"(?<![a-z_]){key}=([0-9.]+)", stdout.strip().splitlines()[-1])
    if not found:
        sys.exit(f"no {key}= in the last line: {stdout.strip().splitlines()[-1]!r}")
    return float(found[0])


def pipeline(args: argparse.Namespace, seed: int) -> dict:
    """One seed's commands; its success rates, the evaluations' episodes and the minutes of demonstrations, SFT and
    RL (the evaluations not counted; each phase's minutes in `minutes.json` of its folder)."""
    out = Path(args.out) / f"seed_{seed}"
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} is not empty: name another --out, or remove it")
    recipe = RECIPES[args.env]
    small = [*recipe.dry_run, "parallel.num_workers=1", "parallel.sims_per_worker=2"] if args.dry_run else []
    observed = [f"env.metaworld.observation={args.obs}"] if args.obs else []
    task = [*recipe.task, *observed, f"seed={seed}", "progress=false", "deterministic=true", *small]
    sft_dir, sft = supervised(args, seed, task, out)
    row = {"seed": seed, "sft": sft["sft_success"], "rl": math.nan, "episodes": sft.get("episodes", 0),
           "minutes": sft["sft"], "sft_tasks": task_rates(sft_dir / "sft_eval"), "rl_tasks": {}}
    if not args.rl_steps:
        return row
    _, rl_minutes = timed("train", *task, f"model.checkpoint={sft_dir / 'sft'}", *rl_overrides(args, recipe),
                          f"steps={args.rl_steps}", "eval_every=0", f"save_every={args.rl_steps}",
                          f"run_dir={out / 'rl'}")
    rl_rate, episodes = evaluate(task, args, out / "rl", out / "rl_eval")
    (out / "minutes.json").write_text(json.dumps({**sft, "rl": rl_minutes}))
    return {**row, "rl": rl_rate, "minutes": sft["sft"] + rl_minutes, "rl_tasks": task_rates(out / "rl_eval")}


def rl_overrides(args: argparse.Namespace, recipe: Recipe) -> list[str]:
    """launch/train.py's overrides of the RL run (after the task's): the algorithm's, the recipe's for it and for the
    family, `--rl-args`; toy sizes in a dry run."""
    rl = [*RL[args.algo], *recipe.algo_rl.get(args.algo, []), *recipe.family_rl.get(args.family, []),
          *([] if args.dry_run else recipe.rl_env), *args.rl_args]
    if args.dry_run:
        rl += ["algo.batch_size=2", "algo.group_size=2", "algo.mini_batches=1", "algo.critic.warmup_steps=0"]
    return rl


def task_rates(eval_dir: Path) -> dict[str, float]:
    """Each task's held-out success from launch/eval.py's `eval_<suite>.csv` in `eval_dir` (by its name or, where
    the suite has none, its instruction)."""
    tables = [p for p in eval_dir.glob("eval_*.csv") if not p.stem.endswith("_groups")]
    if not tables:
        return {}
    table = tables[0]
    with table.open() as f:
        return {row["instruction"].split(": ")[0]: float(row["success_rate"])  # Meta-World's: "<name>: <text>"
                for row in csv.DictReader(f) if row["task"] != "total"}


def supervised(args: argparse.Namespace, seed: int, task: list[str], out: Path) -> tuple[Path, dict]:
    """The seed's demonstrations, SFT stages and the SFT policy's evaluation: run into `out`, or those of
    `--sft-from` (as measured then). The folder holding them, and its record: `sft` (the minutes of demonstrations
    and SFT, the evaluation not counted), `sft_success`, `episodes` (the evaluation's)."""
    if args.sft_from:
        earlier = Path(args.sft_from) / f"seed_{seed}"
        return earlier, json.loads((earlier / "minutes.json").read_text())
    minutes = 0.0
    demos = Path(args.demos_from) / f"seed_{seed}" / "demos" if args.demos_from else out / "demos"
    if not args.demos_from:
        spread = [f"env.pick_place.start_spread={args.start_spread}"] if args.env == "pick_place" else []
        minutes += timed("demonstrate", *task, *spread, f"record.path={demos}", f"demo.episodes={args.demos}",
                         f"demo.noise={args.noise}", f"run_dir={out / 'demonstrate'}")[1]
    sft = [*task, f"sft.dataset={demos}", f"sft.steps={args.sft_steps}", f"sft.lr={args.sft_lr}", *args.sft_args]
    policy = RECIPES[args.env].policies[args.family]
    start_from = policy
    if args.first_steps:
        minutes += timed("sft", *sft, *policy, f"sft.first_steps={args.first_steps}",
                         f"run_dir={out / 'sft_first'}")[1]
        start_from = [f"model.checkpoint={out / 'sft_first'}"]
    minutes += timed("sft", *sft, *start_from, f"run_dir={out / 'sft'}")[1]
    rate, episodes = evaluate(task, args, out / "sft", out / "sft_eval")
    record = {"sft": minutes, "sft_success": rate, "episodes": episodes}
    (out / "minutes.json").write_text(json.dumps(record))
    return out, record


def main() -> None:
    args = parse()
    rows = [pipeline(args, seed) for seed in args.seeds]
    print("| seed | SFT success (held out) | RL success (held out) | gain | episodes | minutes |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['sft']:.3f} | {r['rl']:.3f} | {r['rl'] - r['sft']:+.3f} | {r['episodes']} | "
              f"{r['minutes']:.1f} |")
    print_task_table(rows)
    obs = f" obs={args.obs or 'agent'}" if args.env.startswith("metaworld") else ""
    for r in rows:
        rl = "" if math.isnan(r["rl"]) else f" rl={_down(r['rl'], 2)}"  # --rl-steps 0: the SFT policy alone
        print(f"sft_rl: env={args.env}{obs} family={args.family} algo={args.algo} seed={r['seed']} "
              f"sft={_down(r['sft'], 2)}{rl} episodes={r['episodes']} minutes={_down(r['minutes'], 1)}", flush=True)


def print_task_table(rows: list[dict]) -> None:
    """Per task, each seed's SFT -> RL held-out success (from the evaluations' tables)."""
    tasks = list(rows[0]["sft_tasks"]) if rows else []
    if len(tasks) < 2:
        return
    print("\n| task | " + " | ".join(f"seed {r['seed']}: SFT -> RL" for r in rows) + " |")
    print("|---|" + "---|" * len(rows))
    for task in tasks:
        cells = [f"{r['sft_tasks'].get(task, math.nan):.2f} -> {r['rl_tasks'].get(task, math.nan):.2f}" for r in rows]
        print(f"| {task} | " + " | ".join(cells) + " |")


def _down(value: float, places: int) -> str:
    """`value` cut (never rounded up) to `places` decimals: the line's short form; the table has 3."""
    scale = 10**places
    return f"{math.floor(value * scale + 1e-9) / scale:.{places}f}"


if __name__ == "__main__":
    main()
