"""When a run evaluates, saves and sends resets ahead (`trainer.Schedule`); `eval_every=0`: no evaluation during the
run (neither at step 0, nor periodically, nor at the end), as `save_every=0` writes no checkpoint; a refused value
and the run's evaluation line name the keys that shrink one."""

from pathlib import Path

import pytest
from conftest import read_scalars, train_ok

from vla_scale.config import ConfigError, validate
from vla_scale.trainer import Schedule


def test_evaluations_checkpoints_and_prefetches_fall_on_their_steps():
    s = Schedule(steps=5, eval_every=2, save_every=2)
    assert [s.evaluates_before(k) for k in range(5)] == [True, False, True, False, True]
    assert [s.saves_after(k) for k in range(1, 6)] == [False, True, False, True, False]  # the end saves on its own
    # resets go out ahead only when the next step exists and starts with a rollout, not an evaluation
    assert [s.prefetches_after(k) for k in range(5)] == [True, False, True, False, False]


def test_save_every_zero_never_saves():
    assert not any(Schedule(steps=4, eval_every=1, save_every=0).saves_after(k) for k in range(5))


def test_setup_builds_the_policy_once_and_the_first_sync_fills_the_engine(tiny_config, tmp_path):
    """The actor's build is the only one (the cached `vla.policy` is never made); the engine starts empty and the
    first (verified) sync makes it the actor's policy bit for bit."""
    from vla_scale.parallel.sync.weight_sync import gathered_buckets
    from vla_scale.tensors.checksum import weights_checksum
    from vla_scale.trainer import Trainer

    trainer = Trainer(tiny_config("parallel.num_workers=1", "parallel.sims_per_worker=1"), str(tmp_path / "run"))
    try:
        trainer.setup()
        assert trainer.vla._policy is None
        actor = weights_checksum([(n, t.clone()) for b in gathered_buckets(trainer.actor.policy, 1) for n, t in b])
        assert trainer.engine.checksum() == actor and trainer.engine.version == 0
    finally:
        trainer.close()


def test_eval_every_zero_schedules_no_evaluation_and_keeps_the_prefetch() -> None:
    s = Schedule(steps=4, eval_every=0, save_every=2)
    assert not any(s.evaluates_before(k) for k in range(5)) and not s.evaluates_at_end
    assert all(s.prefetches_after(k) for k in range(3))  # no evaluation comes between a step and the next
    positive = Schedule(steps=4, eval_every=2, save_every=0)
    assert [positive.evaluates_before(k) for k in range(4)] == [True, False, True, False] and positive.evaluates_at_end


def test_a_refused_eval_every_says_what_zero_means_and_what_shrinks_an_evaluation(tiny_config) -> None:
    validate(tiny_config("eval_every=0"), 1)
    with pytest.raises(ConfigError) as refused:
        validate(tiny_config("eval_every=-1"), 1)
    message = str(refused.value)
    assert "eval_every=-1 must be >= 0 (0: no evaluation during the run;" in message, message
    assert "env.num_eval_init_states" in message and "env.num_tasks" in message, message


@pytest.mark.slow
def test_a_run_with_eval_every_zero_evaluates_never_and_still_ends_with_its_line(tmp_path: Path) -> None:
    proc = train_ok("steps=2", "eval_every=0", "save_every=0", "env.eval_videos_per_task=1", f"run_dir={tmp_path}")
    lines = proc.stdout.strip().splitlines()
    assert "evaluation: none (eval_every=0)" in lines, proc.stdout[-3000:]
    assert lines[-1] == "train: steps=2 eval_success_rate=-"
    scalars = read_scalars(str(tmp_path / "tb"))
    assert not [tag for tag in scalars if tag.startswith("eval/")]
    assert [step for step, _ in scalars["train/success_rate"]] == [1, 2]
    assert not (tmp_path / "videos").exists()  # an evaluation would have written one video a task there
