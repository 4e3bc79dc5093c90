"""The OFT policy built from a ModelConfig (tiny sizes), its sequence layout, attention modes and the rollout engine."""

import numpy as np
import pytest
import torch

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.oft import Processor
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy, fresh_vla, vla_for_env

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=1, num_heads=2,
                  intermediate_size=64, chunk_len=4)


def observations(n: int, seed: int = 0) -> list[Observation]:
    rng = np.random.default_rng(seed)
    texts = instructions()
    return [Observation({"agentview": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)},
                        rng.normal(size=4).astype(np.float32), texts[i % len(texts)]) for i in range(n)]


@pytest.fixture(scope="module")
def parts():
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    policy = build_policy(CFG, tok)
    return tok, Processor.for_spec(policy.spec, tok), policy


def test_vocabulary_follows_the_openvla_layout(parts):
    tok, _, policy = parts
    spec = policy.spec
    vocab = policy.language_model.config.vocab_size
    assert vocab % CFG.pad_to_multiple_of == 0 and spec.text_vocab == vocab - CFG.pad_to_multiple_of
    assert tok.vocab_size <= policy.action_token_begin == spec.text_vocab - CFG.n_bins
    assert spec.stop_token_id == tok.eos_id and spec.pad_token_id == spec.text_vocab


def test_action_logits_cover_the_whole_chunk_in_one_pass(parts):
    _, proc, policy = parts
    logits = policy(proc(observations(3)))
    assert logits.shape == (3, CFG.chunk_len * CFG.action_dim, CFG.n_bins) and logits.dtype == torch.float32


def test_instruction_changes_the_action_distribution(parts):
    _, proc, policy = parts
    obs = observations(1)
    other = Observation(obs[0].images, obs[0].proprio, "reach the blue block")
    assert not torch.allclose(policy(proc(obs)), policy(proc([other])))


def test_padding_does_not_change_an_example(parts):
    tok, proc, policy = parts
    batch = proc(observations(3))
    short = Processor.for_spec(policy.spec, tok, max_text_len=40)(observations(3))
    torch.testing.assert_close(policy(batch), policy(short), rtol=0, atol=1e-5)
    alone = policy.action_logits(batch.pixel_values[:1], batch.input_ids[:1], batch.attention_mask[:1],
                                 batch.proprio[:1])
    torch.testing.assert_close(policy(batch)[:1], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_attention_mode_decides_whether_slots_see_later_slots(attention):
    """Bidirectional: every slot sees the stop token and all slots; causal: slot k sees only what precedes it."""
    tok = WordTokenizer.from_instructions(instructions())
    torch.manual_seed(0)
    policy = build_policy(ModelConfig(**{**vars(CFG), "attention": attention}), tok)
    batch = Processor.for_spec(policy.spec, tok)(observations(1))
    base = policy(batch)
    with torch.no_grad():
        policy.language_model.get_input_embeddings().weight[tok.eos_id] += 1.0
    moved = (policy(batch) - base).abs().amax(dim=-1)[0]
    assert bool((moved > 0).all()) if attention == "bidirectional" else bool((moved == 0).all())


def test_zero_action_embeddings_without_learned_queries():
    tok = WordTokenizer.from_instructions(instructions())
    policy = build_policy(ModelConfig(**{**vars(CFG), "learned_action_queries": False}), tok)
    assert policy.action_queries is None
    batch = Processor.for_spec(policy.spec, tok)(observations(2))
    prefix = policy.projector(policy.vision_backbone(batch.pixel_values))
    embeds, valid, rows = policy._sequence(prefix, batch.input_ids, batch.attention_mask)
    lengths = batch.attention_mask.sum(1)
    k = policy.num_action_tokens
    for b, n in enumerate(lengths.tolist()):
        start = prefix.shape[1] + n
        assert embeds[b, start : start + k].abs().sum() == 0
        assert valid[b].sum() == start + k + 1 and rows[b, 0] == start - 1


def test_engine_decodes_versioned_chunks_and_greedy_is_deterministic(parts):
    _, proc, policy = parts
    engine = RolloutEngine(policy, seed=1, decoder=OFTDecoder())
    engine.update_weights_from_tensor(list(policy.named_parameters()), version=7)
    batch = proc(observations(4))
    greedy1, greedy2 = engine.decode(batch, 1.6, greedy=True), engine.decode(batch, 1.6, greedy=True)
    np.testing.assert_array_equal(greedy1.tokens, greedy2.tokens)
    sampled = engine.decode(batch, 1.6)
    assert sampled.version == 7 and sampled.actions.shape == (4, CFG.chunk_len, CFG.action_dim)
    assert np.all(np.abs(sampled.actions) <= 1) and np.all(sampled.logprobs <= 0)


def test_engine_rejects_unknown_or_misshaped_weights():
    engine = RolloutEngine(build_policy(CFG, WordTokenizer.from_instructions(instructions())), decoder=OFTDecoder())
    with pytest.raises(KeyError, match="does not have"):
        engine.update_weights_from_tensor([("nope.weight", torch.zeros(1))], 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.update_weights_from_tensor([("vision_backbone.featurizer.pos_embed", torch.zeros(1))], 1)


def test_a_checkpoint_decides_its_architecture_and_must_fit_the_env(tmp_path):
    """With model.checkpoint the folder's config wins over the model group's sizes; a policy whose proprio or actions
    do not fit the env is refused before anything starts, naming the key."""
    fresh_vla(CFG, instructions()).save_pretrained(str(tmp_path / "reach"))
    asked = ModelConfig(**{**vars(CFG), "chunk_len": 8, "checkpoint": str(tmp_path / "reach")})
    loaded = vla_for_env(asked, EnvConfig()).new_policy()
    assert loaded.num_action_tokens == CFG.chunk_len * CFG.action_dim
    fresh_vla(ModelConfig(**{**vars(CFG), "proprio_dim": 8}), instructions()).save_pretrained(
        str(tmp_path / "libero"))
    with pytest.raises(ConfigError, match="model.proprio_dim=4"):
        vla_for_env(ModelConfig(checkpoint=str(tmp_path / "libero")), EnvConfig())
