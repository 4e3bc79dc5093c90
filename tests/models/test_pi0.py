"""π0 / π0.5 on tiny shapes, by our own checks (the parity with openpi's code is tests/models/test_pi0_parity.py):
the sequence and its mask, the prefix cache against the joint pass, the Euler chain, the flow-matching loss, openpi's
parameter names and the state_dict loader, the normalisation both ways, the two prompts, and the real shapes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from vla_scale.models.flow.normalize import FlowNormalizer, NormStats, read_norm_stats
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy, attention_allowed, time_embedding
from vla_scale.models.pi0.spec import GemmaSpec, check_spec, pi0_spec, spec_from_openpi, tiny_spec
from vla_scale.models.pi0.tokenizer import PaliGemmaTokenizer, discretize_state

B = 3


def policy(pi05: bool, seed: int = 0, **overrides) -> Pi0Policy:
    """A tiny policy with every parameter drawn at random (norms, adaRMS maps and gates included, so no branch is
    switched off by its init)."""
    torch.manual_seed(seed)
    p = Pi0Policy.from_spec(tiny_spec(pi05, **overrides)).eval()
    with torch.no_grad():
        for param in p.parameters():
            param.normal_(0.0, 0.2)
    return p


def inputs(p: Pi0Policy, seed: int = 1) -> Pi0Inputs:
    g = torch.Generator().manual_seed(seed)
    s = p.spec
    lengths = torch.tensor([3, s.max_token_len, 7])
    return Pi0Inputs(
        images=torch.rand(B, s.num_images, 3, s.vision.image_size, s.vision.image_size, generator=g) * 2 - 1,
        image_masks=torch.tensor([[True, True, False], [True, False, True], [True, True, True]]),
        tokens=torch.randint(1, s.vocab_size, (B, s.max_token_len), generator=g),
        token_masks=torch.arange(s.max_token_len)[None] < lengths[:, None],
        state=torch.randn(B, s.action_dim, generator=g),
    )


@pytest.mark.parametrize("pi05", [False, True])
def test_shapes_of_the_prefix_suffix_loss_and_actions(pi05):
    p = policy(pi05)
    x = inputs(p)
    s = p.spec
    prefix, pad, blocks = p.embed_prefix(x)
    assert prefix.shape == (B, s.prefix_len, s.paligemma.width) and pad.shape == blocks.shape == (B, s.prefix_len)
    assert pad.sum(dim=1).tolist() == [2 * 4 + 3, 2 * 4 + s.max_token_len, 3 * 4 + 7]
    noise = p.sample_noise(B, generator=torch.Generator().manual_seed(0))
    suffix, suffix_pad, suffix_blocks, cond = p.embed_suffix(x.state, noise, torch.full((B,), 0.5))
    assert suffix.shape == (B, s.suffix_len, s.expert.width)
    assert suffix_blocks[0].tolist() == ([] if pi05 else [True]) + [True] + [False] * (s.action_horizon - 1)
    assert (cond is not None) == pi05
    assert p.flow_loss(x, torch.randn_like(noise), noise, torch.full((B,), 0.5)).shape == noise.shape
    assert p.sample_actions(x, noise, num_steps=2).shape == (B, s.action_horizon, s.action_dim)


def test_the_mask_is_prefix_lm_with_a_state_block_and_pads_masked():
    """π0's layout on 2 image patches, 3 prompt slots (one a pad), a state token and 2 actions."""
    pad = torch.tensor([[1, 1, 1, 1, 0, 1, 1, 1]]).bool()
    blocks = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 0]])
    allowed = attention_allowed(pad, blocks)[0].int()
    expected = torch.tensor([
        [1, 1, 1, 1, 0, 0, 0, 0],  # prefix rows: the prefix's real tokens only
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [1, 1, 1, 1, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],  # a pad sees nothing
        [1, 1, 1, 1, 0, 1, 0, 0],  # the state: the prefix and itself
        [1, 1, 1, 1, 0, 1, 1, 1],  # actions: everything real
        [1, 1, 1, 1, 0, 1, 1, 1],
    ])
    assert torch.equal(allowed, expected)


