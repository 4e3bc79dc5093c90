"""π0 / π0.5 denoising chains with log-probs (Flow-SDE) on the tiny shapes: noise level 0 is `sample_actions` bit for
bit, `chain_logprobs` recomputes `sample_chain`'s log-probs in one batched pass (all steps, one step per chain,
masked), gradients reach the policy, and maximising a chain's log-prob raises it."""

from __future__ import annotations

import pytest
import torch

from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
from vla_scale.models.pi0.spec import tiny_spec
from vla_scale.objectives.flow_sde import action_mask, chain_logprob, euler_times, sde_transition

B, K = 3, 5


def policy(pi05: bool, seed: int = 0) -> Pi0Policy:
    """A tiny policy with every parameter drawn at random (adaRMS maps and gates included)."""
    torch.manual_seed(seed)
    p = Pi0Policy.from_spec(tiny_spec(pi05, num_steps=K)).eval()
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


@pytest.fixture(scope="module", params=[False, True], ids=["pi0", "pi05"])
def case(request):
    p = policy(request.param)
    x = inputs(p)
    noise = p.sample_noise(B, generator=torch.Generator().manual_seed(2))
    return p, x, noise


def test_noise_level_zero_is_sample_actions_bit_for_bit(case):
    p, x, noise = case
    chain = p.sample_chain(x, noise, 0.0, generator=torch.Generator().manual_seed(3))
    assert torch.equal(chain.actions, p.sample_actions(x, noise))
    assert chain.chain.shape == (B, K + 1, p.spec.action_horizon, p.spec.action_dim)
    assert chain.chain.dtype == torch.float32
    assert torch.equal(chain.chain[:, 0], noise) and torch.equal(chain.chain[:, -1], chain.actions)
    assert torch.equal(chain.logprobs, torch.zeros(B, K))


def test_each_step_is_its_gaussian_transition_drawn_from_the_step_noise(case):
    p, x, noise = case
    g = torch.Generator().manual_seed(4)
    step_noise = torch.randn(B, K, *noise.shape[1:], generator=g)
    chain = p.sample_chain(x, noise, 0.5, step_noise=step_noise)
    again = p.sample_chain(x, noise, 0.5, generator=torch.Generator().manual_seed(4))
    assert torch.equal(chain.chain, again.chain) and torch.equal(chain.logprobs, again.logprobs)
    times, dt = euler_times(K)
    with torch.no_grad():
        cache, pad = p.prefix_cache(x)
        v = p.denoise_step(x.state, pad, cache, chain.chain[:, 2], times[2].expand(B))
    mean, std = sde_transition(chain.chain[:, 2], v, times[2], dt, 0.5)
    assert torch.allclose((chain.chain[:, 3] - mean) / std, step_noise[:, 2], atol=1e-4)
    assert not torch.equal(chain.actions, p.sample_actions(x, noise))


def test_chain_logprobs_recompute_sample_chains(case):
    p, x, noise = case
    mask = action_mask(p.spec.action_horizon, p.spec.action_dim, 7, executed=torch.tensor([4, 2, 3]))
    chain = p.sample_chain(x, noise, 0.5, generator=torch.Generator().manual_seed(5), mask=mask)
    with torch.no_grad():
        recomputed = p.chain_logprobs(x, chain.chain, 0.5, mask=mask)
    assert torch.all(chain.logprobs != 0)
    assert torch.allclose(recomputed, chain.logprobs, rtol=1e-5, atol=1e-4), (recomputed - chain.logprobs).abs().max()


def test_one_stochastic_step_per_chain_and_the_rest_euler(case):
    """πRL's mixed sampling: one random step of each chain is a transition; only those rows are recomputed."""
    p, x, noise = case
    stochastic = torch.zeros(B, K, dtype=torch.bool)
    stochastic[torch.arange(B), torch.tensor([0, 3, K - 1])] = True
    chain = p.sample_chain(x, noise, 0.5, generator=torch.Generator().manual_seed(6), stochastic=stochastic)
    assert torch.equal(chain.stochastic, stochastic) and torch.equal(chain.logprobs != 0, stochastic)
    with torch.no_grad():
        recomputed = p.chain_logprobs(x, chain.chain, 0.5, stochastic=stochastic)
    assert torch.allclose(recomputed, chain.logprobs, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="stochastic"):
        p.chain_logprobs(x, chain.chain, 0.5, stochastic=stochastic[:, :2])


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_gradients_reach_the_expert_the_backbone_and_the_tower(pi05):
    p = policy(pi05)
    x = inputs(p)
    chain = p.sample_chain(x, p.sample_noise(B, generator=torch.Generator().manual_seed(7)), 0.5,
                           generator=torch.Generator().manual_seed(8))
    chain_logprob(p.chain_logprobs(x, chain.chain, 0.5)).sum().backward()
    for name in ("action_out_proj.weight", "action_in_proj.weight",
                 "paligemma_with_expert.gemma_expert.model.layers.0.self_attn.q_proj.weight",
                 "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.k_proj.weight",
                 "paligemma_with_expert.paligemma.model.multi_modal_projector.linear.weight"):
        grad = p.get_parameter(name).grad
        assert grad is not None and grad.abs().sum() > 0, name


@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_maximising_a_chains_logprob_raises_it(pi05):
    """At sampling time a step's log-prob depends only on its draw ((x - mean) / std is the step noise); the policy
    moves it by moving the means towards the stored chain."""
    p = policy(pi05)
    x = inputs(p)
    chain = p.sample_chain(x, p.sample_noise(B, generator=torch.Generator().manual_seed(9)), 0.5,
                           generator=torch.Generator().manual_seed(10))
    optimizer = torch.optim.Adam(p.parameters(), lr=1e-3)
    before = chain_logprob(chain.logprobs).sum().item()
    for _ in range(5):
        optimizer.zero_grad()
        loss = -chain_logprob(p.chain_logprobs(x, chain.chain, 0.5)).sum()
        loss.backward()
        optimizer.step()
    with torch.no_grad():
        after = chain_logprob(p.chain_logprobs(x, chain.chain, 0.5)).sum().item()
    assert after > before + 10.0, (before, after)


def test_a_noise_level_per_example(case):
    """A level per example (an annealed or per-task one); level 0 makes that example's chain the Euler chain."""
    p, x, noise = case
    levels = torch.tensor([0.3, 0.0, 0.8])
    chain = p.sample_chain(x, noise, levels, generator=torch.Generator().manual_seed(11))
    assert torch.equal(chain.actions[1], p.sample_actions(x, noise)[1])
    assert torch.equal(chain.logprobs[1], torch.zeros(K)) and torch.all(chain.logprobs[[0, 2]] != 0)
    with torch.no_grad():
        recomputed = p.chain_logprobs(x, chain.chain, levels)
    assert torch.allclose(recomputed, chain.logprobs, rtol=1e-5, atol=1e-4)
