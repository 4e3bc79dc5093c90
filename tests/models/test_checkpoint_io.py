"""save_pretrained / from_pretrained: the official folder layout, round trips, strict loading, data-only side files."""

import json
import os
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft import OFTPolicy, Processor
from vla_scale.models.oft.checkpoint_io import weight_files
from vla_scale.models.oft.spec import openvla_config, spec_from_openvla
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.run_policy import build_policy, fresh_vla, resolved_model_config, spec_from_model_config, vla_for_env

FIXTURE = Path(__file__).resolve().parents[3] / "shared" / "fixtures" / "oft_official_tiny"
STATS = {"libero_goal_no_noops": {
    "action": {k: list(np.linspace(-0.5 + i, 0.5 + i, 7)) for i, k in enumerate(("q01", "q99", "min", "max"))}
    | {"mask": [True] * 6 + [False]},
    "proprio": {k: list(np.linspace(-0.5 + i, 0.5 + i, 8)) for i, k in enumerate(("q01", "q99", "min", "max"))}}}


def official_config() -> dict:
    """An official-style config.json of another size: fused towers at 32 px, 2-layer Llama, LIBERO statistics."""
    return {"model_type": "openvla", "vision_backbone_id": "dinosiglip-vit-so-224px",
            "timm_model_ids": ["vit_tiny_patch16_224", "vit_small_patch16_224"], "image_sizes": [32, 32],
            "timm_override_act_layers": [None, None], "use_fused_vision_backbone": True, "n_action_bins": 256,
            "pad_to_multiple_of": 64, "pad_token_id": 512, "norm_stats": STATS,
            "text_config": {"model_type": "llama", "vocab_size": 576, "hidden_size": 48, "intermediate_size": 96,
                            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}}


