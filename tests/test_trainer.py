"""When a run evaluates, saves and sends resets ahead (`trainer.Schedule`)."""

from vla_scale.trainer import Schedule


def test_evaluations_checkpoints_and_prefetches_fall_on_their_steps():
    s = Schedule(steps=5, eval_every=2, save_every=2)
    assert [s.evaluates_before(k) for k in range(5)] == [True, False, True, False, True]
    assert [s.saves_after(k) for k in range(1, 6)] == [False, True, False, True, False]  # the end saves on its own
    # resets go out ahead only when the next step exists and starts with a rollout, not an evaluation
    assert [s.prefetches_after(k) for k in range(5)] == [True, False, True, False, False]


def test_save_every_zero_never_saves():
    assert not any(Schedule(steps=4, eval_every=1, save_every=0).saves_after(k) for k in range(5))
