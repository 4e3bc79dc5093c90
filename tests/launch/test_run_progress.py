"""What launch/train.py shows inside a step: with `progress=true` a bar of the rollout's episodes (and one of each
evaluation's) under the bar of the steps, counting them as they end, and with `progress=false` one line a step and
one an evaluation instead; the line that says what an evaluation plays and which keys shrink or skip it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import TINY, run_script, script_env


@pytest.mark.slow
def test_the_console_counts_a_steps_episodes_and_an_evaluations_as_they_end(tmp_path: Path) -> None:
    every_update = dict(script_env(), TQDM_MININTERVAL="0")  # each count drawn, not only those 0.1 s apart
    proc = run_script("train", *TINY, "steps=1", "eval_every=5", "save_every=0", "progress=true",
                      "rollout.pipeline_stage_num=2", f"run_dir={tmp_path}", env=every_update)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    drawn = re.split(r"[\r\n]", proc.stderr)
    rollout = [int(m.group(1)) for line in drawn if (m := re.match(r"rollout 1: .*\| (\d+)/8 \[.*episode/s", line))]
    assert rollout[0] == 0 and rollout[-1] == 8 and rollout == sorted(rollout), proc.stderr[-3000:]
    assert any(0 < n < 8 for n in rollout), rollout  # the first stage's episodes end before the second's
    evaluated = [line for line in drawn if re.match(r"eval at step (0|1): .*\| \d+/6 \[.*episode/s", line)]
    assert {line.split(":")[0] for line in evaluated} == {"eval at step 0", "eval at step 1"}, proc.stderr[-3000:]
    assert ("evaluation: 6 episodes (3 tasks x 2 init states) of up to 16 env steps at step 0, every 5 steps and at "
            "the end; env.num_eval_init_states and env.num_tasks shrink it, eval_every=0 skips it"
            in proc.stdout.splitlines()), proc.stdout[-3000:]


@pytest.mark.slow
def test_without_bars_the_console_has_one_line_a_step_and_one_an_evaluation(tmp_path: Path) -> None:
    proc = run_script("train", *TINY, "steps=2", "eval_every=2", "save_every=0", f"run_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    shown = [line.split(":")[0] for line in lines if re.match(r"(step \d/2|eval at step \d): success ", line)]
    assert shown == ["eval at step 0", "step 1/2", "step 2/2", "eval at step 2"], proc.stdout[-3000:]
    assert re.search(r"^eval at step 0: success [0-9.]+ over 6 episodes in \d+ s$", proc.stdout, re.M)
    assert re.search(r"^step 1/2: success [0-9.]+, \d+ env steps, rollout \d+ s, update \d+ s$", proc.stdout, re.M)
    assert "episode/s" not in proc.stderr and "it/s" not in proc.stderr  # no bar drawn