@pytest.mark.parametrize("pi05", [False, True])
def test_masked_cameras_pads_and_the_suffix_do_not_reach_what_they_must_not(pi05):
    p = policy(pi05)
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    t = torch.full((B,), 0.3)
    base = p.velocity_joint(x, noise, t)
    changed = dataclasses.replace(x, images=x.images.clone(), tokens=x.tokens.clone())
    changed.images[0, 2] = -changed.images[0, 2]  # example 0's third camera is masked
    changed.tokens[0, 3:] = 5  # example 0's pads
    assert torch.equal(p.velocity_joint(changed, noise, t)[0], base[0])
    seen = dataclasses.replace(x, images=x.images.clone())
    seen.images[0, 0] = -seen.images[0, 0]  # a camera that is there
    assert not torch.allclose(p.velocity_joint(seen, noise, t)[0], base[0])
    # the prefix never reads the suffix: its cache is the same whatever the actions
    cache, _ = p.prefix_cache(x)
    other = p.embed_suffix(x.state, noise + 1, t)[0]
    assert other.shape[1] == p.spec.suffix_len and len(cache) == p.spec.paligemma.depth


@pytest.mark.parametrize("pi05", [False, True])
def test_the_prefix_cache_gives_the_joint_pass_velocity(pi05):
    p = policy(pi05)
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    cache, prefix_pad = p.prefix_cache(x)
    for t in (1.0, 0.6, 0.1):
        time = torch.full((B,), t)
        cached = p.denoise_step(x.state, prefix_pad, cache, noise, time)
        torch.testing.assert_close(cached, p.velocity_joint(x, noise, time), rtol=0, atol=1e-5)


@pytest.mark.parametrize("pi05", [False, True])
def test_sample_actions_is_k_euler_steps_from_noise_deterministic(pi05):
    p = policy(pi05)
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    k = 4
    actions = p.sample_actions(x, noise, num_steps=k)
    assert torch.equal(actions, p.sample_actions(x, noise, num_steps=k))
    x_t, dt = noise, torch.tensor(-1.0 / k)
    time = torch.tensor(1.0)
    with torch.no_grad():
        for _ in range(k):
            x_t = x_t + dt * p.velocity_joint(x, x_t, time.expand(B))
            time = time + dt
    torch.testing.assert_close(actions, x_t, rtol=0, atol=1e-5)
    assert not torch.allclose(actions, p.sample_actions(x, noise, num_steps=2))
    # the default count is the spec's
    assert torch.equal(p.sample_actions(x, noise), p.sample_actions(x, noise, num_steps=p.spec.num_steps))


@pytest.mark.parametrize("pi05", [False, True])
def test_sampling_leaves_out_a_slot_masked_in_every_row_and_computes_the_same(pi05):
    p = policy(pi05)
    x = inputs(p)
    x.image_masks[:, 2] = False  # LIBERO's two cameras in three slots
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    cache, pad = p.prefix_cache(x)
    assert pad.shape[1] == p.spec.prefix_len - p.spec.vision.num_patches and cache[0][0].shape[2] == pad.shape[1]
    x_t, dt, time = noise, torch.tensor(-0.5), torch.tensor(1.0)
    with torch.no_grad():
        for _ in range(2):  # the joint pass over every slot
            x_t = x_t + dt * p.velocity_joint(x, x_t, time.expand(B))
            time = time + dt
    torch.testing.assert_close(p.sample_actions(x, noise, num_steps=2), x_t, rtol=0, atol=1e-5)
    x.images[:, 2] = torch.rand_like(x.images[:, 2])  # what a masked slot holds does not matter
    torch.testing.assert_close(p.sample_actions(x, noise, num_steps=2), x_t, rtol=0, atol=1e-5)


