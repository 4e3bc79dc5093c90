"""The tiny OFT-shaped policy, its tokenizers and the rollout engine (CPU)."""

import numpy as np
import pytest
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models import ActionTokenizer, Processor, WordTokenizer, build_policy
from vla_scale.rollout.engine import RolloutEngine

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
    return tok, Processor(CFG, tok), build_policy(CFG, tok)


def test_word_tokenizer_knows_every_instruction_word():
    tok = WordTokenizer.from_instructions(instructions())
    ids, mask = tok.encode(["In: What action should the robot take to reach the red block?\nOut:"], 24)
    assert ids[0, 0] == tok.bos_id and mask[0].sum() > 10
    assert tok.unk_id not in ids[0][mask[0]]
    with pytest.raises(ValueError, match="max_text_len"):
        tok.encode(["reach " * 30], 24)


def test_action_tokenizer_round_trip_within_half_a_bin():
    at = ActionTokenizer(256)
    actions = np.linspace(-1, 1, 1001)
    back = at.to_actions(at.to_bins(actions))
    assert np.abs(back - actions).max() <= 1 / 256 + 1e-6
    assert at.to_bins(np.array([-5.0, 5.0])).tolist() == [0, 255]


def test_action_logits_cover_the_whole_chunk_in_one_pass(parts):
    tok, proc, policy = parts
    logits = policy(proc(observations(3)))
    assert logits.shape == (3, CFG.chunk_len * CFG.action_dim, CFG.n_bins)
    assert policy.llm.config.vocab_size % CFG.pad_to_multiple_of == 0
    assert policy.action_token_begin == tok.vocab_size


def test_instruction_changes_the_action_distribution(parts):
    _, proc, policy = parts
    obs = observations(1)
    other = Observation(obs[0].images, obs[0].proprio, "reach the blue block")
    a, b = policy(proc(obs)), policy(proc([other]))
    assert not torch.allclose(a, b)


def test_engine_decodes_versioned_chunks_and_greedy_is_deterministic(parts):
    _, proc, policy = parts
    engine = RolloutEngine(policy, seed=1)
    engine.update_weights_from_tensor(list(policy.named_parameters()), version=7)
    batch = proc(observations(4))
    greedy1, greedy2 = engine.decode(batch, 1.6, greedy=True), engine.decode(batch, 1.6, greedy=True)
    np.testing.assert_array_equal(greedy1.tokens, greedy2.tokens)
    sampled = engine.decode(batch, 1.6)
    assert sampled.version == 7 and sampled.actions.shape == (4, CFG.chunk_len, CFG.action_dim)
    assert np.all(np.abs(sampled.actions) <= 1) and np.all(sampled.logprobs <= 0)
    logits = policy(batch) / 1.6
    expected = torch.log_softmax(logits, -1).gather(-1, torch.from_numpy(sampled.tokens)[..., None])[..., 0]
    np.testing.assert_allclose(sampled.logprobs, expected.detach().numpy(), rtol=1e-5, atol=1e-5)


def test_engine_rejects_unknown_or_misshaped_weights(parts):
    _, _, policy = parts
    engine = RolloutEngine(build_policy(CFG, WordTokenizer.from_instructions(instructions())))
    with pytest.raises(KeyError, match="does not have"):
        engine.update_weights_from_tensor([("nope.weight", torch.zeros(1))], 1)
    with pytest.raises(ValueError, match="shape mismatch"):
        engine.update_weights_from_tensor([("vision.positions", torch.zeros(1))], 1)
