"""`algo.max_staleness=1` end to end: the rollout of a step is collected during the update before it (its samples one
version behind the actor, logged as `train/staleness_*`), no rollout runs ahead across a checkpoint, and a run resumed
from a checkpoint ends bit for bit where an uninterrupted one does (`deterministic=true`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from conftest import read_scalars, read_text_tags, run_script, train_ok

pytestmark = pytest.mark.slow
RUN = ("save_every=2", "eval_every=10", "deterministic=true", "algo.max_staleness=1", "algo.old_logprobs=recompute",
       "algo.tis_cap=2.0")
IGNORED = ("time/", "memory/", "rollout/", "sync/verify_s")  # wall clock; the rollout that ran during a step


def test_stale_rollouts_are_counted_and_a_resume_is_exact(tmp_path: Path) -> None:
    whole, part = tmp_path / "whole", tmp_path / "part"
    train_ok("steps=4", *RUN, f"run_dir={whole}")
    a = read_scalars(str(whole / "tb"))
    # step 1 plays its own rollout; 2 was played during update 1; a checkpoint follows step 2, so 3 plays its own
    assert [v for _, v in a["train/staleness_max"]] == [0.0, 1.0, 0.0, 1.0]
    assert [v for _, v in a["train/staleness_mean"]] == [0.0, 1.0, 0.0, 1.0]
    ahead = dict(a["time/rollout_ahead_s"])
    assert ahead[1] > 0 and ahead[2] == 0 and ahead[3] > 0 and ahead[4] == 0
    stale, grad = dict(a["train/mismatch_abs_log_ratio"]), dict(a["train/grad_norm"])
    moved = [step for step in (2, 4) if grad[step - 1] > 0]  # an update whose groups all failed changes nothing
    assert moved and all(stale[step] > 0 for step in moved)  # the behaviour policy is the one before the last update
    assert max(v for _, v in a["train/mismatch_weight_max"]) > 1.0

    train_ok("steps=2", *RUN, f"run_dir={part}")
    shutil.rmtree(part / "tb")  # the resumed run writes steps 3 and 4 alone
    train_ok("steps=4", *RUN, f"run_dir={part}", "resume=true")
    b = read_scalars(str(part / "tb"))
    for tag, values in b.items():
        if tag.startswith(IGNORED):
            continue
        assert values == [x for x in a[tag] if x[0] in {v for v, _ in values}], tag
    assert {3, 4} <= {step for step, _ in b["train/policy_loss"]}
    resumed, uninterrupted = (read_text_tags(str(r / "tb"))["sync/checksum"] for r in (part, whole))
    assert {4} <= {v for v, _ in resumed} and set(resumed) <= set(uninterrupted)


def test_staleness_without_the_correction_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = run_script("train", "algo.max_staleness=1", f"run_dir={tmp_path / 'r'}")
    assert proc.returncode != 0
    assert "algo.old_logprobs=recompute algo.tis_cap=2.0" in proc.stderr + proc.stdout
    assert not (tmp_path / "r" / "tb").exists()
