"""`model.kernels` where no GPU is: the default (eager) builds each family's policy exactly as it was built before the
key existed, and liger is refused in one line naming the fix before anything is built (the GPU parity of Liger's
layers: tests/models/test_liger_kernels.py, whose one exemption is checked here)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.datasets.episodes import Episode
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.kernels import KERNELS, kernels_problem, use_kernels
from vla_scale.models.oft.policy import OFTPolicy
from vla_scale.models.oft.statistics import dataset_statistics
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
from vla_scale.models.pi0.settings import Pi0ModelConfig
from vla_scale.models.pi0.spec import tiny_spec
from vla_scale.run_policy import vla_for_env

CFG = ModelConfig(image_size=32, patch_size=8, vision_dim=32, hidden_size=32, num_layers=2, num_heads=2,
                  intermediate_size=64, chunk_len=4)
TOKENIZER = str(Path(__file__).parents[1] / "fixtures" / "openpi_reference" / "tokenizer.model")
PI0 = replace(CFG, family="pi0", pi0=Pi0ModelConfig(preset="pi0_tiny", tokenizer=TOKENIZER,
                                                          max_token_len=24))
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")


def observations(n: int) -> list[Observation]:
    rng = np.random.default_rng(0)
    texts = instructions()
    return [Observation({"agentview": rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)},
                        rng.normal(size=4).astype(np.float32), texts[i % len(texts)]) for i in range(n)]


def same_modules_and_weights(built: torch.nn.Module, before: torch.nn.Module, values: bool = True) -> None:
    """The same module classes in the same tree, the same state_dict keys (and values)."""
    assert [type(m) for m in built.modules()] == [type(m) for m in before.modules()]
    want = before.state_dict()
    assert built.state_dict().keys() == want.keys()
    for name, tensor in built.state_dict().items():
        assert not values or torch.equal(tensor, want[name]), name


def test_the_default_builds_the_oft_policy_it_always_built():
    assert ModelConfig().kernels == "eager" and KERNELS[0] == "eager"
    vla = vla_for_env(CFG, EnvConfig())
    assert vla.kernels == "eager"
    torch.manual_seed(0)
    built = vla.new_policy().eval()
    torch.manual_seed(0)
    before = OFTPolicy.from_spec(vla.spec).eval()
    same_modules_and_weights(built, before)
    same_modules_and_weights(vla.unfilled_policy(), OFTPolicy.unfilled(vla.spec), values=False)
    batch = vla.processor(observations(3))
    with torch.no_grad():
        assert torch.equal(built(batch), before(batch))
    vla.kernels = "carried"  # what a run's source holds is what the sources made from it hold
    stats = dataset_statistics([np.linspace(-1, 1, 70).reshape(10, 7)], [np.ones((10, 4))])
    assert vla.with_statistics("demo", stats).kernels == "carried"


def test_the_default_builds_the_pi0_policy_it_always_built():
    source = vla_for_env(PI0, EnvConfig())
    assert source.kernels == "eager"
    source.kernels = "carried"
    episode = Episode("reach the red block", {"agentview": np.zeros((10, 32, 32, 3), np.uint8)},
                      np.ones((10, 4), np.float32), np.linspace(-1, 1, 70, dtype=np.float32).reshape(10, 7))
    assert source.with_demonstrations("demo", [episode]).kernels == "carried"
    source.kernels = "eager"
    torch.manual_seed(0)
    built = source.new_policy()
    torch.manual_seed(0)
    same_modules_and_weights(built, Pi0Policy.from_spec(source.spec))


def test_eager_leaves_a_module_alone_and_an_unknown_choice_is_refused():
    policy = torch.nn.Sequential(torch.nn.Linear(2, 2))
    assert use_kernels(policy, "eager") is policy and type(policy[0]) is torch.nn.Linear
    assert kernels_problem("eager") is None
    with pytest.raises(ValueError, match="model.kernels='triton': choose one of eager, liger"):
        use_kernels(policy, "triton")


@NO_GPU
@pytest.mark.parametrize("model", [CFG, PI0], ids=["oft", "pi0"])
def test_liger_is_refused_without_a_gpu_in_one_line_naming_the_fix(model):
    problem = kernels_problem("liger")
    assert problem == ("model.kernels=liger runs Liger Kernel's Triton kernels on a CUDA GPU and this machine has "
                       "none: set model.kernels=eager")
    with pytest.raises(ConfigError) as err:
        vla_for_env(replace(model, kernels="liger"), EnvConfig())
    assert str(err.value) == problem
    policy = vla_for_env(model, EnvConfig()).new_policy()
    kinds = [type(m) for m in policy.modules()]
    with pytest.raises(RuntimeError, match="set model.kernels=eager"):
        use_kernels(policy, "liger")
    assert [type(m) for m in policy.modules()] == kinds


def test_siglips_key_bias_gets_no_gradient_but_rounding():
    """The premise of the π0 parity test's exemption (tests/models/test_liger_kernels.py,
    ZERO_IN_EXACT_ARITHMETIC): a bias added to every key shifts a query's logits by one constant, which the softmax
    takes out, so its gradient is rounding, many orders below the model's largest."""
    torch.manual_seed(0)
    policy = Pi0Policy.from_spec(tiny_spec(False)).train()
    with torch.no_grad():
        for param in policy.parameters():
            param.normal_(0.0, 0.2)
    s, g = policy.spec, torch.Generator().manual_seed(1)
    batch = Pi0Inputs(
        images=torch.rand(2, s.num_images, 3, s.vision.image_size, s.vision.image_size, generator=g) * 2 - 1,
        image_masks=torch.ones(2, s.num_images, dtype=torch.bool),
        tokens=torch.randint(1, s.vocab_size, (2, s.max_token_len), generator=g),
        token_masks=torch.ones(2, s.max_token_len, dtype=torch.bool), state=torch.randn(2, s.action_dim, generator=g))
    noise, actions = (torch.randn(2, s.action_horizon, s.action_dim, generator=g) for _ in range(2))
    policy.flow_loss(batch, actions, noise, torch.tensor([0.3, 0.8])).sum().backward()
    grads = {name: p.grad.abs().max().item() for name, p in policy.named_parameters() if p.grad is not None}
    key_biases = {name: v for name, v in grads.items() if name.endswith(".self_attn.k_proj.bias")}
    assert key_biases and "vision" in next(iter(key_biases))
    assert max(key_biases.values()) < 1e-5 * max(grads.values()), key_biases