@pytest.mark.parametrize("pi05", [False, True])
def test_activation_checkpointing_recomputes_the_joint_layers_and_trains_the_same(pi05):
    def gradients(recompute: int | None) -> tuple[dict[str, torch.Tensor], int]:
        p = policy(pi05).train()
        if recompute is not None:
            p.activation_checkpointing_enable()
            p.recompute_layers(recompute)
        runs = []
        joint = p.paligemma_with_expert
        layer = joint._layer
        joint._layer = lambda *args: runs.append(1) or layer(*args)
        x = inputs(p)
        noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim, generator=torch.Generator().manual_seed(2))
        p.flow_loss(x, torch.zeros_like(noise), noise, torch.full((B,), 0.5)).mean().backward()
        return {n: q.grad for n, q in p.named_parameters() if q.grad is not None}, len(runs)

    plain, runs = gradients(None)
    assert runs == 2  # two joint layers, once each
    for recompute, expected in ((-1, 4), (1, 3)):
        grads, runs = gradients(recompute)
        assert runs == expected and grads.keys() == plain.keys()
        for name, grad in grads.items():
            torch.testing.assert_close(grad, plain[name], rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.parametrize("pi05", [False, True])
def test_lora_adapts_the_towers_and_gemmas_trains_the_projections_whole_and_serves_merged(pi05):
    from vla_scale.config import LoraConfig
    from vla_scale.models.lora import add_adapters, is_adapter

    p = policy(pi05)
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    base = p.sample_actions(x, noise, num_steps=2)
    adapted = add_adapters(p, LoraConfig(rank=4))
    assert any(".gemma_expert." in n for n in adapted) and any(".vision_tower." in n for n in adapted)
    assert not any("lm_head" in n or n.startswith(("action_", "state_", "time_")) for n in adapted)
    trained = {n for n, q in p.named_parameters() if q.requires_grad}
    whole = {n for n in trained if not is_adapter(n)}
    assert whole and all(n.startswith(("action_in_proj", "action_out_proj", "state_proj", "action_time_mlp",
                                       "time_mlp")) for n in whole)
    torch.testing.assert_close(p.sample_actions(x, noise, num_steps=2), base, rtol=0, atol=0)  # B starts at 0
    with torch.no_grad():
        for name, q in p.named_parameters():
            if name.endswith("lora_B.weight"):
                q.normal_(0.0, 0.1)
    plain = Pi0Policy.from_spec(p.spec).eval()
    plain.load_state_dict(dict(p.served(list(p.state_dict().items()))))
    torch.testing.assert_close(plain.sample_actions(x, noise, num_steps=2), p.sample_actions(x, noise, num_steps=2),
                               rtol=1e-4, atol=1e-5)
    assert not torch.allclose(plain.sample_actions(x, noise, num_steps=2), base)


@pytest.mark.parametrize("pi05", [False, True])
def test_a_bfloat16_policy_samples_and_trains_in_its_dtype_and_gives_float32(pi05):
    """What DeepSpeed's bf16 engine and the GPU's rollout engine hold: every parameter in bfloat16."""
    p = policy(pi05)
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    exact = p.sample_actions(x, noise, num_steps=2)
    half = p.to(torch.bfloat16)
    actions = half.sample_actions(x, noise, num_steps=2)
    assert actions.dtype == torch.float32
    assert (actions - exact).abs().max() < 0.1 * exact.abs().max()  # bf16's rounding, not another computation
    loss = half.flow_loss(x, torch.randn_like(noise), noise, torch.full((B,), 0.5))
    assert loss.dtype == torch.float32 and torch.isfinite(loss).all()
    chain = half.sample_chain(x, noise, 0.5, num_steps=2)
    assert torch.isfinite(half.chain_logprobs(x, chain.chain, 0.5)).all()


@pytest.mark.parametrize("pi05", [False, True])
def test_the_loss_is_zero_where_the_velocity_is_right_and_trains_both_gemmas(pi05):
    p = policy(pi05)
    x = inputs(p)
    # values on a 1/64 grid, so that noise - actions = b holds exactly in float32
    noise = torch.round(torch.randn(B, p.spec.action_horizon, p.spec.action_dim) * 64) / 64
    time = torch.tensor([0.9, 0.5, 0.2])
    with torch.no_grad():  # the velocity head made a constant b: the loss vanishes exactly where noise - actions = b
        p.action_out_proj.weight.zero_()
        p.action_out_proj.bias.copy_(torch.round(p.action_out_proj.bias * 64) / 64)
        b = p.action_out_proj.bias.detach().clone()
    actions = noise - b
    loss = p.flow_loss(x, actions, noise, time)
    assert loss.abs().max().item() == 0
    loss.sum().backward()
    assert all(param.grad is None or param.grad.abs().max() == 0 for param in p.parameters())
    p.zero_grad()
    p = policy(pi05)
    loss = p.flow_loss(x, torch.randn_like(noise), noise, time)
    assert loss.min() >= 0 and loss.mean() > 0
    loss.mean().backward()
    grads = {n: q.grad for n, q in p.named_parameters() if q.requires_grad}
    for name in ("paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight",
                 "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
                 "paligemma_with_expert.gemma_expert.model.layers.1.mlp.down_proj.weight", "action_in_proj.weight"):
        assert grads[name] is not None and grads[name].abs().sum() > 0, name
    assert not p.paligemma_with_expert.gemma_expert.lm_head.weight.requires_grad  # never runs


def test_pi05_conditions_every_expert_norm_on_time_and_pi0_mixes_it_into_the_actions():
    for pi05 in (False, True):
        p = policy(pi05)
        x = inputs(p)
        noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
        early, late = (p.velocity_joint(x, noise, torch.full((B,), t)) for t in (0.9, 0.2))
        assert not torch.allclose(early, late)
    emb = time_embedding(torch.tensor([0.0, 1.0]), 8)
    assert torch.equal(emb[0], torch.tensor([0.0] * 4 + [1.0] * 4))


@pytest.mark.parametrize("pi05", [False, True])
def test_openpi_parameter_names_and_the_state_dict_loader(pi05):
    p = policy(pi05)
    keys = set(p.state_dict())
    expected = {
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings.patch_embedding.weight",
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.encoder.layers.1.self_attn.out_proj.bias",
        "paligemma_with_expert.paligemma.model.vision_tower.vision_model.post_layernorm.weight",
        "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight",
        "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight",
        "paligemma_with_expert.paligemma.model.language_model.layers.0.input_layernorm.weight",
        "paligemma_with_expert.paligemma.model.language_model.norm.weight",
        "paligemma_with_expert.paligemma.lm_head.weight",
        "paligemma_with_expert.gemma_expert.model.layers.1.mlp.gate_proj.weight",
        "paligemma_with_expert.gemma_expert.lm_head.weight",
        "action_in_proj.weight", "action_out_proj.bias",
    }
    norm = "paligemma_with_expert.gemma_expert.model.layers.0.post_attention_layernorm"
    if pi05:
        expected |= {"time_mlp_in.weight", "time_mlp_out.bias", f"{norm}.dense.weight",
                     "paligemma_with_expert.gemma_expert.model.norm.dense.bias"}
        assert "state_proj.weight" not in keys and f"{norm}.weight" not in keys
    else:
        expected |= {"state_proj.weight", "action_time_mlp_in.weight", "action_time_mlp_out.bias", f"{norm}.weight"}
    assert expected <= keys
    assert not any("gemma_expert.model.embed_tokens" in k or "vision_model.head" in k for k in keys)

    # what safetensors keeps of the tied pair (one name) loads whole, under LeRobot's prefix too
    saved = {f"model.{k}": v.clone() for k, v in p.state_dict().items()
             if k != "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"}
    other = policy(pi05, seed=5)
    other.load_openpi_state_dict(saved, prefix="model.")
    x = inputs(p)
    noise = torch.randn(B, p.spec.action_horizon, p.spec.action_dim)
    assert torch.equal(other.sample_actions(x, noise, 2), p.sample_actions(x, noise, 2))
    bad = {k.removeprefix("model."): v for k, v in saved.items() if "action_out_proj.bias" not in k}
    bad["action_head.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match="missing: action_out_proj.bias; unexpected: action_head.weight"):
        other.load_openpi_state_dict(bad)


def test_the_real_shapes_build_on_the_meta_device():
    for pi05 in (False, True):
        spec = pi0_spec(pi05)
        with torch.device("meta"):
            p = Pi0Policy(spec)
        shapes = {k: tuple(v.shape) for k, v in p.state_dict().items()}
        lm = "paligemma_with_expert.paligemma.model.language_model.layers.17"
        expert = "paligemma_with_expert.gemma_expert.model.layers.17"
        assert shapes[f"{lm}.self_attn.q_proj.weight"] == (2048, 2048)
        assert shapes[f"{lm}.self_attn.k_proj.weight"] == (256, 2048)
        assert shapes[f"{lm}.mlp.gate_proj.weight"] == (16384, 2048)
        assert shapes[f"{expert}.self_attn.q_proj.weight"] == (2048, 1024)
        assert shapes[f"{expert}.self_attn.o_proj.weight"] == (1024, 2048)
        assert shapes["paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"] == (2048, 1152)
        assert shapes["paligemma_with_expert.paligemma.model.vision_tower.vision_model.embeddings"
                      ".position_embedding.weight"] == (256, 1152)
        assert shapes["action_in_proj.weight"] == (1024, 32)
        assert spec.prefix_len == 3 * 256 + (200 if pi05 else 48) and spec.resolved_normalization == (
            "quantile" if pi05 else "zscore")
        # PaliGemma (SigLIP + Gemma 2B, head tied) + the 300M expert + its unused LM head
        billions = sum(v.numel() for v in p.parameters()) / 1e9
        assert 3.4 < billions < 3.8, billions


def test_the_config_json_openpis_conversion_writes():
    """openpi's JAX -> PyTorch conversion writes variants and sizes only; π0 or π0.5 is the caller's to say."""
    written = {"action_dim": 32, "action_horizon": 10, "paligemma_variant": "gemma_2b",
               "action_expert_variant": "gemma_300m_lora", "precision": "bfloat16"}
    spec = spec_from_openpi(written, pi05=True)
    assert spec == dataclasses.replace(pi0_spec(True), action_horizon=10)
    assert spec.state_in_prompt and not spec_from_openpi({**written, "discrete_state_input": False},
                                                         pi05=True).state_in_prompt
    assert spec_from_openpi(written).max_token_len == 48
    with pytest.raises(ValueError, match="paligemma_variant='gemma_7b'"):
        spec_from_openpi({**written, "paligemma_variant": "gemma_7b"})


def test_the_gemmas_must_agree_on_what_they_share():
    spec = tiny_spec()
    with pytest.raises(ValueError, match=r"depth \(2 vs 3\), num_heads \(8 vs 4\)"):
        check_spec(dataclasses.replace(spec, expert=GemmaSpec(32, 3, 64, 4, 1, 16)))


# ---- normalisation -------------------------------------------------------------------------------------------------
STATS = {"norm_stats": {
    "state": {"mean": [0.5, -1.0, 2.0], "std": [2.0, 0.5, 1.0], "q01": [-1.0, -3.0, 0.0], "q99": [3.0, 1.0, 4.0]},
    "actions": {"mean": [0.1, 0.2], "std": [0.3, 0.4], "q01": [-1.0, -0.5], "q99": [1.0, 0.5]},
}}


def test_normalisation_round_trips_both_ways_and_follows_openpi_edge_rules(tmp_path):
    import json

    (tmp_path / "norm_stats.json").write_text(json.dumps(STATS))
    stats = read_norm_stats(tmp_path)
    x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
    z = FlowNormalizer(stats, "zscore")
    q = FlowNormalizer(stats, "quantile")
    np.testing.assert_array_equal(z.normalize("state", x), (x - stats["state"].mean) / (stats["state"].std + 1e-6))
    expected_q = (x - np.array([-1.0, -3.0, 0.0])) / (np.array([4.0, 4.0, 4.0]) + 1e-6) * 2.0 - 1.0
    np.testing.assert_array_equal(q.normalize("state", x), expected_q)
    assert q.normalize("state", np.array([3.0, 1.0, 4.0]))[0] == pytest.approx(1.0, abs=1e-6)
    for norm in (z, q):
        np.testing.assert_allclose(norm.unnormalize("state", norm.normalize("state", x)), x, rtol=0, atol=1e-12)
    # a robot's 2 action dims among the model's 4: statistics cut when normalising, padding rules when not
    wide = np.ones((2, 4))
    np.testing.assert_array_equal(z.unnormalize("actions", wide)[:, 2:], np.full((2, 2), 1 + 1e-6))
    np.testing.assert_array_equal(q.unnormalize("actions", wide)[:, 2:], np.ones((2, 2)))
    assert z.normalize("state", x[:, :2]).shape == (5, 2)
    with pytest.raises(ValueError, match="q01 and q99"):
        FlowNormalizer({"state": NormStats.from_json({"mean": [0.0], "std": [1.0]})}, "quantile")
    with pytest.raises(KeyError, match="'velocity'"):
        z.normalize("velocity", x)


# ---- tokenizer -----------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sp_model(tmp_path_factory) -> str:
    """A small SentencePiece model trained here on task-like text (PaliGemma's is 4 MB and not in the repo)."""
    import sentencepiece

    folder = tmp_path_factory.mktemp("sp")
    words = ["pick", "up", "the", "black", "bowl", "and", "place", "it", "on", "plate", "Task", "State", "Action",
             "open", "drawer", "put", "cream", "cheese", "in", "basket"]
    rng = np.random.default_rng(0)
    lines = [" ".join(rng.choice(words, 8)) + f", State: {' '.join(map(str, rng.integers(-1, 256, 8)))};"
             for _ in range(400)]
    (folder / "corpus.txt").write_text("\n".join(lines))
    sentencepiece.SentencePieceTrainer.train(
        input=str(folder / "corpus.txt"), model_prefix=str(folder / "tok"), vocab_size=200, model_type="bpe",
        user_defined_symbols=["\n"], remove_extra_whitespaces=False, bos_id=2, eos_id=1, pad_id=0, unk_id=3)
    return str(folder / "tok.model")


def test_pi0_prompt_is_bos_text_then_newline_padded(sp_model):
    tok = PaliGemmaTokenizer(sp_model, max_len=24)
    ids, mask = tok.tokenize("  pick_up the black bowl\n")
    body = tok.processor.encode("pick up the black bowl", add_bos=True) + tok.processor.encode("\n")
    n = len(body)
    assert ids[:n].tolist() == body and ids[0] == 2 and not ids[n:].any()
    assert mask.tolist() == [True] * n + [False] * (24 - n) and ids.dtype == np.int64
    assert tok.processor.decode(ids[1:n].tolist()).rstrip(" \n") == "pick up the black bowl"


def test_pi05_prompt_carries_the_discretised_state(sp_model):
    tok = PaliGemmaTokenizer(sp_model, max_len=80)
    state = np.array([-1.0, -0.5, 0.0, 0.999, 1.5, -2.0])
    assert discretize_state(state).tolist() == [0, 64, 128, 255, 255, -1]
    ids, mask = tok.tokenize("put the cream cheese in the basket", state)
    text = tok.processor.decode(ids[mask].tolist())
    assert text == "Task: put the cream cheese in the basket, State: 0 64 128 255 255 -1;\nAction: "
    short, short_mask = PaliGemmaTokenizer(sp_model, max_len=5).tokenize("put the cream cheese in the basket", state)
    assert short.tolist() == ids[:5].tolist() and short_mask.all()


def test_a_file_that_is_not_sentencepiece_is_refused(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(ValueError, match="not a readable SentencePiece model"):
        PaliGemmaTokenizer(tmp_path / "tokenizer.json", 48)
