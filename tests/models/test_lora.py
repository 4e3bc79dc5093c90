"""LoRA: adapters on the policy's linear layers, trained alone by the ZeRO-3 actor (CPU here), served merged to the
rollout engine and to checkpoints, written and read in PEFT's folder layout, merged into a base on load."""

import json

import numpy as np
import pytest
import torch

from vla_scale.batches import MicroBatch, MiniBatch, RowIndex, UpdatePlan
from vla_scale.config import AlgoConfig, ConfigError, DeepSpeedConfig, EnvConfig, LoraConfig, ModelConfig, validate
from vla_scale.envs.reach import instructions
from vla_scale.models.lora import (
    ADAPTER_CONFIG,
    LoRALinear,
    add_adapters,
    is_adapter,
    merge_adapters,
    read_adapters,
    served,
    write_adapters,
)
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTDecoder, OFTScorer
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.sync.weight_sync import gathered_buckets, sync_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy, fresh_vla, spec_from_model_config, vla_for_env
from vla_scale.run_setup import init_distributed
from vla_scale.tensors.checksum import weights_checksum

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOK = WordTokenizer.from_instructions(instructions())
SPEC = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)
LORA = LoraConfig(rank=4, alpha=8.0)


def batch(seed: int, rows: int = 4) -> MicroBatch:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (rows, 32, 32, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (rows, CFG.proprio_dim)).astype(np.float32)
    processor = Processor.for_spec(SPEC, TOK)
    texts = [instructions()[i % 3] for i in range(rows)]
    inputs = processor.encode(processor.transform.prepare(images[:, None]), texts, proprio)
    k = CFG.chunk_len * 7
    mask = torch.ones(rows, k, dtype=torch.bool)
    return MicroBatch(inputs, torch.from_numpy(rng.integers(0, 256, (rows, k))), torch.full((rows, k), -5.5),
                      torch.from_numpy(rng.choice([-1.0, 1.0], rows).astype(np.float32)), mask,
                      mask.float() / mask.numel(), RowIndex.first_steps(rows))


def lora_actor(lora: LoraConfig = LORA, build=None, ds: DeepSpeedConfig | None = None) -> Actor:
    init_distributed()
    torch.manual_seed(0)
    build = build or (lambda zero3: build_policy(CFG, TOK, zero3))
    return Actor(build, ds or DeepSpeedConfig(zero_stage=3), AlgoConfig(micro_batches=1, lr=1e-2), scorer=OFTScorer(),
                 lora=lora)


def raw(actor: Actor, only=None) -> dict[str, torch.Tensor]:
    return {n: t.clone() for b in gathered_buckets(actor.policy, 1, only=only or (lambda _: True)) for n, t in b}


def test_adapters_start_at_the_base_and_are_all_that_trains():
    torch.manual_seed(0)
    policy = build_policy(CFG, TOK).eval()
    x = batch(0).inputs.on("cpu")
    with torch.no_grad():
        before = policy(x)
    adapted = add_adapters(policy, LORA)
    with torch.no_grad():
        assert torch.equal(policy(x), before)  # B = 0
    assert "language_model.lm_head" not in adapted and "language_model.model.layers.0.self_attn.q_proj" in adapted
    assert any(name.startswith("vision_backbone.") for name in adapted)  # all-linear: the towers too
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable == {f"{m}.lora_{ab}.weight" for m in adapted for ab in "AB"}
    only_q = add_adapters(build_policy(CFG, TOK), LoraConfig(rank=2, target_modules=["q_proj"]))
    assert only_q == [f"language_model.model.layers.{i}.self_attn.q_proj" for i in range(CFG.num_layers)]


def test_the_merged_weight_computes_the_adapted_layer():
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8)
    holder = torch.nn.Sequential(layer)
    add_adapters(holder, LoraConfig(rank=3, alpha=6.0))
    assert isinstance(layer, LoRALinear)
    torch.nn.init.normal_(layer.lora_B.weight)
    x = torch.randn(5, 16)
    merged = dict(served([(n, p.detach()) for n, p in holder.named_parameters()], 2.0))
    assert set(merged) == {"0.weight", "0.bias"}
    assert torch.allclose(layer(x), torch.nn.functional.linear(x, merged["0.weight"], merged["0.bias"]), atol=1e-5)


