"""Rollout log-probs equal the trainer's recomputation bitwise (CPU, float32): the PPO ratio starts at exactly 1.

The engine decodes in eval mode under no_grad; the actor recomputes in train mode with autograd on. The policy has
no dropout and picks the same kernels either way, so its logits are bitwise equal; the log-probs then are too when
both sides use `vla_scale.objectives.logprobs_from_logits` at the sampling temperature.
"""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.oft import PretrainedVLA, Processor
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.objectives import logprobs_from_logits
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy, fresh_vla

FIXTURE = Path(os.environ.get("VLA_SCALE_LIBERO_FIXTURE", Path(__file__).resolve().parents[3] / "shared" / "fixtures"
                              / "oft_libero_pipeline")) / "checkpoint"
CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4, ordinal_bin_init=1.0)


@pytest.fixture(scope="module", params=["bidirectional", "causal"])
def setup(request):
    cfg = ModelConfig(**{**vars(CFG), "attention": request.param})
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    policy = build_policy(cfg, tok)
    engine = RolloutEngine(build_policy(cfg, tok), seed=3, decoder=OFTDecoder())
    engine.update_weights_from_tensor(list(policy.named_parameters()), version=1)
    rng = np.random.default_rng(0)
    texts = instructions()
    obs = [Observation({"agentview": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)},
                       rng.normal(size=4).astype(np.float32), texts[i % len(texts)]) for i in range(6)]
    return policy.train(), engine, Processor.for_spec(policy.spec, tok)(obs)


def test_trainer_logits_equal_engine_logits_bitwise(setup):
    policy, engine, batch = setup
    with torch.no_grad():
        rollout = engine.policy(batch)
    assert torch.equal(policy(batch).detach(), rollout)


@pytest.mark.parametrize("temperature", [1.0, 1.6])
def test_rollout_log_probs_equal_recomputed_bitwise(setup, temperature):
    policy, engine, batch = setup
    decoded = engine.decode(batch, temperature)
    recomputed = logprobs_from_logits(policy(batch), torch.from_numpy(decoded.tokens), temperature)
    np.testing.assert_array_equal(recomputed.detach().numpy(), decoded.logprobs)


def _two_camera_observations(n: int, side: int, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    texts = instructions()
    return [Observation({"agentview": rng.integers(0, 256, (side, side, 3), dtype=np.uint8),
                         "wrist": rng.integers(0, 256, (side, side, 3), dtype=np.uint8)},
                        rng.normal(size=8).astype(np.float32), texts[i % len(texts)]) for i in range(n)]


def _vla_two_images(fixture: bool) -> tuple[PretrainedVLA, int]:
    if fixture:
        return PretrainedVLA.from_pretrained(str(FIXTURE), unnorm_key="libero_spatial_no_noops"), 256
    cfg = ModelConfig(**{**vars(CFG), "num_images": 2, "proprio_dim": 8, "image_resize": "jpeg_lanczos3",
                         "center_crop": True, "attention": "bidirectional"})
    return fresh_vla(cfg, instructions(), env="libero"), 48


@pytest.mark.parametrize("fixture", [False, True], ids=["tiny", "official_checkpoint"])
def test_two_images_and_proprio_recorded_as_rollouts_keep_them_recompute_bitwise(fixture):
    """What a rollout records (both cameras as the towers saw them, raw proprio) gives the update exactly the
    decoded inputs, regrouped into other micro-batches too; on the same batch the log-probs are bitwise the rollout's
    (regrouped, the matmul kernels of another batch size round differently: within 1e-5)."""
    if fixture and not FIXTURE.exists():
        pytest.skip(f"official OFT LIBERO checkpoint not found at {FIXTURE}")
    torch.manual_seed(0)
    vla, side = _vla_two_images(fixture)
    assert vla.cameras == ("agentview", "wrist")
    actor = vla.new_policy().train()
    engine = RolloutEngine(vla.policy, seed=3, decoder=OFTDecoder())
    engine.update_weights_from_tensor(list(actor.named_parameters()), version=1)
    obs = _two_camera_observations(4, side)
    texts = [o.instruction for o in obs]
    images, proprio = vla.processor.prepare(obs)  # what EnvLoop records per step
    assert images.shape[1:] == (2, vla.spec.towers[0].image_size, vla.spec.towers[0].image_size, 3)
    rollout = vla.processor.from_prepared(images, texts, proprio)
    decoded = engine.decode(rollout, 1.6)
    same = logprobs_from_logits(actor(vla.processor.from_prepared(images, texts, proprio)),
                                torch.from_numpy(decoded.tokens), 1.6)
    np.testing.assert_array_equal(same.detach().numpy(), decoded.logprobs)
    for rows in ([2, 0], [3, 1]):  # the update's shuffled micro-batches
        batch = vla.processor.from_prepared(images[rows], [texts[r] for r in rows], proprio[rows])
        for name in ("pixel_values", "input_ids", "attention_mask", "proprio"):
            assert torch.equal(getattr(batch, name), getattr(rollout, name)[rows]), name
        recomputed = logprobs_from_logits(actor(batch), torch.from_numpy(decoded.tokens[rows]), 1.6)
        np.testing.assert_allclose(recomputed.detach().numpy(), decoded.logprobs[rows], rtol=0, atol=1e-5)
    # proprio reaches the policy: another state gives other logits
    moved = vla.processor.from_prepared(images, [o.instruction for o in obs], proprio + 0.5)
    with torch.no_grad():
        assert not torch.equal(engine.policy(moved), engine.policy(vla.processor.from_prepared(
            images, [o.instruction for o in obs], proprio)))
