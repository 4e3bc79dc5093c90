"""The engine's fast path (`models/oft/fast_forward.py`) decodes what the plain fp32 path decodes (CPU, tiny sizes).

Greedy tokens equal, sampled tokens equal under the same generator seed, log-probs and logits equal to float32
rounding (the L1 head's Gaussian: its mean, samples and log-probs to float32 rounding); covered: our own tower and
learned action queries (both attention modes), and the official layout with fused DINOv2-like + SigLIP-like towers
(layer scale, registers, tanh GELU), grouped-query attention, proprio and two images per example, with prompts of
different lengths in one batch (several packed groups) and of one length (one group), before and after a weight
sync, each with the token head and the L1 head. The packing's index arithmetic is checked on its own; the towers on
two CUDA streams only where a GPU is (marked `gpu`).
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from vla_scale.config import ModelConfig
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.oft import OFTPolicy, Processor
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.oft.fast_forward import Packing, pack_index
from vla_scale.models.oft.processor import PolicyInputs
from vla_scale.models.oft.spec import spec_from_openvla
from vla_scale.models.oft.vision import ViTSpec
from vla_scale.models.tokenizer import WordTokenizer
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.run_policy import build_policy

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4, ordinal_bin_init=1.0, max_text_len=40)
TEXTS = ["reach the red block", "pick up the black bowl next to the cookie box and place it on the plate",
         "open the drawer"]


def strong_film(policy: OFTPolicy) -> OFTPolicy:
    """FiLM projections far from their small init, so what the prompt does to the towers shows in the logits."""
    with torch.no_grad():
        for name, param in policy.vision_backbone.named_parameters():
            if ".scale." in name or ".shift." in name:
                param.uniform_(-3.0, 3.0)
    return policy


def tiny_case(attention: str, head: str = "tokens", film: bool = False) -> tuple[OFTPolicy, PolicyInputs]:
    cfg = ModelConfig(**{**vars(CFG), "attention": attention, "action_head": head, "use_film": film})
    tok = WordTokenizer.from_instructions(instructions() + TEXTS)
    torch.manual_seed(0)
    policy = strong_film(build_policy(cfg, tok))
    rng = np.random.default_rng(0)
    obs = [Observation({"agentview": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)},
                       rng.normal(size=4).astype(np.float32), TEXTS[i % 3]) for i in range(5)]
    return policy, Processor.for_spec(policy.spec, tok, max_text_len=cfg.max_text_len)(obs)


def official_case(head: str = "tokens", film: bool = False) -> tuple[OFTPolicy, PolicyInputs]:
    config = {"model_type": "openvla", "timm_model_ids": ["vit_tiny_patch16_224", "vit_small_patch16_224"],
              "image_sizes": [32, 32], "use_fused_vision_backbone": True, "n_action_bins": 256,
              "pad_to_multiple_of": 64, "pad_token_id": 512,
              "text_config": {"model_type": "llama", "vocab_size": 576, "hidden_size": 48, "intermediate_size": 96,
                              "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2}}
    spec = spec_from_openvla(config, proprio_dim=8, chunk_len=2, action_dim=7, normalization="bounds_q99",
                             action_head=head)
    dino = ViTSpec(image_size=32, patch_size=16, embed_dim=32, depth=3, num_heads=2, layer_scale=True, reg_tokens=2,
                   no_embed_class=True)
    siglip = ViTSpec(image_size=32, patch_size=16, embed_dim=48, depth=3, num_heads=2, class_token=False,
                     map_head=True, act="gelu_tanh")
    torch.manual_seed(1)
    policy = strong_film(OFTPolicy(replace(spec, towers=[dino, siglip], use_film=film)))
    with torch.no_grad():  # layer scales far from their 1e-5 init, so the blocks matter
        for name, param in policy.vision_backbone.named_parameters():
            if name.endswith("scale_factor"):
                param.uniform_(0.5, 1.5)
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(3, 400, (4, 12), generator=g)
    ids[:, 0] = 1
    mask = torch.ones_like(ids, dtype=torch.bool)
    mask[0, 7:] = False
    mask[1, 11:] = False
    mask[2, 10:] = False
    mask[3, 9:] = False  # every prompt shorter than the padded width: trimming removes columns
    ids[~mask] = spec.pad_token_id
    pixels = torch.randn(4, 12, 32, 32, generator=g)
    return policy, PolicyInputs(pixels, ids, mask, torch.rand(4, 8, generator=g) * 2 - 1)


@pytest.fixture(scope="module", params=["tiny-bidirectional", "tiny-causal", "official-fused-gqa", "tiny-causal-l1",
                                        "official-fused-gqa-l1", "tiny-bidirectional-film", "official-fused-gqa-film"])
def engines(request):
    film = request.param.endswith("-film")
    name = request.param.removesuffix("-film")
    head = "l1" if name.endswith("-l1") else "tokens"
    name = name.removesuffix("-l1")
    policy, batch = official_case(head, film) if name.startswith("official") else tiny_case(name[5:], head, film)
    return (RolloutEngine(policy, seed=7, decoder=OFTDecoder()),
            RolloutEngine(policy, seed=7, fast=True, decoder=OFTDecoder()), batch)


def test_cpu_default_is_the_plain_path(engines):
    plain, fast, _ = engines
    assert plain.fast is None and not plain.pin_memory
    assert fast.fast is not None and not fast.fast.compiled


def test_fast_inputs_trim_the_shared_prompt_padding(engines):
    _, fast, batch = engines
    trimmed = fast.inputs(batch)
    longest = int(batch.attention_mask.sum(1).max())
    assert trimmed.input_ids.shape[1] == longest < batch.input_ids.shape[1]
    assert torch.equal(trimmed.input_ids, batch.input_ids[:, :longest])


def test_fast_logits_equal_plain_logits(engines):
    plain, fast, batch = engines
    with torch.no_grad():
        want = plain.logits(plain.inputs(batch))
        got = fast.logits(fast.inputs(batch))
    assert got.dtype == torch.float32 and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=2e-5)


@pytest.mark.parametrize("greedy", [True, False])
def test_fast_decode_gives_the_plain_tokens_log_probs_and_actions(engines, greedy):
    plain, fast, batch = engines
    plain.generator.manual_seed(11)
    fast.generator.manual_seed(11)
    want, got = plain.decode(batch, 1.6, greedy), fast.decode(batch, 1.6, greedy)
    if plain.policy.action_head is None:
        np.testing.assert_array_equal(got.tokens, want.tokens)
        np.testing.assert_array_equal(got.actions, want.actions)
    else:  # the Gaussian's values move with its mean, by float32 rounding; the same noise drawn
        np.testing.assert_allclose(got.tokens, want.tokens, rtol=0, atol=2e-5)
        np.testing.assert_allclose(got.actions, want.actions, rtol=0, atol=2e-5)
    np.testing.assert_allclose(got.logprobs, want.logprobs, rtol=0, atol=2e-5)



def test_packing_groups_rows_by_prompt_length():
    packing = Packing.of([5, 3, 5, 4, 3, 5])
    assert packing.groups == ((2, 3), (1, 4), (3, 5))
    assert packing.positions(10) == ((2, 13), (1, 14), (3, 15))


def test_pack_index_lists_each_rows_real_positions_in_length_order():
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(1, 9, (7,), generator=g)
    width = int(lengths.max()) + 2
    valid = torch.arange(width) < lengths[:, None]
    order, flat, positions, starts = pack_index(valid, int(lengths.sum()))
    assert torch.equal(lengths[order], lengths[order].sort().values)
    want = torch.cat([row * width + torch.arange(int(lengths[row])) for row in order.tolist()])
    assert torch.equal(flat, want)
    assert torch.equal(positions, want % width)
    assert torch.equal(starts, torch.cumsum(lengths[order], 0) - lengths[order])


@pytest.mark.parametrize("attention", ["bidirectional", "causal"])
def test_fast_logits_with_one_prompt_length_and_after_a_weight_sync(attention):
    """One run of equal-length rows (a single attention call), then new weights: the fast path reads them."""
    policy, batch = tiny_case(attention)
    batch = PolicyInputs(batch.pixel_values, batch.input_ids[:1].expand(5, -1).clone(),
                         batch.attention_mask[:1].expand(5, -1).clone(), batch.proprio)
    plain = RolloutEngine(policy, seed=7, decoder=OFTDecoder())
    fast = RolloutEngine(policy, seed=7, fast=True, decoder=OFTDecoder())
    g = torch.Generator().manual_seed(5)
    new = {name: p + 0.05 * torch.randn(p.shape, generator=g) for name, p in policy.named_parameters()}
    results = []
    for step in range(2):
        with torch.no_grad():
            want, got = plain.logits(plain.inputs(batch)), fast.logits(fast.inputs(batch))
        torch.testing.assert_close(got, want, rtol=0, atol=2e-5)
        results.append(got)
        plain.update_weights_from_tensor(new.items(), step + 1)
        fast.update_weights_from_tensor(new.items(), step + 1)
    assert (results[0] - results[1]).abs().max() > 1e-3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_towers_side_by_side_on_two_streams_give_the_one_stream_logits():
    policy, batch = official_case()
    engine = RolloutEngine(policy, "cuda", seed=7, fast=True, compile=False, decoder=OFTDecoder())
    x = engine.inputs(batch)
    with torch.no_grad():
        assert engine.fast is not None and engine.fast.side_by_side
        got = engine.logits(x)
        engine.fast.side_by_side = False
        want = engine.logits(x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_a_filmed_policy_compiled_on_the_gpu_gives_the_plain_logits():
    """FiLM's (gamma, beta) go through the compiled block function as tensors of their own."""
    policy, batch = official_case(film=True)
    plain = RolloutEngine(policy, "cuda", seed=7, fast=False, decoder=OFTDecoder())
    compiled = RolloutEngine(policy, "cuda", seed=7, fast=True, compile=True, decoder=OFTDecoder())
    with torch.no_grad():
        want = plain.logits(plain.inputs(batch))
        got = compiled.logits(compiled.inputs(batch))
        for name, param in policy.named_parameters():  # FiLM made the identity: what the towers give without it
            if ".scale." in name or ".shift." in name:
                param.zero_()
        identity = RolloutEngine(policy, "cuda", seed=7, fast=True, compile=True, decoder=OFTDecoder())
        without = identity.logits(identity.inputs(batch))
    error, effect = (got - want).abs().max().item(), (without - want).abs().max().item()
    print(f"compiled vs plain {error:.3g}, without FiLM {effect:.3g}")
    torch.testing.assert_close(got, want, rtol=0, atol=5e-2)  # the engine's dtype on both paths
    assert (without - want).abs().max() > 10 * (got - want).abs().max()  # FiLM shows in the logits