def test_the_actor_trains_adapters_only_and_the_engine_receives_the_merged_weights():
    actor = lora_actor()
    base = raw(actor, lambda n: not is_adapter(n))
    actor.update(UpdatePlan((MiniBatch((batch(1),)),)))
    actor.update(UpdatePlan((MiniBatch((batch(2),)),)))
    after = raw(actor)
    assert all(torch.equal(after[n], t) for n, t in base.items())  # the base is frozen
    assert any(after[n].abs().sum() > 0 for n in after if n.endswith("lora_B.weight"))  # the adapters moved
    engine = RolloutEngine(build_policy(CFG, TOK), decoder=OFTDecoder())
    report = sync_weights(actor.policy, engine, 1, bucket_mb=0.01)  # small buckets: modules must stay whole
    assert report.checksum == engine.checksum() and set(engine.weights) == set(base)
    served = dict(p for b in gathered_buckets(actor.policy, 1) for p in b)
    assert not any(is_adapter(n) for n in served)
    x = batch(3).inputs.on("cpu")
    with torch.no_grad():
        assert torch.allclose(engine.policy(x), actor.policy(x), atol=1e-4)  # merged vs unmerged: float rounding


def test_lora_trains_alike_under_the_7b_settings():
    """Whole layers fetched at once (leaf modules), their activations recomputed, small parameters kept whole (the
    zero3_bf16 settings): ZeRO-3 must still gather the frozen weights for the backward pass through them."""
    plain = lora_actor().update(UpdatePlan((MiniBatch((batch(1),)),))).metrics()
    tuned = lora_actor(ds=DeepSpeedConfig(zero_stage=3, leaf_modules=True, activation_checkpointing=True,
                                          param_persistence_threshold=5_000_000)).update(UpdatePlan((MiniBatch((batch(1),)),))).metrics()
    for key in ("policy_loss", "grad_norm"):
        assert tuned[key] == pytest.approx(plain[key], rel=1e-5), key


def test_adapters_round_trip_through_the_peft_layout_and_merge_into_the_base(tmp_path):
    """A base folder, a LoRA actor started from it, its adapters written; the base plus `model.lora.path` is the
    actor's merged policy bit for bit."""
    torch.manual_seed(0)
    vla = fresh_vla(ModelConfig(**{**vars(CFG), "proprio_dim": 4}), instructions())
    vla.save_pretrained(str(tmp_path / "base"))
    base = vla_for_env(ModelConfig(checkpoint=str(tmp_path / "base")), EnvConfig())
    actor = lora_actor(build=base.new_policy)
    actor.update(UpdatePlan((MiniBatch((batch(1),)),)))
    write_adapters(str(tmp_path / "adapters"), raw(actor, is_adapter), LORA, str(tmp_path / "base"))
    config = json.loads((tmp_path / "adapters" / ADAPTER_CONFIG).read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8.0 and config["peft_type"] == "LORA"
    pairs, scale = read_adapters(str(tmp_path / "adapters"))
    assert scale == 2.0 and len(pairs) == len(actor.adapted)
    merged = vla_for_env(ModelConfig(checkpoint=str(tmp_path / "base"),
                                               lora=LoraConfig(path=str(tmp_path / "adapters"))), EnvConfig())
    served = [(n, t.clone()) for b in gathered_buckets(actor.policy, 1) for n, t in b]
    assert weights_checksum(served) == weights_checksum(list(merged.policy.state_dict().items()))
    assert "adapters" in merged.source


def test_bad_lora_settings_and_folders_are_refused_by_name(tmp_path, tiny_config):
    cfg = tiny_config("model.lora.rank=4", "model.lora.target_modules=[q_proj,attn_out]")
    with pytest.raises(ConfigError, match=r"model.lora.target_modules: \['attn_out'\]"):
        validate(cfg)
    with pytest.raises(ConfigError, match="has no adapter_config.json"):
        validate(tiny_config(f"model.lora.path={tmp_path}"))
    (tmp_path / ADAPTER_CONFIG).write_text("{}")
    with pytest.raises(ValueError, match="not a readable adapter folder"):
        read_adapters(str(tmp_path))
    policy = build_policy(CFG, TOK)
    q = "language_model.model.layers.0.self_attn.q_proj"
    wrong = {f"{q}.lora_A.weight": torch.ones(2, 9), f"{q}.lora_B.weight": torch.ones(32, 2)}
    write_adapters(str(tmp_path / "other"), wrong, LoraConfig(rank=2))
    with pytest.raises(ValueError, match="is 32x9, the layer"):
        merge_adapters(policy, str(tmp_path / "other"))
