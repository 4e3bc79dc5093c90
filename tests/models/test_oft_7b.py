"""`model=oft_7b` has OpenVLA-OFT's official sizes; built on the meta device (no memory, no init cost)."""

import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir

from vla_scale.config import register_configs, to_config
from vla_scale.envs.reach import instructions
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import build_policy

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(scope="module")
def oft_7b():
    register_configs()
    with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=["model=oft_7b"])).model
    start = time.perf_counter()
    with torch.device("meta"):
        policy = build_policy(cfg, WordTokenizer.from_instructions(instructions()))
    return policy, time.perf_counter() - start


def test_official_sizes(oft_7b):
    policy, seconds = oft_7b
    spec, llm = policy.spec, policy.language_model.config
    assert (llm.vocab_size, llm.hidden_size, llm.num_hidden_layers, llm.intermediate_size) == (32064, 4096, 32, 11008)
    assert (spec.text_vocab, policy.action_token_begin, spec.stop_token_id, spec.pad_token_id) == (32000, 31744, 2,
                                                                                                    32000)
    dino, siglip = spec.towers
    assert (dino.embed_dim, dino.depth, dino.reg_tokens, dino.num_patches) == (1024, 24, 4, 256)
    assert (siglip.embed_dim, siglip.depth, siglip.class_token, siglip.num_patches) == (1152, 27, False, 256)
    assert policy.projector.fc1.weight.shape == (4 * 2176, 2176) and policy.proprio_projector.fc1.in_features == 8
    total = sum(p.numel() for p in policy.parameters())
    assert 7.5e9 < total < 7.6e9, total
    assert seconds < 20


def test_unused_tower_parts_are_frozen(oft_7b):
    policy, _ = oft_7b
    frozen = {n for n, p in policy.named_parameters() if not p.requires_grad}
    assert "vision_backbone.featurizer.blocks.23.attn.qkv.weight" in frozen
    assert "vision_backbone.fused_featurizer.attn_pool.latent" in frozen
    assert "vision_backbone.featurizer.norm.weight" in frozen
    assert "vision_backbone.featurizer.blocks.22.attn.qkv.weight" not in frozen
    assert all(n.startswith("vision_backbone.") for n in frozen)
