"""launch/eval.py end to end on the embedded reach task: success table (stdout, CSV, markdown), videos, TensorBoard,
the promised last line; and loading weights that launch/train.py's checkpoint layout holds."""

from __future__ import annotations

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_ENV, TINY_MODEL, read_scalars, run_script

from vla_scale.run_policy import fresh_vla

ROOT = Path(__file__).resolve().parents[2]
SMALL = [*TINY_MODEL, *TINY_ENV, "progress=false"]


def run_eval(*args: str) -> subprocess.CompletedProcess:
    proc = run_script("eval", *SMALL, *args, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return proc


def eval_module():
    spec = importlib.util.spec_from_file_location("eval_script", ROOT / "launch" / "eval.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    argv = sys.argv
    try:
        sys.argv = ["eval.py"]
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


@pytest.mark.slow
def test_smoke_run_writes_tables_videos_and_the_last_line(tmp_path: Path) -> None:
    proc = run_eval(f"run_dir={tmp_path}")
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("eval: suite=reach episodes=6 success_rate="), last
    rate = float(last.split(" success_rate=")[1].split()[0])
    error = float(last.split(" stderr=")[1].split()[0])
    assert abs(error - (rate * (1 - rate) / 6) ** 0.5) < 1e-3  # the binomial standard error of 6 episodes
    assert (tmp_path / "eval.log").read_text().strip().splitlines()[-1] == last  # the console, kept in the log
    assert "a fresh model=tiny (smoke run)" in proc.stdout
    with open(tmp_path / "eval_reach.csv") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["task", "instruction", "episodes", "successes", "success_rate"]
    assert [r[0] for r in rows[1:]] == ["0", "1", "2", "total"] and rows[1][1] == "reach the red block"
    assert float(rows[-1][-1]) == pytest.approx(rate, abs=1e-3) and rows[-1][2] == "6"
    assert "| **total** | **reach** | **6** |" in (tmp_path / "eval_reach.md").read_text()
    assert len(list((tmp_path / "videos").glob("task_*_init_40_*.mp4"))) == 3
    assert read_scalars(str(tmp_path / "tb"))["eval/success_rate"][0][1] == pytest.approx(rate, abs=1e-3)
    assert (tmp_path / ".hydra" / "overrides.yaml").is_file()  # Hydra's record in run_dir, not in runs/<time>


@pytest.mark.slow
def test_evaluates_the_latest_checkpoint_of_a_run(tmp_path: Path) -> None:
    import torch

    from vla_scale import checkpoint
    from vla_scale.envs.reach import instructions

    cfg = eval_module().to_config
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        model = cfg(compose(config_name="config", overrides=SMALL[:5])).model
    torch.manual_seed(123)
    folder = tmp_path / "train_run" / "checkpoints" / "step_3"  # a step folder is a checkpoint folder
    fresh_vla(model, instructions()).save_pretrained(str(folder))
    checkpoint.mark_latest(str(tmp_path / "train_run"), "step_3")
    proc = run_eval(f"model.checkpoint={tmp_path / 'train_run'}", f"run_dir={tmp_path / 'eval'}", "env.num_tasks=1",
                    "env.num_eval_init_states=2")
    assert f"evaluating {folder} on reach" in proc.stdout
    assert proc.stdout.strip().splitlines()[-1].startswith("eval: suite=reach episodes=2 success_rate=")


def test_the_published_protocol_plays_init_states_0_to_49_and_says_so(tiny_config) -> None:
    from vla_scale.config import ConfigError, init_state_ids, validate

    cfg = tiny_config("env=libero_object", "model=tiny_libero", "env.eval_protocol=published")
    assert init_state_ids(cfg.env, "eval") == list(range(50)) and init_state_ids(cfg.env, "train") == list(range(40))
    line = eval_module().protocol_line(cfg.env)
    assert line.startswith("protocol published") and "50 episodes per task on init states 0-49" in line
    assert "step limit 280" in line  # libero_object's, as OpenVLA-OFT's evaluation plays it
    held_out = eval_module().protocol_line(tiny_config("env=libero_object", "model=tiny_libero").env)
    assert "held_out" in held_out and "init states 40-41" in held_out  # tiny_config: 2 EVAL states
    with pytest.raises(ConfigError, match="step limit 280, but env.max_steps=100"):
        validate(tiny_config("env=libero_object", "model=tiny_libero", "env.eval_protocol=published",
                             "env.max_steps=100"))
    with pytest.raises(ConfigError, match="env=reach has none"):
        validate(tiny_config("env.eval_protocol=published"))
    # Meta-World's published protocol is LeRobot's evaluation: placements 1000-1009 of every task, 500 steps
    world = validate(tiny_config("env=metaworld_mt50", "model=tiny_metaworld", "env.num_train_init_states=40",
                                 "env.eval_protocol=published"))
    assert init_state_ids(world.env, "eval") == list(range(1000, 1010))
    line = eval_module().protocol_line(world.env)
    assert "published: metaworld's published protocol; 10 episodes per task on init states 1000-1009" in line
    assert "step limit 500" in line
    with pytest.raises(ConfigError, match="step limit 500, but env.max_steps=100"):
        validate(tiny_config("env=metaworld_mt50", "model=tiny_metaworld", "env.eval_protocol=published",
                             "env.max_steps=100"))
