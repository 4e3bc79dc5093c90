"""RL straight from an L1-regression head, end to end: a run started from an L1 step folder trains its Gaussian,
saves step folders with the official head file, resumes bit for bit (`deterministic=true`) and evaluates through
launch/eval.py with the head named on the `policy:` line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from conftest import read_scalars, read_text_tags, run_script, train_ok

pytestmark = pytest.mark.slow
RUN = ("save_every=1", "eval_every=10", "deterministic=true", "algo.lr=3e-3")


def test_an_l1_run_resumes_bit_for_bit_and_evaluates(tmp_path: Path) -> None:
    start = tmp_path / "start"
    out = train_ok("steps=1", "model.action_head=l1", "model.action_log_std_init=-0.5", *RUN, f"run_dir={start}")
    assert "action head l1" in out.stdout
    folder = start / "checkpoints" / "step_1"
    assert (folder / "action_head--latest_checkpoint.pt").exists()

    whole, part = tmp_path / "whole", tmp_path / "part"
    train_ok("steps=3", *RUN, f"model.checkpoint={folder}", f"run_dir={whole}")  # auto: the folder's head
    train_ok("steps=2", *RUN, f"model.checkpoint={folder}", f"run_dir={part}")
    shutil.rmtree(part / "tb")  # the resumed run writes step 3 alone
    train_ok("steps=3", *RUN, f"model.checkpoint={folder}", f"run_dir={part}", "resume=true")
    a, b = read_scalars(str(whole / "tb")), read_scalars(str(part / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy", "train/success_rate"):
        assert b[tag] == [x for x in a[tag] if x[0] == 3], tag
    resumed, uninterrupted = (read_text_tags(str(r / "tb"))["sync/checksum"] for r in (part, whole))
    assert {3} <= {v for v, _ in resumed} and set(resumed) <= set(uninterrupted)  # the same weights, synced

    # the Gaussian's log-std trained (an entropy that moved) and was saved with the weights
    from safetensors.torch import load_file

    first = load_file(str(folder / "model.safetensors"))["action_noise.log_std"]
    last = load_file(str(whole / "checkpoints" / "step_3" / "model.safetensors"))["action_noise.log_std"]
    assert not torch.equal(first, torch.full((7,), -0.5)) and not torch.equal(first, last)  # one update, three

    proc = run_script("eval", "parallel.num_workers=1", "env.num_eval_init_states=2", "progress=false",
                      f"model.checkpoint={whole}", f"run_dir={tmp_path / 'eval'}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "action head l1" in proc.stdout and "eval: suite=reach" in proc.stdout
