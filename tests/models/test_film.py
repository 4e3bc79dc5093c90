"""FiLM (`model.use_film`): the vision blocks conditioned on the prompt's average token embedding, as OpenVLA-OFT+'s
`FiLMedVisionTransformerBlock` does it; kept through checkpoints, trained whole under LoRA."""

import json

import numpy as np
import pytest
import torch

from vla_scale.config import LoraConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.lora import add_adapters
from vla_scale.models.oft import OFTPolicy, PretrainedVLA, Processor
from vla_scale.models.oft.pretrained import CheckpointError
from vla_scale.models.oft.vision import Block, ViTSpec
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import build_policy, fresh_vla, model_config_from_spec

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4, max_text_len=24, use_film=True)
TOK = WordTokenizer.from_instructions(instructions())


def policy(film: bool = True) -> OFTPolicy:
    torch.manual_seed(0)
    return build_policy(ModelConfig(**{**vars(CFG), "use_film": film}), TOK).eval()


def inputs(texts: list[str], p: OFTPolicy):
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
    obs = [Observation({"agentview": image}, np.zeros(4, np.float32), text) for text in texts]
    return Processor.for_spec(p.spec, TOK, max_text_len=CFG.max_text_len)(obs)


def test_a_filmed_block_scales_and_shifts_its_features_between_the_attention_and_the_mlp():
    spec = ViTSpec(image_size=16, patch_size=8, embed_dim=8, depth=1, num_heads=2, layer_scale=True)
    torch.manual_seed(0)
    block = Block(spec, film_dim=6)
    x, language = torch.randn(3, 5, 8), torch.randn(3, 6)
    # the official wrapper's order: attention residual, then (1 + gamma) * x + beta, then the MLP residual
    h = x + block.ls1(block.attn(block.norm1(x)))
    h = h * (1 + block.scale(language)[:, None]) + block.shift(language)[:, None]
    want = h + block.ls2(block.mlp(block.norm2(h)))
    torch.testing.assert_close(block(x, language), want, rtol=0, atol=0)
    assert not torch.allclose(block(x, language), block(x, torch.zeros(3, 6)))  # the language moves the features


def test_the_conditioning_averages_bos_prompt_and_stop_embeddings_whatever_the_padding():
    p = policy()
    batch = inputs(["reach the red block", "reach the blue block"], p)
    embed = p.language_model.get_input_embeddings().weight
    got = p.film_language(batch.input_ids, batch.attention_mask)
    for row in range(2):
        ids = batch.input_ids[row][batch.attention_mask[row]].tolist() + [p.spec.stop_token_id]
        torch.testing.assert_close(got[row], embed[ids].mean(dim=0))
    trimmed = int(batch.attention_mask.sum(dim=1).max())
    torch.testing.assert_close(p.film_language(batch.input_ids[:, :trimmed], batch.attention_mask[:, :trimmed]), got)
    assert policy(film=False).film_language(batch.input_ids, batch.attention_mask) is None


def test_the_prompt_reaches_the_image_features_of_a_filmed_policy_only():
    texts = ["reach the red block", "reach the blue block"]
    for film in (True, False):
        p = policy(film)
        batch = inputs(texts, p)  # the same image in both rows
        features = p.prefix_embeddings(batch.pixel_values.float(), None, p.vision_backbone,
                                       p.film_language(batch.input_ids, batch.attention_mask))
        assert torch.equal(features[0], features[1]) != film
    logits = p.action_logits(batch.pixel_values.float(), batch.input_ids, batch.attention_mask)
    logits.sum().backward()  # the projections learn from the action loss
    filmed = policy()
    filmed.action_logits(batch.pixel_values.float(), batch.input_ids, batch.attention_mask).sum().backward()
    grad = filmed.vision_backbone.featurizer.blocks[0].scale.weight.grad
    assert grad is not None and grad.abs().sum() > 0


def test_film_is_saved_with_the_policy_and_decides_on_load(tmp_path):
    p = policy()
    p.save_pretrained(str(tmp_path))
    assert json.loads((tmp_path / "config.json").read_text())["vla_scale"]["use_film"] is True
    loaded = OFTPolicy.from_pretrained(str(tmp_path)).eval()
    assert loaded.spec.use_film and model_config_from_spec(loaded.spec).use_film
    want, got = p.state_dict(), loaded.state_dict()
    assert any(".scale." in k for k in want) and want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)
    batch = inputs(["reach the red block"], p)
    with torch.no_grad():
        torch.testing.assert_close(loaded.action_logits(batch.pixel_values.float(), batch.input_ids,
                                                        batch.attention_mask),
                                   p.action_logits(batch.pixel_values.float(), batch.input_ids, batch.attention_mask),
                                   rtol=0, atol=0)


def test_lora_trains_the_film_projections_whole():
    p = policy()
    adapted = add_adapters(p, LoraConfig(rank=2, alpha=4.0, target_modules=["all-linear"]))
    assert adapted and not any(name.endswith((".scale", ".shift")) for name in adapted)
    trained = {name for name, param in p.named_parameters() if param.requires_grad}
    film = {name for name in trained if ".scale." in name or ".shift." in name}
    depth = CFG.vision_layers
    assert len(film) == 2 * 2 * depth  # weight and bias of both projections of every block
    assert all(".lora_" in name for name in trained - film)


def test_an_official_film_fine_tune_is_refused_naming_its_vision_backbone_file(tmp_path):
    fresh_vla(ModelConfig(**{**vars(CFG), "use_film": False}), instructions()).save_pretrained(str(tmp_path))
    assert PretrainedVLA.from_pretrained(str(tmp_path), env="reach").spec.use_film is False  # the folder alone loads
    torch.save({}, tmp_path / "vision_backbone--150000_checkpoint.pt")
    with pytest.raises(CheckpointError) as err:
        PretrainedVLA.from_pretrained(str(tmp_path), env="reach")
    for phrase in ("is a FiLM fine-tune", "vision_backbone--150000_checkpoint.pt", "model.use_film=true"):
        assert phrase in str(err.value)
