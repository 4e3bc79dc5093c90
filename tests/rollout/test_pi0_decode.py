"""π0's noise-free decode through the one interface: the rollout engine with the source's `chunk_decoder()` gives
the actions of `Pi0Policy.sample_actions` called by hand on the same prepared inputs and noise, un-normalised with
the policy's norm stats and cut to the env's action size; the inputs are prepared as SFT prepares them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vla_scale.envs.registry import simulator
from vla_scale.envs.types import Observation
from vla_scale.models.flow.normalize import NormStats
from vla_scale.models.pi0.checkpoint import write_pi0_folder
from vla_scale.models.pi0.demonstrations import pad_last, resize_with_pad
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.pi0.source import Pi0Source
from vla_scale.models.pi0.spec import tiny_spec
from vla_scale.rollout.engine import RolloutEngine

ROOT = Path(__file__).resolve().parents[2]
TOKENIZER = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"


def pick_place_stats(seed: int = 0) -> dict[str, NormStats]:
    """Norm stats of pick_place's sizes: 7-d actions, 4-d states."""
    g = np.random.default_rng(seed)

    def one(dim: int) -> NormStats:
        q01 = g.normal(size=dim) - 1.0
        return NormStats(mean=g.normal(size=dim), std=g.random(dim) + 0.1, q01=q01, q99=q01 + g.random(dim) + 0.5)

    return {"actions": one(7), "state": one(4)}


def write_tiny_pi0(folder: Path, pi05: bool = False, layout: str = "openpi") -> Path:
    """A tiny π0 folder (weights seeded) with pick_place's norm stats and the fixture's tokenizer."""
    torch.manual_seed(0)
    policy = Pi0Policy.from_spec(tiny_spec(pi05, max_token_len=24)).eval()
    return write_pi0_folder(folder, policy, pick_place_stats(), TOKENIZER, layout=layout, asset_id="pick_place")


def _observations(n: int) -> list[Observation]:
    rng = np.random.default_rng(1)
    face = simulator("pick_place")
    texts = face.instructions("pick_place")
    return [Observation({c: rng.integers(0, 256, (64, 64, 3), dtype=np.uint8) for c in face.cameras},
                        rng.normal(size=face.proprio_dim).astype(np.float32), texts[i % len(texts)])
            for i in range(n)]


def test_engine_decode_is_sample_actions_by_hand(tmp_path: Path) -> None:
    for pi05 in (False, True):
        source = Pi0Source.from_folder(str(write_tiny_pi0(tmp_path / f"pi05_{pi05}", pi05)), "pick_place")
        assert source.rollout_problems() == [] == source.training_problems() == source.training_problems(critic=True)
        observations = _observations(3)
        processor = source.processor
        images, proprio = processor.prepare(observations)
        inputs = processor.from_prepared(images, [o.instruction for o in observations], proprio)
        engine = RolloutEngine(source.policy, "cpu", seed=7, decoder=source.chunk_decoder())
        decoded = engine.decode(inputs, temperature=1.0, greedy=True)

        # by hand: SFT's preparation, the same noise, sample_actions, openpi's Unnormalize, cut to 7-d
        spec, normalizer = source.spec, source.normalizer()
        assert normalizer is not None
        side = spec.vision.image_size
        for row, o in enumerate(observations):
            for slot, camera in enumerate(source.cameras):
                np.testing.assert_array_equal(images[row, slot], resize_with_pad(o.images[camera], side))
        state = normalizer.normalize("state", proprio.astype(np.float64))
        torch.testing.assert_close(inputs.state, torch.from_numpy(pad_last(state, spec.action_dim)), rtol=0, atol=0)
        assert inputs.image_masks.tolist() == [[i < len(source.cameras) for i in range(spec.num_images)]] * 3
        for row, o in enumerate(observations):
            tokens, masks = source.tokenizer.tokenize(o.instruction, state[row] if spec.state_in_prompt else None)
            assert inputs.tokens[row].tolist() == tokens.tolist() and inputs.token_masks[row].tolist() == masks.tolist()
        policy = Pi0Policy.from_spec(spec)
        policy.load_state_dict(source.policy.state_dict())
        noise = policy.sample_noise(3, "cpu", torch.Generator().manual_seed(7))
        normalized = policy.eval().sample_actions(inputs, noise).numpy()
        expected = normalizer.unnormalize("actions", normalized)[:, :, :7]
        np.testing.assert_array_equal(decoded.actions, expected)
        assert decoded.actions.shape == (3, spec.action_horizon, 7) and decoded.actions.dtype == np.float64
        assert decoded.tokens.shape == (3, spec.action_horizon * 7) and decoded.logprobs.shape == (3, 1)
        assert not decoded.logprobs.any() and decoded.sampled == {}
        np.testing.assert_array_equal(decoded.tokens.reshape(3, -1, 7), normalized[:, :, :7])
        again = RolloutEngine(source.policy, "cpu", seed=7, decoder=source.chunk_decoder())
        np.testing.assert_array_equal(again.decode(inputs, 1.0, greedy=True).actions, decoded.actions)


def test_one_observations_inputs_are_arrays_of_their_own(tmp_path: Path) -> None:
    """torch warns on (and must not share) a read-only numpy view; a batch of one once gave one for the masks."""
    source = Pi0Source.from_folder(str(write_tiny_pi0(tmp_path / "pi0")), "pick_place")
    observations = _observations(1)
    images, proprio = source.processor.prepare(observations)
    prepared = source.processor.encode(images, [o.instruction for o in observations], proprio)
    assert all(np.asarray(a).flags.writeable for a in vars(prepared).values())
    assert prepared.image_masks.tolist() == [[True, True, False]]
