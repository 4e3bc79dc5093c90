"""Colocated memory options of the actor (ZeRO-3 on CPU here) and the rollout engine: same training, less held."""

import numpy as np
import pytest
import torch
from transformers.models.llama.modeling_llama import LlamaDecoderLayer

from vla_scale.batches import MicroBatch, MiniBatch, RowIndex, UpdatePlan
from vla_scale.config import AlgoConfig, DeepSpeedConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTDecoder, OFTScorer
from vla_scale.models.oft.vision import Block
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.parallel.actor import Actor
from vla_scale.parallel.actor.optimizer_states import OptimizerStates
from vla_scale.parallel.sync.weight_sync import gathered_buckets, sync_weights
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy, spec_from_model_config
from vla_scale.run_setup import init_distributed
from vla_scale.tensors.checksum import weights_checksum

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOK = WordTokenizer.from_instructions(instructions())
SPEC = spec_from_model_config(CFG, TOK.vocab_size, TOK.eos_id)


def _prepared(seed: int):
    """Four examples as an update holds them (images uint8, at the towers' size already)."""
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (4, 1, 32, 32, 3), dtype=np.uint8)
    proprio = rng.uniform(-1, 1, (4, CFG.proprio_dim)).astype(np.float32)
    return Processor.for_spec(SPEC, TOK).encode(images, [instructions()[seed % 3]] * 4, proprio)


def _batch(seed: int):
    return _prepared(seed).on("cpu")


def _micro_batches(seed: int):
    rng = np.random.default_rng(seed)
    k = CFG.chunk_len * 7
    tokens = torch.from_numpy(rng.integers(0, 256, (4, k)))
    mask = torch.ones(4, k, dtype=torch.bool)
    return [MicroBatch(_prepared(seed), tokens, torch.full((4, k), -5.5), torch.tensor([1.0, -1.0, 0.5, -0.5]), mask,
                       mask.float() / mask.numel(), RowIndex.first_steps(4))]


def _train(ds: DeepSpeedConfig, offload_between_updates: bool = False) -> tuple[list[dict], str, Actor]:
    init_distributed()
    torch.manual_seed(0)
    actor = Actor(lambda zero3: build_policy(CFG, TOK, zero3), ds, AlgoConfig(micro_batches=1), scorer=OFTScorer())
    stats = []
    for step in range(3):
        actor.reload_states()
        stats.append(actor.update(UpdatePlan((MiniBatch(tuple(_micro_batches(step))),))).metrics())
        if offload_between_updates:
            actor.offload_states()
    full = weights_checksum([(n, t.clone()) for b in gathered_buckets(actor.policy, 1) for n, t in b])
    return stats, full, actor


@pytest.fixture(scope="module")
def reference():
    stats, full, _ = _train(DeepSpeedConfig(zero_stage=3))
    return stats, full


