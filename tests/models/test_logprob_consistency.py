"""Rollout log-probs equal the trainer's recomputation bitwise (CPU, float32): the PPO ratio starts at exactly 1.

The engine decodes in eval mode under no_grad; the actor recomputes in train mode with autograd on. The policy has
no dropout and picks the same kernels either way, so its logits are bitwise equal; the log-probs then are too when
both sides use `vla_scale.algo.logprobs_from_logits` at the sampling temperature.
"""

import numpy as np
import pytest
import torch

from vla_scale.algo import logprobs_from_logits
from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models import Processor, WordTokenizer, build_policy
from vla_scale.rollout.engine import RolloutEngine

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4, ordinal_bin_init=1.0)


@pytest.fixture(scope="module", params=["bidirectional", "causal"])
def setup(request):
    cfg = ModelConfig(**{**vars(CFG), "attention": request.param})
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    policy = build_policy(cfg, tok)
    engine = RolloutEngine(build_policy(cfg, tok), seed=3)
    engine.update_weights_from_tensor(list(policy.named_parameters()), version=1)
    rng = np.random.default_rng(0)
    texts = instructions()
    obs = [Observation({"agentview": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)},
                       rng.normal(size=4).astype(np.float32), texts[i % len(texts)]) for i in range(6)]
    return policy.train(), engine, Processor(cfg, tok)(obs)


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
