import numpy as np
import pytest

from vla_scale.config import EnvConfig, ModelConfig
from vla_scale.datasets.episodes import Episode
from vla_scale.models.oft.actions import ActionTokenizer, DatasetStats
from vla_scale.run_policy import vla_for_env
from vla_scale.sft.examples import SupervisedExamples, chunk_targets
from vla_scale.sft.statistics import dataset_statistics


def test_chunks_repeat_the_last_action_past_the_end():
    actions = np.arange(4, dtype=np.float64)[:, None]
    assert chunk_targets(actions, 3)[:, :, 0].tolist() == [[0, 1, 2], [1, 2, 3], [2, 3, 3], [3, 3, 3]]


def test_statistics_are_numpy_quantiles_over_every_step():
    a, b = np.random.default_rng(0).normal(size=(5, 7)), np.random.default_rng(1).normal(size=(3, 7))
    stats = dataset_statistics([a, b], [a[:, :4], b[:, :4]])
    every = np.concatenate([a, b])
    assert np.allclose(stats["action"]["q01"], np.quantile(every, 0.01, axis=0))
    assert np.allclose(stats["proprio"]["q99"], np.quantile(every[:, :4], 0.99, axis=0))
    assert stats["num_transitions"] == 8 and stats["num_trajectories"] == 2


def test_normalised_actions_round_trip_through_the_bounds():
    stats = DatasetStats.from_json(dataset_statistics([np.array([[-2.0, 0.0], [2.0, 1.0]])],
                                                      [np.zeros((2, 1))]), "bounds_q99")
    raw = np.array([[0.0, 0.5], [1.0, 0.25]])
    assert np.allclose(stats.unnormalize_actions(stats.normalize_actions(raw)), raw, atol=1e-6)


@pytest.mark.parametrize("head", ["tokens", "l1"])
def test_examples_carry_the_policy_inputs_and_normalised_chunk_targets(head):
    rng = np.random.default_rng(0)
    episode = Episode("put the red cube in the blue bowl",
                      {c: rng.integers(0, 256, (5, 64, 64, 3), dtype=np.uint8) for c in ("agentview", "wrist")},
                      rng.normal(size=(5, 4)).astype(np.float32), rng.uniform(-1, 1, (5, 7)).astype(np.float32))
    stats = dataset_statistics([episode.actions], [episode.state])
    env = EnvConfig(name="pick_place", suite="pick_place", num_tasks=4)
    vla = vla_for_env(ModelConfig(num_images=2, action_head=head, image_size=64, patch_size=16), env)
    vla = vla.with_statistics("pick_place", stats)
    assert vla.convention == "env" and vla.cameras == ("agentview", "wrist")
    examples = SupervisedExamples.build([episode], vla.processor, vla.processor.stats, 8, head, 256)
    assert len(examples) == 5 and examples.images.shape == (5, 2, 64, 64, 3)
    inputs, targets = examples.batch(np.array([1, 3]), vla.processor)
    assert targets.shape == (2, 56) and inputs.pixel_values.shape[0] == 2
    normalized = vla.processor.stats.normalize_actions(chunk_targets(episode.actions.astype(np.float64), 8))
    want = normalized[1].reshape(-1)
    got = targets[0].numpy()
    if head == "tokens":
        assert np.array_equal(got, ActionTokenizer(256).to_bins(want))
    else:
        assert np.allclose(got, want)
