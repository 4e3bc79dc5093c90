"""benchmarks/sft_rl.py as `make test` runs it on the CPU: the whole script at a tiny size, and what it prints."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import script_env
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow  # each runs a benchmark script whole: a few RL steps or rollouts


def test_sft_rl_dry_run_runs_the_six_commands_and_prints_a_line_per_seed(tmp_path):
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--seeds", "0",
                           "--out", str(tmp_path)], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_rl: env=pick_place family=oft algo=ppo seed=0 sft=\d\.\d\d rl=\d\.\d\d "
                        r"episodes=\d+ minutes=\d+\.\d", lines[-1]), lines
    for folder in ("demos", "sft_first", "sft", "sft_eval", "rl", "rl_eval"):
        assert (tmp_path / "seed_0" / folder).is_dir()
    first = json.loads((tmp_path / "seed_0" / "sft_first" / "checkpoints" / "step_2" / "config.json").read_text())
    assert first["vla_scale"]["use_film"] is True and first["vla_scale"]["attention"] == "bidirectional"
    assert (tmp_path / "seed_0" / "rl" / "checkpoints" / "latest").read_text() == "step_1"
    minutes = json.loads((tmp_path / "seed_0" / "minutes.json").read_text())
    assert set(minutes) == {"sft", "rl", "sft_success", "episodes"}

    assert (tmp_path / "seed_0" / "rl" / "checkpoints" / "step_1" / "value_head.safetensors").exists()  # PPO's

    # another RL from the same SFT policy: GRPO, its seed's SFT minutes and success carried over
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--seeds", "0",
                           "--sft-from", str(tmp_path), "--algo", "grpo", "--out", str(again)], cwd=ROOT,
                          env=script_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(p.name for p in (again / "seed_0").iterdir()) == ["minutes.json", "rl", "rl_eval"]
    assert not (again / "seed_0" / "rl" / "checkpoints" / "step_1" / "value_head.safetensors").exists()
    assert json.loads((again / "seed_0" / "minutes.json").read_text())["sft"] == minutes["sft"]


def test_sft_rl_runs_the_mt10_recipe_and_reports_each_task(tmp_path):
    """The MT10 pipeline at toy sizes (two tasks, 60-step episodes: reach's expert succeeds, push's not; 32 px), π0
    and GRPO: the experts' demonstrations, one SFT stage, the evaluations' per-task table and the line naming env,
    family and algo; then the same seed's RL again from the same fine-tuned policy, every weight equal."""
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--env",
                           "metaworld_mt10", "--obs", "agent_goal", "--family", "pi0", "--algo", "grpo", "--seeds",
                           "3", "--out", str(tmp_path)], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert re.fullmatch(r"sft_rl: env=metaworld_mt10 obs=agent_goal family=pi0 algo=grpo seed=3 sft=\d\.\d\d "
                        r"rl=\d\.\d\d episodes=2 minutes=\d+\.\d", lines[-1]), lines
    assert sorted(p.name for p in (tmp_path / "seed_3").iterdir()) == [
        "demonstrate", "demos", "minutes.json", "rl", "rl_eval", "sft", "sft_eval"]  # one SFT stage
    rows = [line for line in lines if line.startswith("| reach-v3") or line.startswith("| push-v3")]
    assert len(rows) == 2 and all(re.fullmatch(r"\| \S+ \| \d\.\d\d -> \d\.\d\d \|", r) for r in rows), rows

    # the same seed's RL again from the same fine-tuned policy (deterministic=true in every command): the same RL
    # weights, bit for bit (a fine-tune's own repeatability: tests/sft/test_pi0_sft.py's resume)
    again = tmp_path / "again"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sft_rl.py"), "--dry-run", "--env",
                           "metaworld_mt10", "--obs", "agent_goal", "--family", "pi0", "--algo", "grpo", "--seeds",
                           "3", "--sft-from", str(tmp_path), "--out", str(again)], cwd=ROOT, env=script_env(),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].rsplit(" minutes=")[0] == lines[-1].rsplit(" minutes=")[0]
    for phase in ("rl",):
        ours = sorted((tmp_path / "seed_3" / phase / "checkpoints").rglob("*.safetensors"))
        theirs = sorted((again / "seed_3" / phase / "checkpoints").rglob("*.safetensors"))
        assert ours and [p.relative_to(tmp_path) for p in ours] == [p.relative_to(again) for p in theirs]
        for a, b in zip(ours, theirs, strict=True):
            first, second = load_file(a), load_file(b)
            assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first), a


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_sft_rl_mt10_recipe_plays_every_task_equally_often_in_80_episodes_a_step(algo):
    from argparse import Namespace

    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import sft_rl

    recipe = sft_rl.RECIPES["metaworld_mt10"]
    args = Namespace(algo=algo, family="oft", rl_args=[], dry_run=False)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=[*recipe.task, *sft_rl.rl_overrides(args, recipe)]))
    assert cfg.algo.name == algo and cfg.algo.batch_size * cfg.algo.group_size == 80
    assert cfg.algo.batch_size % cfg.env.num_tasks == 0  # task rounds: each of the ten tasks alike
