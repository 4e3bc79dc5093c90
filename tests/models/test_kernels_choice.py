"""`model.kernels` where no GPU is: the default (eager) builds each family's policy exactly as it was built before the
key existed, and liger is refused in one line naming the fix before anything is built (the GPU parity of Liger's
layers: tests/models/test_liger_kernels.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_scale.config import ConfigError, EnvConfig, ModelConfig
from vla_scale.config.schema import Pi0ModelConfig
from vla_scale.datasets.episodes import Episode
from vla_scale.envs.reach import instructions
from vla_scale.envs.types import Observation
from vla_scale.models.kernels import KERNELS, kernels_problem, use_kernels
from vla_scale.models.oft.policy import OFTPolicy
from vla_scale.models.pi0.policy import Pi0Policy
from vla_scale.models.statistics import dataset_statistics
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
    if model.family == "oft":
        with pytest.raises(ConfigError) as err:
            vla_for_env(replace(model, kernels="liger"), EnvConfig())
        assert str(err.value) == problem
    policy = vla_for_env(model, EnvConfig()).new_policy()
    kinds = [type(m) for m in policy.modules()]
    with pytest.raises(RuntimeError, match="set model.kernels=eager"):
        use_kernels(policy, "liger")
    assert [type(m) for m in policy.modules()] == kinds


def test_liger_is_refused_for_pi0_on_any_machine_until_its_whole_policy_is_exact():
    with pytest.raises(ConfigError, match=r"model.kernels=liger is not yet exact for the pi0 family: .* set "
                                          r"model.kernels=eager"):
        vla_for_env(replace(PI0, kernels="liger"), EnvConfig())
