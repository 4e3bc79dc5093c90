"""Held-out success against environment steps and wall time, for runs side by side (algorithms, seeds).

    python benchmarks/learning_curves.py grpo=runs/a ppo=runs/b        # LABEL=RUN_DIR, as many as wanted
    python benchmarks/learning_curves.py --budget 200000 grpo/s0=runs/a ppo/s0=runs/b

Reads each run's TensorBoard events (`tb/`): every evaluation's `eval/success_rate`, the environment steps the
training rollouts played before it (`train/env_steps` summed over the steps before; every episode played counts,
kept by GRPO's group filter or not) and the minutes since the run's first event. Prints one row per evaluation of
each run, then, at `--budget` environment steps (default: the smallest final count among the runs), each run's last
evaluation within that budget: the comparison at equal environment steps. Evaluation episodes are not counted.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def curve(run_dir: str) -> list[dict[str, float]]:
    """Each evaluation of a run: step, environment steps trained on before it, minutes since the start, success."""
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    acc = EventAccumulator(str(Path(run_dir) / "tb"), size_guidance={SCALARS: 0})
    acc.Reload()
    tags = acc.Tags()["scalars"]
    if "eval/success_rate" not in tags:
        raise SystemExit(f"{run_dir}/tb has no eval/success_rate: point at a training run's directory")
    steps = {e.step: e.value for e in acc.Scalars("train/env_steps")} if "train/env_steps" in tags else {}
    evals = acc.Scalars("eval/success_rate")
    start = min(e.wall_time for tag in tags for e in acc.Scalars(tag)[:1])
    rows = []
    for e in evals:
        played = sum(v for s, v in steps.items() if s <= e.step)
        rows.append({"step": e.step, "env_steps": played, "minutes": (e.wall_time - start) / 60, "success": e.value})
    return rows


def at_budget(rows: list[dict[str, float]], budget: float) -> dict[str, float]:
    """The last evaluation whose training used at most `budget` environment steps."""
    within = [r for r in rows if r["env_steps"] <= budget]
    return within[-1] if within else rows[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", metavar="LABEL=RUN_DIR")
    p.add_argument("--budget", type=float, default=0.0, help="environment steps to compare at (0: the smallest "
                                                              "final count among the runs)")
    args = p.parse_args()
    runs = {}
    for item in args.runs:
        label, sep, run_dir = item.partition("=")
        if not sep:
            raise SystemExit(f"{item!r}: write LABEL=RUN_DIR")
        runs[label] = curve(run_dir)
    print("| run | step | env steps | minutes | held-out success |\n|---|---|---|---|---|")
    for label, rows in runs.items():
        for r in rows:
            print(f"| {label} | {r['step']} | {r['env_steps']:.0f} | {r['minutes']:.1f} | {r['success']:.3f} |")
    budget = args.budget or min(rows[-1]["env_steps"] for rows in runs.values())
    print(f"\nat {budget:.0f} environment steps:\n| run | step | env steps | minutes | held-out success |\n"
          "|---|---|---|---|---|")
    for label, rows in runs.items():
        r = at_budget(rows, budget)
        print(f"| {label} | {r['step']} | {r['env_steps']:.0f} | {r['minutes']:.1f} | {r['success']:.3f} |")


if __name__ == "__main__":
    main()
