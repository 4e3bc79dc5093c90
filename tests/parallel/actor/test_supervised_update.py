"""The actor's supervised step under ZeRO-3 (CPU, gloo): the loss of a fixed batch of demonstrations falls, and a
split into micro-batches takes the same step."""

import numpy as np
import pytest
import torch

from vla_scale.config import DeepSpeedConfig, EnvConfig, ModelConfig, SftConfig
from vla_scale.datasets.episodes import Episode
from vla_scale.models.oft import PretrainedVLA
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets
from vla_scale.run_policy import vla_for_env
from vla_scale.run_setup import init_distributed
from vla_scale.sft.examples import SupervisedExamples
from vla_scale.sft.statistics import dataset_statistics


def _setup(head: str, film: bool = False) -> tuple[PretrainedVLA, SupervisedExamples]:
    rng = np.random.default_rng(0)
    episode = Episode("put the red cube in the blue bowl",
                      {c: rng.integers(0, 256, (6, 64, 64, 3), dtype=np.uint8) for c in ("agentview", "wrist")},
                      rng.normal(size=(6, 4)).astype(np.float32), rng.uniform(-1, 1, (6, 7)).astype(np.float32))
    env = EnvConfig(name="pick_place", suite="pick_place", num_tasks=4)
    vla = vla_for_env(ModelConfig(num_images=2, action_head=head, patch_size=16, use_film=film), env)
    vla = vla.with_statistics("pick_place", dataset_statistics([episode.actions], [episode.state]))
    return vla, SupervisedExamples.build([episode], vla.processor, vla.processor.stats, 8, head, 256)


def _actor(vla: PretrainedVLA, micro_batches: int) -> Actor:
    init_distributed()
    torch.manual_seed(0)
    return Actor(vla.new_policy, DeepSpeedConfig(zero_stage=3), SftConfig(lr=1e-3, micro_batches=micro_batches),
                 scorer=vla.chunk_scorer())


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_the_supervised_loss_falls_on_a_fixed_batch(head):
    vla, examples = _setup(head)
    actor = _actor(vla, 1)
    index = np.arange(len(examples))
    losses = [actor.supervised_update([examples.batch(index, vla.processor)])["loss"] for _ in range(15)]
    assert losses[-1] < 0.7 * losses[0]


def test_a_filmed_policy_trains_its_film_projections_under_zero3():
    vla, examples = _setup("tokens", film=True)
    actor = _actor(vla, 1)

    def film() -> dict[str, torch.Tensor]:
        return {n: t.clone() for bucket in gathered_buckets(actor.policy, 1) for n, t in bucket
                if ".scale." in n or ".shift." in n}

    before = film()
    index = np.arange(len(examples))
    losses = [actor.supervised_update([examples.batch(index, vla.processor)])["loss"] for _ in range(15)]
    assert losses[-1] < 0.7 * losses[0]
    after = film()
    assert len(before) == 4 * ModelConfig().vision_layers and before.keys() == after.keys()
    assert all(not torch.equal(before[n], after[n]) for n in before)


def test_micro_batches_take_the_same_step():
    vla, examples = _setup("tokens")
    index = np.arange(len(examples))
    whole = _actor(vla, 1)
    first = whole.supervised_update([examples.batch(index, vla.processor)])
    split = _actor(vla, 2)
    halves = [examples.batch(index[:3], vla.processor), examples.batch(index[3:], vla.processor)]
    second = split.supervised_update(halves)
    assert second["loss"] == pytest.approx(first["loss"], rel=1e-5)
    for a, b in zip(whole.policy.parameters(), split.policy.parameters(), strict=True):
        assert a.ds_numel == b.ds_numel
    assert second["grad_norm"] == pytest.approx(first["grad_norm"], rel=1e-4)