def test_the_engine_stacks_q_k_v_and_gate_up_weights_without_copies(engines):
    from vla_scale.models.oft.fast_forward import _llama_weights

    _, fast, _ = engines
    for layer in fast.policy.language_model.model.layers:
        w = _llama_weights(layer)
        assert w.qkv is not None and w.gate_up is not None
        assert w.qkv.data_ptr() == w.q.data_ptr() and torch.equal(w.qkv, torch.cat([w.q, w.k, w.v]))
        assert w.gate_up.data_ptr() == w.gate.data_ptr() and torch.equal(w.gate_up, torch.cat([w.gate, w.up]))


@pytest.mark.parametrize("fast", [False, True])
def test_an_unfilled_engine_decodes_only_once_a_sync_filled_it(fast):
    """An engine built on `OFTPolicy.unfilled` (no init, no checkpoint read) refuses to decode before a weight sync;
    after one it decodes what an engine built on the filled policy decodes, bit for bit."""
    policy, batch = tiny_case("causal")
    empty = RolloutEngine(OFTPolicy.unfilled(policy.spec), seed=7, fast=fast, filled=False, decoder=OFTDecoder())
    with pytest.raises(RuntimeError, match="holds no weights"):
        empty.decode(batch, temperature=1.0)
    empty.update_weights_from_tensor([(n, p.detach()) for n, p in policy.named_parameters()], 1)
    reference = RolloutEngine(policy, seed=7, fast=fast, decoder=OFTDecoder())
    got, want = empty.decode(batch, temperature=1.0), reference.decode(batch, temperature=1.0)
    assert np.array_equal(got.tokens, want.tokens) and np.array_equal(got.logprobs, want.logprobs)
    assert empty.checksum() == reference.checksum()