def test_offloaded_optimizer_states_train_exactly_as_resident_ones(reference):
    stats, full, actor = _train(DeepSpeedConfig(zero_stage=3), offload_between_updates=True)
    assert actor.states_offloaded
    assert actor._state_holder is not None
    held = {t.data_ptr() for t in actor._state_holder.host.values()}
    inner = actor.engine.optimizer.optimizer
    moments = [v for state in inner.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    masters = list(actor.engine.optimizer.fp32_partitioned_groups_flat)
    assert moments and all(t.data_ptr() in held for t in moments + masters)  # they live in the host buffers now
    assert (stats, full) == reference


def test_streamed_optimizer_states_train_exactly_as_resident_ones():
    """States kept on the host and fetched one sub-group at a time for the step: the same weights bit for bit as with
    the states resident (the same sub-groups), the states in the host buffers after every step, never all back."""
    ds = DeepSpeedConfig(zero_stage=3, sub_group_size=20_000)
    resident_stats, resident, _ = _train(ds)
    stats, full, actor = _train(DeepSpeedConfig(**{**vars(ds), "stream_optimizer_states": True}))
    holder = actor._state_holder
    assert holder is not None and len(holder.masters) > 2  # several sub-groups, each moved on its own
    held = {t.data_ptr() for t in holder.host.values()}
    moments = [v for state in holder.inner.state.values() for v in state.values() if torch.is_tensor(v) and v.dim()]
    assert len(moments) == 2 * len(holder.masters) and all(t.data_ptr() in held for t in moments + holder.masters)
    actor.reload_states()  # a no-op: streamed states stay on the host
    assert all(t.data_ptr() in held for t in holder.masters)
    assert (stats, full) == (resident_stats, resident)


def test_resident_sub_groups_stay_and_the_others_stream(monkeypatch):
    """`deepspeed.resident_sub_groups`: the last sub-groups' states are never sent back to the host, the others are
    after each step, and the weights are those of states resident throughout."""
    ds = DeepSpeedConfig(zero_stage=3, sub_group_size=20_000)
    _, resident, _ = _train(ds)
    sent: list[int] = []
    offload = OptimizerStates.offload

    def recording(self, groups=None, wait=True):
        sent.extend(groups or [])
        return offload(self, groups, wait)

    monkeypatch.setattr(OptimizerStates, "offload", recording)
    _, full, actor = _train(DeepSpeedConfig(**{**vars(ds), "stream_optimizer_states": True,
                                                "resident_sub_groups": 2}))
    count = len(actor._state_holder.masters)
    assert count > 3 and full == resident
    assert sorted(set(sent)) == list(range(count - 2))  # the last two stay
    assert len(sent) == 3 * (count - 2)  # each streamed sub-group once a step


def test_streamed_states_save_and_resume_where_they_were(tmp_path):
    """A checkpoint of streamed states, loaded into a fresh actor, continues as the uninterrupted actor does; the
    loaded states are back in the host buffers."""
    ds = DeepSpeedConfig(zero_stage=3, sub_group_size=20_000, stream_optimizer_states=True)

    def new_actor() -> Actor:
        init_distributed()
        torch.manual_seed(0)
        return Actor(lambda zero3: build_policy(CFG, TOK, zero3), ds, AlgoConfig(micro_batches=1), scorer=OFTScorer())

    first = new_actor()
    first.update(UpdatePlan((MiniBatch(tuple(_micro_batches(0))),)))
    first.save(str(tmp_path), "step_1", {})
    first.update(UpdatePlan((MiniBatch(tuple(_micro_batches(1))),)))
    resumed = new_actor()
    resumed.load(str(tmp_path), "step_1")
    assert resumed._state_holder is not None
    held = {t.data_ptr() for t in resumed._state_holder.host.values()}
    assert all(t.data_ptr() in held for t in resumed._state_holder.masters)
    resumed.update(UpdatePlan((MiniBatch(tuple(_micro_batches(1))),)))
    checksum = [weights_checksum([(n, t.clone()) for b in gathered_buckets(a.policy, 1) for n, t in b])
                for a in (first, resumed)]
    assert checksum[0] == checksum[1]


def test_activation_checkpointing_recomputes_and_trains_the_same(reference):
    stats, full, actor = _train(DeepSpeedConfig(zero_stage=3, activation_checkpointing=True))
    lm = actor.policy.language_model  # transformers 5.17 names it is_gradient_checkpointing
    assert getattr(lm, "is_activation_checkpointing", None) or lm.is_gradient_checkpointing
    assert actor.policy.vision_backbone.featurizer.checkpointing
    assert (stats, full) == reference


def test_only_the_first_layers_recompute_and_train_the_same(reference):
    """`deepspeed.recompute_layers=1`: the first Llama layer runs its forward again in the backward pass, the second
    keeps its activations; the training is the same."""
    stats, full, actor = _train(DeepSpeedConfig(zero_stage=3, activation_checkpointing=True, recompute_layers=1))
    layers = actor.policy.language_model.model.layers
    assert [layer.gradient_checkpointing for layer in layers] == [True, False]
    assert (stats, full) == reference
    calls = {0: 0, 1: 0}
    for index, layer in enumerate(layers):
        layer.mlp.register_forward_pre_hook(lambda *_, i=index: calls.__setitem__(i, calls[i] + 1))
    actor.update(UpdatePlan((MiniBatch(tuple(_micro_batches(5))),)))
    assert calls == {0: 2, 1: 1}
    actor.configure(DeepSpeedConfig(zero_stage=3, activation_checkpointing=True), actor.algo)  # -1: every layer
    assert all(layer.gradient_checkpointing for layer in layers)


def test_vision_blocks_recompute_in_the_backward_pass():
    torch.manual_seed(0)
    policy = build_policy(CFG, TOK)
    calls = []
    block = policy.vision_backbone.featurizer.blocks[0]
    forward = block.forward
    block.forward = lambda x, language: calls.append(1) or forward(x, language)
    policy(_batch(0)).sum().backward()
    assert len(calls) == 1
    policy.vision_backbone.checkpointing_enable()
    policy(_batch(0)).sum().backward()
    assert len(calls) == 3  # forward, then again in the backward pass


def test_leaf_modules_fetch_whole_blocks_and_train_alike(reference):
    """The same training to float rounding (not bit for bit)."""
    stats, _, actor = _train(DeepSpeedConfig(zero_stage=3, leaf_modules=True, activation_checkpointing=True))
    leaves = {id(m) for m in actor.policy.modules() if getattr(m, "_z3_leaf", False)}
    blocks = {id(m) for m in actor.policy.modules() if isinstance(m, (Block, LlamaDecoderLayer))}
    assert len(blocks) == CFG.num_layers + CFG.vision_layers and leaves == blocks
    for ours, theirs in zip(stats, reference[0], strict=True):
        assert ours == pytest.approx(theirs, rel=1e-5, abs=1e-7)


def test_offloaded_parameters_train_the_same(reference):
    assert _train(DeepSpeedConfig(zero_stage=3, offload_param=True))[:2] == reference


def test_released_engine_refuses_to_decode_until_a_sync_refills_it():
    init_distributed()
    torch.manual_seed(0)
    actor = Actor(lambda zero3: build_policy(CFG, TOK, zero3), DeepSpeedConfig(zero_stage=3),
                  AlgoConfig(micro_batches=1), scorer=OFTScorer())
    engine = RolloutEngine(build_policy(CFG, TOK), decoder=OFTDecoder())
    sync_weights(actor.policy, engine, 1, bucket_mb=1)
    before = engine.decode(_batch(0), temperature=1.0, greedy=True)
    engine.release_memory_occupation()
    assert sum(p.numel() for p in engine.policy.parameters()) == 0
    with pytest.raises(RuntimeError, match="holds no weights"):
        engine.decode(_batch(0), temperature=1.0, greedy=True)
    engine.resume_memory_occupation()
    with pytest.raises(RuntimeError, match="sync them"):
        engine.decode(_batch(0), temperature=1.0, greedy=True)
    sync_weights(actor.policy, engine, 2, bucket_mb=1)
    after = engine.decode(_batch(0), temperature=1.0, greedy=True)
    assert np.array_equal(before.tokens, after.tokens) and after.version == 2


def test_zero_stages_0_and_2_train_alike():
    """(ZeRO-3 builds its weights under zero.Init, so only these two start from the same ones.)"""
    plain, _, _ = _train(DeepSpeedConfig(zero_stage=0))
    sharded, _, _ = _train(DeepSpeedConfig(zero_stage=2))
    for a, b in zip(plain, sharded, strict=True):
        assert a["policy_loss"] == pytest.approx(b["policy_loss"], rel=1e-4, abs=1e-7)
