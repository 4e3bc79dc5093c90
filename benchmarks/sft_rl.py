"""From demonstrations to a better policy on the embedded pick_place task, as a new user runs it, for several seeds.

    python benchmarks/sft_rl.py --seeds 0 1 2          # the table of docs/performance.md (2-core CPU machine)
    python benchmarks/sft_rl.py --dry-run              # the whole pipeline at toy sizes, in about a minute

Per seed, six commands run one after another, each as the README gives it (their own processes, their own last
lines parsed): scripted demonstrations on the TRAIN init states, the gripper starting anywhere over the table
(launch/demonstrate.py) -> supervised fine-tuning in two stages, the first on the first steps of each demonstration
(where the instruction's cube decides the moves), the second on whole demonstrations from the first's checkpoint
(launch/sft.py) -> evaluation of the SFT policy on the held-out EVAL init states (launch/eval.py) -> RL from the
SFT checkpoint (launch/train.py, `--algo grpo` or `ppo`) -> evaluation of the RL policy (launch/eval.py). Everything
a run writes stays in `--out/seed_<s>/`, with each phase's minutes in `minutes.json`; `--sft-from <earlier out>`
reuses an earlier run's demonstrations and SFT policies (another RL from the same start), counting their minutes as
measured. Prints one row per seed and, per seed, the line
`sft_rl: task=pick_place seed=<s> sft=<x.xx> rl=<y.yy> minutes=<m>` (minutes: the six commands' wall time; the
line's figures are cut, never rounded up, the table's have three decimals).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RECIPE = {"demos": 320, "noise": 0.0, "start_spread": 0.15, "first_steps": 8, "sft_steps": 1000, "sft_lr": 1e-3,
          "rl_steps": 200}
"""The sizes docs/performance.md's table was measured with: one noise-free demonstration per task and TRAIN init
state (4 x 80), the gripper starting within 0.15 m of the table's centre; 1000 SFT steps of 64 examples on the first
8 steps of each demonstration, then 1000 on whole demonstrations; 200 PPO steps."""
POLICIES = {
    "oft": ["model=tiny_pick_place", "model.attention=bidirectional", "model.use_film=true"],
    "pi0": ["model=pi0_tiny", f"model.pi0.tokenizer={ROOT / 'tests/fixtures/openpi_reference/tokenizer.model'}",
            "model.pi0.max_token_len=24", "model.pi0.image_size=32", "model.pi0.patch_size=8"],
}
"""The policy of each family (`--family`). OFT: the tiny policy with every position attending to every other and
the vision FiLMed by the prompt, the two letting the image patches read the instruction (docs/performance.md, "Where
the cube's word is needed"). π0: the tiny π0 (two 2-layer Gemmas) with 16 patches of 8 px per 32 px image, the
parity fixture's SentencePiece model and room for pick_place's prompts."""
RL = {"ppo": ["algo=ppo", "algo.mini_batches=4", "algo.micro_batches=1", "algo.lr=1e-4", "algo.temperature=1.0",
              "algo.critic.warmup_steps=5"],
      "grpo": ["algo=grpo", "algo.mini_batches=4", "algo.micro_batches=1", "algo.lr=1e-4", "algo.temperature=1.0"]}
"""RL from the SFT policy (`--algo`): PPO with a critic (configs/algo/ppo.yaml: 64 episodes a step, chunk-level GAE,
the step limit ends a failure; the value head trained alone for its first 5 steps), the recipe; or GRPO
(configs/algo/grpo.yaml, SimpleVLA-RL's recipe). Both at lr 1e-4 and temperature 1.0 (docs/performance.md: the tiny
policy falls back at grpo.yaml's 3e-4 and 1.6), four optimizer steps per RL step. `--rl-args` adds overrides."""


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--demos", type=int, default=RECIPE["demos"], help="scripted demonstrations recorded")
    p.add_argument("--noise", type=float, default=RECIPE["noise"], help="the demonstrator's xyz noise")
    p.add_argument("--start-spread", type=float, default=RECIPE["start_spread"],
                   help="env.pick_place.start_spread of the demonstrations (m)")
    p.add_argument("--first-steps", type=int, default=RECIPE["first_steps"],
                   help="sft.first_steps of the first SFT stage (0: one stage on whole demonstrations)")
    p.add_argument("--sft-steps", type=int, default=RECIPE["sft_steps"], help="supervised optimizer steps")
    p.add_argument("--sft-lr", type=float, default=RECIPE["sft_lr"], help="supervised learning rate")
    p.add_argument("--rl-steps", type=int, default=RECIPE["rl_steps"],
                   help="RL steps from the SFT policy (0: stop after the SFT policy's evaluation)")
    p.add_argument("--family", choices=sorted(POLICIES), default="oft", help="the policy family")
    p.add_argument("--algo", choices=sorted(RL), default="ppo", help="the RL algorithm")
    p.add_argument("--rl-args", nargs="*", default=[], help="more launch/train.py overrides of the RL run")
    p.add_argument("--sft-from", default="",
                   help="an earlier --out whose demonstrations, SFT policies and their evaluation this run reuses (its "
                        "measured minutes count in each seed's total)")
    p.add_argument("--demos-from", default="",
                   help="an earlier --out whose demonstrations this run trains on (instead of recording them)")
    p.add_argument("--out", default="runs/sft_rl", help="where every run of every seed is written")
    p.add_argument("--dry-run", action="store_true", help="toy sizes: the pipeline end to end, not its figures")
    return p.parse_args()


def run(script: str, *args: str) -> str:
    """`launch/<script>.py args` in its own process; its stdout (exit on failure, with its output)."""
    proc = subprocess.run([sys.executable, str(ROOT / "launch" / f"{script}.py"), *args], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        sys.exit(f"launch/{script}.py {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


def last_value(stdout: str, key: str) -> float:
    found = re.findall(rf"{key}=([0-9.]+)", stdout.strip().splitlines()[-1])
    if not found:
        sys.exit(f"no {key}= in the last line: {stdout.strip().splitlines()[-1]!r}")
    return float(found[0])


def pipeline(args: argparse.Namespace, seed: int) -> dict[str, float]:
    """One seed's commands; its success rates and minutes (each phase's in `minutes.json` of its folder)."""
    out = Path(args.out) / f"seed_{seed}"
    if out.exists() and any(out.iterdir()):
        sys.exit(f"{out} is not empty: name another --out, or remove it")
    small = ["env.num_eval_init_states=1", "env.max_steps=8", "parallel.num_workers=1", "parallel.sims_per_worker=2"] \
        if args.dry_run else []
    task = ["env=pick_place", f"seed={seed}", "progress=false", *small]
    sft_dir, (sft_rate, sft_minutes) = supervised(args, seed, task, out)
    if not args.rl_steps:
        return {"seed": seed, "sft": sft_rate, "rl": math.nan, "minutes": sft_minutes}
    start = time.perf_counter()
    rl = [*RL[args.algo], *args.rl_args]
    if args.dry_run:
        rl += ["algo.batch_size=2", "algo.group_size=2", "algo.mini_batches=1", "algo.critic.warmup_steps=0"]
    run("train", *task, f"model.checkpoint={sft_dir / 'sft'}", *rl, f"steps={args.rl_steps}",
        f"eval_every={max(1, args.rl_steps // 5)}", f"save_every={args.rl_steps}", f"run_dir={out / 'rl'}")
    rl_rate = last_value(run("eval", *task, f"model.checkpoint={out / 'rl'}", f"run_dir={out / 'rl_eval'}"),
                         "success_rate")
    minutes = {"sft": sft_minutes, "rl": (time.perf_counter() - start) / 60}
    (out / "minutes.json").write_text(json.dumps({**minutes, "sft_success": sft_rate}))
    return {"seed": seed, "sft": sft_rate, "rl": rl_rate, "minutes": sum(minutes.values())}


def supervised(args: argparse.Namespace, seed: int, task: list[str], out: Path) -> tuple[Path, tuple[float, float]]:
    """The seed's demonstrations, two SFT stages and the SFT policy's evaluation: run into `out`, or those of
    `--sft-from` (their success rate and minutes as measured then). The folder holding them, (success, minutes)."""
    if args.sft_from:
        earlier = Path(args.sft_from) / f"seed_{seed}"
        record = json.loads((earlier / "minutes.json").read_text())
        return earlier, (record["sft_success"], record["sft"])
    start = time.perf_counter()
    demos = Path(args.demos_from) / f"seed_{seed}" / "demos" if args.demos_from else out / "demos"
    if not args.demos_from:
        run("demonstrate", *task, f"env.pick_place.start_spread={args.start_spread}", f"record.path={demos}",
            f"demo.episodes={args.demos}", f"demo.noise={args.noise}", f"hydra.run.dir={out / 'demonstrate'}")
    sft = [*task, f"sft.dataset={demos}", f"sft.steps={args.sft_steps}", f"sft.lr={args.sft_lr}"]
    policy = POLICIES[args.family]
    start_from = policy
    if args.first_steps:
        run("sft", *sft, *policy, f"sft.first_steps={args.first_steps}", f"run_dir={out / 'sft_first'}")
        start_from = [f"model.checkpoint={out / 'sft_first'}"]
    run("sft", *sft, *start_from, f"run_dir={out / 'sft'}")
    rate = last_value(run("eval", *task, f"model.checkpoint={out / 'sft'}", f"run_dir={out / 'sft_eval'}"),
                      "success_rate")
    minutes = (time.perf_counter() - start) / 60
    (out / "minutes.json").write_text(json.dumps({"sft": minutes, "sft_success": rate}))
    return out, (rate, minutes)


def main() -> None:
    args = parse()
    if args.dry_run:
        args.demos, args.sft_steps, args.rl_steps = 4, 2, 1
    rows = [pipeline(args, seed) for seed in args.seeds]
    print("| seed | SFT success (held out) | RL success (held out) | gain | minutes |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['seed']} | {r['sft']:.3f} | {r['rl']:.3f} | {r['rl'] - r['sft']:+.3f} | {r['minutes']:.1f} |")
    for r in rows:
        rl = "" if math.isnan(r["rl"]) else f" rl={_down(r['rl'], 2)}"  # --rl-steps 0: the SFT policy alone
        print(f"sft_rl: task=pick_place seed={r['seed']} sft={_down(r['sft'], 2)}{rl} minutes={_down(r['minutes'], 1)}",
              flush=True)


def _down(value: float, places: int) -> str:
    """`value` cut (never rounded up) to `places` decimals: the line's short form; the table has 3."""
    scale = 10**places
    return f"{math.floor(value * scale + 1e-9) / scale:.{places}f}"


if __name__ == "__main__":
    main()
