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