def inputs(batch: int, images: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    pixels = torch.randn(batch, images * 6, 32, 32, generator=g)
    ids = torch.randint(3, 400, (batch, 12), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 9:] = False
    return pixels, ids, mask, torch.rand(batch, 8, generator=g) * 2 - 1


def test_other_sizes_two_images_and_proprio_round_trip_sharded(tmp_path):
    torch.manual_seed(0)
    policy = OFTPolicy(spec_from_openvla(official_config(), proprio_dim=8)).eval()
    assert (policy.spec.chunk_len, policy.spec.action_dim, policy.action_token_begin) == (8, 7, 256)
    policy.save_pretrained(str(tmp_path), max_shard_gb=0.001)
    assert len(weight_files(str(tmp_path))) > 1 and (tmp_path / "model.safetensors.index.json").exists()
    side = torch.load(tmp_path / "proprio_projector--latest_checkpoint.pt", weights_only=True)
    assert sorted(side) == ["module.fc1.bias", "module.fc1.weight", "module.fc2.bias", "module.fc2.weight"]
    loaded = OFTPolicy.from_pretrained(str(tmp_path)).eval()
    args = inputs(2, images=2)
    with torch.no_grad():
        torch.testing.assert_close(loaded.action_logits(*args), policy.action_logits(*args), rtol=0, atol=0)
        features = policy.vision_backbone(args[0])
        first = policy.vision_backbone(args[0][:, :6])
    assert features.shape[1] == 2 * policy.vision_backbone.patches_per_image
    torch.testing.assert_close(features[:, : first.shape[1]], first)
    actions = loaded.tokens_to_actions(np.zeros((1, 56), dtype=np.int64))
    np.testing.assert_allclose(actions[0, 0, :6], STATS["libero_goal_no_noops"]["action"]["q99"][:6], atol=1e-2)


FRESH = {
    "tiny": ModelConfig(),
    "no proprio, crop, fixed vocabulary": ModelConfig(use_proprio=False, center_crop=True, vocab_size=512),
    "OpenVLA-7B towers and sizes": ModelConfig(
        timm_model_ids=["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"], image_size=224,
        hidden_size=4096, num_layers=32, num_heads=32, intermediate_size=11008, vocab_size=32064, num_images=2,
        image_resize="jpeg_lanczos3", proprio_dim=8),
}


@pytest.mark.parametrize("cfg", FRESH.values(), ids=FRESH)
def test_a_fresh_spec_is_the_one_its_config_json_reads_back_to(cfg):
    """A fresh policy's spec, made from its ModelConfig without a config.json, is the spec its saved config.json
    (as JSON text) reads back to, and that one saves the same text again."""
    tok = WordTokenizer.from_instructions(instructions())
    spec = spec_from_model_config(cfg, tok.vocab_size, tok.eos_id)
    text = json.dumps(openvla_config(spec), indent=2)
    back = spec_from_openvla(json.loads(text), proprio_dim=spec.proprio_dim or None)
    assert replace(back, raw={}) == replace(spec, raw={})
    assert json.dumps(openvla_config(back), indent=2) == text
    assert spec.raw == {k: back.raw[k] for k in spec.raw}  # the official fields, saved as they are
    if cfg.timm_model_ids:
        assert spec.raw["vision_backbone_id"] == "dinosiglip-vit-so-224px"
        assert spec.raw["hf_llm_id"] == "meta-llama/Llama-2-7b-hf"


def test_tiny_model_round_trip_keeps_every_option(tmp_path):
    cfg = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                      intermediate_size=64, chunk_len=4, attention="causal", ordinal_bin_init=1.0)
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    policy = build_policy(cfg, tok)
    policy.save_pretrained(str(tmp_path))
    loaded = OFTPolicy.from_pretrained(str(tmp_path))
    assert loaded.spec.attention == "causal" and loaded.action_queries is not None
    assert replace(loaded.spec, raw={}) == replace(policy.spec, raw={})
    for (name, a), (_, b) in zip(policy.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    batch = Processor.for_spec(policy.spec, tok).from_arrays(np.zeros((2, 32, 32, 3), np.uint8),
                                                             ["reach the red block"] * 2, np.zeros((2, 4), np.float32))
    torch.testing.assert_close(loaded(batch), policy(batch), rtol=0, atol=0)


@pytest.mark.skipif(not FIXTURE.exists(), reason=f"official OFT fixture not found at {FIXTURE}")
def test_official_checkpoint_saves_in_the_same_layout(tmp_path):
    policy = OFTPolicy.from_pretrained(str(FIXTURE))
    policy.save_pretrained(str(tmp_path))
    with safe_open(FIXTURE / "model.safetensors", "pt") as a, safe_open(tmp_path / "model.safetensors", "pt") as b:
        assert sorted(a.keys()) == sorted(b.keys())
        name = "vision_backbone.fused_featurizer.pos_embed"
        assert torch.equal(a.get_tensor(name).float(), b.get_tensor(name))
    config = json.loads((tmp_path / "config.json").read_text())
    original = json.loads((FIXTURE / "config.json").read_text())
    assert {k: v for k, v in config.items() if k not in ("vla_scale", "torch_dtype")} == \
        {k: v for k, v in original.items() if k != "torch_dtype"}
    assert json.loads((tmp_path / "preprocessor_config.json").read_text()) == \
        json.loads((FIXTURE / "preprocessor_config.json").read_text())
    reloaded = OFTPolicy.from_pretrained(str(tmp_path))
    assert reloaded.spec.llm == policy.spec.llm and reloaded.spec.towers == policy.spec.towers


def test_loading_is_strict_and_side_files_are_data_only(tmp_path):
    torch.manual_seed(0)
    OFTPolicy(spec_from_openvla(official_config(), proprio_dim=8)).save_pretrained(str(tmp_path))
    config = json.loads((tmp_path / "config.json").read_text())
    config["text_config"]["num_hidden_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KeyError, match="lacks"):
        OFTPolicy.from_pretrained(str(tmp_path))
    config["text_config"]["num_hidden_layers"] = 2
    (tmp_path / "config.json").write_text(json.dumps(config))
    side = tmp_path / "proprio_projector--latest_checkpoint.pt"
    torch.save({"module.fc1.weight": torch.zeros(48, 8), "payload": os.system}, side)
    with pytest.raises(Exception, match="[Ww]eights only"):
        OFTPolicy.from_pretrained(str(tmp_path))


def test_platform_constants_must_be_known(tmp_path):
    config = official_config()
    config["norm_stats"] = {"my_robot": STATS["libero_goal_no_noops"]}
    with pytest.raises(ValueError, match="chunk_len"):
        spec_from_openvla(config)
    assert spec_from_openvla(config, chunk_len=4, action_dim=7, normalization="bounds").chunk_len == 4


def test_loads_into_zero3_shards(tmp_path):
    """Under `deepspeed.zero.Init` (how the actor builds it) the checkpoint lands in the gathered parameters."""
    import deepspeed

    from vla_scale.run_setup import init_distributed

    init_distributed()
    torch.manual_seed(0)
    policy = OFTPolicy(spec_from_openvla(official_config(), proprio_dim=8))
    policy.save_pretrained(str(tmp_path))
    with deepspeed.zero.Init(config_dict_or_path={"train_micro_batch_size_per_gpu": 1,
                                                  "zero_optimization": {"stage": 3}}):
        sharded = OFTPolicy.from_pretrained(str(tmp_path), zero3_init=True)
    params = list(sharded.parameters())
    assert all(p.numel() == 0 for p in params)
    with deepspeed.zero.GatheredParameters(params):
        for (name, expected), (_, got) in zip(policy.named_parameters(), sharded.named_parameters(), strict=True):
            assert torch.equal(expected, got), name


def test_a_run_directory_stands_for_its_latest_step_folder(tmp_path):
    from vla_scale import checkpoint
    from vla_scale.models.checkpoint_folders import step_folder

    run = tmp_path / "run"
    assert step_folder(str(tmp_path)) == str(tmp_path)  # not a run: the folder itself
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match="saved no checkpoint"):
        step_folder(str(run))
    checkpoint.mark_latest(str(run), "step_2")
    assert step_folder(str(run)) == str(run / "checkpoints" / "step_2")


def test_a_policy_folder_written_from_gathered_tensors_loads_as_the_policy(tmp_path):
    """What a training step folder holds (`checkpoint.save_policy_folder`): the named tensors as the sync gathers
    them, written in the official layout with the tokenizer, read back to the same weights and prompts."""
    from vla_scale import checkpoint
    from vla_scale.models.oft import PretrainedVLA

    torch.manual_seed(0)
    vla = fresh_vla(ModelConfig(), instructions())
    checkpoint.save_policy_folder(vla.policy, str(tmp_path), vla.tokenizer, bucket_mb=1, write=True)
    assert (tmp_path / "proprio_projector--latest_checkpoint.pt").exists()
    with safe_open(tmp_path / "model.safetensors", "pt") as f:
        assert not any(k.startswith("proprio_projector.") for k in f.keys())  # in its side file, as official
    back = PretrainedVLA.from_pretrained(str(tmp_path), env="reach")
    assert all(torch.equal(a, b) for a, b in zip(vla.policy.state_dict().values(), back.policy.state_dict().values(),
                                                 strict=True))
    assert back.prompt_ids(instructions()[0]).tolist() == vla.prompt_ids(instructions()[0]).tolist()


def test_a_folder_with_several_problems_names_them_all_at_once(tmp_path):
    from vla_scale.models.oft import PretrainedVLA
    from vla_scale.models.oft.pretrained import CheckpointError

    OFTPolicy(spec_from_openvla(official_config(), proprio_dim=8)).save_pretrained(str(tmp_path))  # no tokenizer
    with pytest.raises(CheckpointError) as refused:
        PretrainedVLA.from_pretrained(str(tmp_path), unnorm_key="bridge_orig")
    assert "2 problems" in str(refused.value) and "has no tokenizer" in str(refused.value)
    assert "model.unnorm_key='bridge_orig' is not among" in str(refused.value)


def test_model_keys_set_on_the_command_line_that_a_checkpoint_contradicts_are_refused(tmp_path):
    from vla_scale.config import ConfigError, EnvConfig

    torch.manual_seed(0)
    fresh_vla(ModelConfig(), instructions()).save_pretrained(str(tmp_path))
    asked = ModelConfig(checkpoint=str(tmp_path), chunk_len=4, hidden_size=48, max_text_len=24)
    with pytest.raises(ConfigError) as refused:
        vla_for_env(asked, EnvConfig(), {"model.chunk_len", "model.hidden_size", "model.max_text_len"})
    message = str(refused.value)
    assert "model.chunk_len=4 but" in message and "has 8" in message and "model.hidden_size=48 but" in message
    assert "max_text_len" not in message  # a prompt budget applies on top of a checkpoint
    vla = vla_for_env(asked, EnvConfig())  # not set by the user: the checkpoint's values
    assert resolved_model_config(vla, asked).chunk_len == 8
