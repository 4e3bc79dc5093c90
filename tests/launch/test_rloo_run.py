"""launch/train.py with `algo=rloo`, the algorithm that is one module and one config file: it is found by name,
trains (finite losses at every step) and logs its config."""

import math

import pytest
from conftest import read_scalars, read_text_tags, train_ok


@pytest.mark.slow
def test_rloo_trains_through_the_entry_script(tmp_path):
    train_ok("algo=rloo", "steps=2", "eval_every=10", "save_every=0", f"run_dir={tmp_path}")
    scalars = read_scalars(str(tmp_path / "tb"))
    for tag in ("train/policy_loss", "train/grad_norm", "train/entropy", "train/success_rate"):
        assert [s for s, _ in scalars[tag]] == [1, 2] and all(math.isfinite(v) for _, v in scalars[tag]), tag
    assert "train/value_loss" not in scalars  # no critic
    config = " ".join(text for series in read_text_tags(str(tmp_path / "tb")).values() for _, text in series)
    assert "name: rloo" in config
