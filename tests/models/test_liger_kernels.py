"""Liger Kernel's layers (`model.kernels=liger`, `models/liger.py`) against the eager layers they replace, on the GPU.

Each swapped layer, forward and backward, in float32 and bfloat16: its outputs and the gradients of its inputs and
parameters against the eager layer's, from the same weights, inputs and output gradients; then whole policies (a
tiny OFT policy of the official layout with grouped-query attention, a tiny π0 and π0.5: the loss forward and
backward), π0's decode, and OFT's rollout engine on both paths. Errors are relative to the eager tensor's largest
magnitude, `max|liger - eager| / max|eager|`, the largest over every tensor compared (a gradient that is zero in
exact arithmetic against the model's largest: `ZERO_IN_EXACT_ARITHMETIC`). The bounds below allow for
float32 the order of float sums, for bfloat16 a few roundings of 2^-8 each (a layer) and their growth through a
few layers and the backward pass (a policy); each test prints the errors it measured (`pytest -s`).
"""

from __future__ import annotations

import copy
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from torch import Tensor, nn
from transformers import GemmaConfig, LlamaConfig
from transformers.models.gemma.modeling_gemma import GemmaMLP, GemmaRMSNorm, GemmaRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaMLP, LlamaRotaryEmbedding

from vla_scale.models.kernels import use_kernels
from vla_scale.models.oft.decode import OFTDecoder
from vla_scale.models.oft.policy import FusedRMSNorm
from vla_scale.models.pi0.backbone import PaliGemmaWithExpert
from vla_scale.models.pi0.gemma import AdaRMSNorm
from vla_scale.models.pi0.policy import Pi0Inputs, Pi0Policy
from vla_scale.models.pi0.spec import tiny_spec
from vla_scale.rollout.engine import RolloutEngine

sys.path.insert(0, str(Path(__file__).parents[1] / "rollout"))
from test_engine_fast_path import official_case  # noqa: E402

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger's Triton kernels run on a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None,
                       reason="liger-kernel is not installed (pip install -e '.[kernels]')"),
]

CUDA = torch.device("cuda")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
B, L, D, FF, HEADS, KV, HD = 3, 37, 256, 688, 4, 2, 64

LAYER_BOUNDS = {  # (outputs, gradients) per layer and dtype
    ("llama_rms_norm", "fp32"): (1e-5, 1e-4), ("llama_rms_norm", "bf16"): (2e-2, 5e-2),
    ("llama_mlp", "fp32"): (1e-5, 1e-4), ("llama_mlp", "bf16"): (2e-2, 5e-2),
    ("llama_attention", "fp32"): (1e-5, 1e-4), ("llama_attention", "bf16"): (2e-2, 5e-2),
    ("gemma_rms_norm", "fp32"): (1e-5, 1e-4), ("gemma_rms_norm", "bf16"): (2e-2, 5e-2),
    ("gemma_mlp", "fp32"): (1e-5, 1e-4), ("gemma_mlp", "bf16"): (2e-2, 5e-2),
    ("ada_rms_norm", "fp32"): (1e-5, 1e-4), ("ada_rms_norm", "bf16"): (2e-2, 5e-2),
    ("pi0_rotary", "fp32"): (1e-5, 1e-4), ("pi0_rotary", "bf16"): (2e-2, 5e-2),
}
POLICY_BOUNDS = {  # (outputs, gradients) of whole policies
    ("oft", "fp32"): (1e-4, 1e-3), ("oft", "bf16"): (5e-2, 2e-1),
    ("pi0", "fp32"): (1e-4, 1e-3), ("pi0", "bf16"): (5e-2, 2e-1),
    ("pi05", "fp32"): (1e-4, 1e-3), ("pi05", "bf16"): (5e-2, 2e-1),
}


def relative(got: Tensor, want: Tensor, scale: float | None = None) -> float:
    """max|got - want| / max|want| (0 where both are all zeros), or over `scale` where one is given."""
    got, want = got.detach().float(), want.detach().float()
    scale = float(want.abs().max()) if scale is None else scale
    error = float((got - want).abs().max())
    return error / scale if scale > 0 else error


ZERO_IN_EXACT_ARITHMETIC = (".self_attn.k_proj.bias",)
"""Gradients that are zero in exact arithmetic: a bias added to every key moves all of a query's logits by one
constant, which the softmax takes out (SigLIP's attention has one). What either side computes for them is rounding
(about 1e-8 where the model's gradients are 1-50, in float32), so they are judged against the model's largest
gradient, not their own."""


def swapped(module: nn.Module) -> nn.Module:
    """A copy of `module` with Liger's kernels; at least one of its modules must have been swapped."""
    from vla_scale.models.liger import is_swapped

    copied = use_kernels(copy.deepcopy(module), "liger")
    assert any(is_swapped(m) for m in copied.modules())
    return copied


def run(call: Callable[..., Tensor | Sequence[Tensor]], module: nn.Module | None, inputs: Sequence[Tensor],
        needs_grad: Sequence[bool], seed: int = 11) -> tuple[list[Tensor], dict[str, Tensor | None]]:
    """Outputs of `call(module, *inputs)` and, after a backward pass of seeded output gradients, the gradients of
    the inputs that need one and of the module's parameters, by name."""
    xs = [x.detach().clone().requires_grad_(flag) for x, flag in zip(inputs, needs_grad, strict=True)]
    out = call(module, *xs)
    outs = [out] if isinstance(out, Tensor) else list(out)
    g = torch.Generator(device=CUDA).manual_seed(seed)
    torch.autograd.backward(outs, [torch.randn(o.shape, generator=g, device=CUDA, dtype=o.dtype) for o in outs])
    grads: dict[str, Tensor | None] = {f"input{i}": x.grad for i, x in enumerate(xs) if x.requires_grad}
    if module is not None:
        grads.update({name: p.grad for name, p in module.named_parameters()})
    return outs, grads


def errors(eager: tuple[list[Tensor], dict[str, Tensor | None]], liger: tuple[list[Tensor], dict[str, Tensor | None]]
           ) -> tuple[float, float, str]:
    """(largest output error, largest gradient error, the name of that gradient with its scale); a gradient one side
    has and the other lacks fails."""
    out = max(relative(a, b) for a, b in zip(liger[0], eager[0], strict=True))
    assert liger[1].keys() == eager[1].keys()
    largest = max((float(g.abs().max()) for g in eager[1].values() if g is not None), default=0.0)
    grad, worst = 0.0, ""
    for name, want in eager[1].items():
        got = liger[1][name]
        assert (got is None) == (want is None), name
        if want is None:
            continue
        error = relative(got, want, largest if name.endswith(ZERO_IN_EXACT_ARITHMETIC) else None)
        if error > grad:
            grad, worst = error, f"{name}, largest |eager gradient| {want.abs().max().item():.2e}"
    return out, grad, worst


def compare(name: str, dtype: str, call: Callable[..., Tensor | Sequence[Tensor]], eager: nn.Module | None,
            liger: nn.Module | None, inputs: Sequence[Tensor], needs_grad: Sequence[bool],
            bounds: tuple[float, float], liger_call: Callable[..., Tensor | Sequence[Tensor]] | None = None) -> None:
    out, grad, worst = errors(run(call, eager, inputs, needs_grad),
                              run(liger_call or call, liger, inputs, needs_grad))
    print(f"parity {name} {dtype}: outputs {out:.2e} (bound {bounds[0]:.0e}), gradients {grad:.2e} "
          f"(bound {bounds[1]:.0e}; the largest: {worst})")
    assert out <= bounds[0] and grad <= bounds[1], (name, dtype, out, grad)


def randomised(module: nn.Module, seed: int, norm_mean: float) -> nn.Module:
    """Every parameter drawn at random (norm weights around `norm_mean`), so that no term is switched off."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.dim() == 1:
                p.copy_(norm_mean + 0.3 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
    return module


def inputs(seed: int, *shapes: tuple[int, ...], dtype: torch.dtype) -> list[Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(CUDA, dtype) for s in shapes]


def llama_config() -> LlamaConfig:
    config = LlamaConfig(hidden_size=D, intermediate_size=FF, num_attention_heads=HEADS, num_key_value_heads=KV,
                         head_dim=HD, hidden_act="silu", attention_dropout=0.0)
    config._attn_implementation = "sdpa"
    return config


def llama_layer(name: str) -> tuple[nn.Module, Callable[..., Tensor]]:
    """The eager module of `name` and how it is called on its inputs."""
    if name == "llama_rms_norm":
        return randomised(FusedRMSNorm(D, eps=1e-5), 0, 1.0), lambda m, x: m(x)
    if name == "llama_mlp":
        return randomised(LlamaMLP(llama_config()), 1, 0.0), lambda m, x: m(x)
    attention = randomised(LlamaAttention(llama_config(), layer_idx=0), 2, 0.0)
    rotary = LlamaRotaryEmbedding(llama_config()).to(CUDA)

    def call(m: nn.Module, x: Tensor) -> Tensor:
        cos, sin = rotary(x, torch.arange(x.shape[1], device=CUDA)[None])
        return m(x, (cos, sin), None)[0]

    return attention, call


def gemma_layer(name: str) -> tuple[nn.Module, Callable[..., Tensor]]:
    if name == "gemma_rms_norm":
        return randomised(GemmaRMSNorm(D, eps=1e-6), 3, 0.0), lambda m, x: m(x)
    config = GemmaConfig(hidden_size=D, intermediate_size=FF, hidden_act="gelu_pytorch_tanh",
                         hidden_activation="gelu_pytorch_tanh")
    return randomised(GemmaMLP(config), 4, 0.0), lambda m, x: m(x)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["llama_rms_norm", "llama_mlp", "llama_attention", "gemma_rms_norm", "gemma_mlp"])
def test_each_swapped_layer_gives_the_eager_outputs_and_gradients(name, dtype):
    module, call = (llama_layer if name.startswith("llama") else gemma_layer)(name)
    eager = module.to(CUDA, DTYPES[dtype])
    liger = swapped(eager)
    assert type(liger) is not type(eager) and isinstance(liger, type(eager))
    assert liger.state_dict().keys() == eager.state_dict().keys()
    compare(name, dtype, call, eager, liger, inputs(5, (B, L, D), dtype=DTYPES[dtype]), [True],
            LAYER_BOUNDS[(name, dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_adarms_norm_gives_the_eager_output_gate_and_gradients(dtype):
    eager = randomised(AdaRMSNorm(D, 128, eps=1e-6), 6, 0.0).to(CUDA, DTYPES[dtype])
    liger = swapped(eager)
    compare("ada_rms_norm", dtype, lambda m, x, c: m(x, c), eager, liger,
            inputs(7, (B, L, D), (B, 128), dtype=DTYPES[dtype]), [True, True], LAYER_BOUNDS[("ada_rms_norm", dtype)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_pi0_rotary_embedding_gives_the_eager_queries_keys_and_gradients(dtype):
    """openpi's head layout (8 query heads, one key head of 256) at per-row positions (each row its own offset)."""
    from vla_scale.models.liger import LigerPaliGemmaWithExpert

    config = GemmaConfig(head_dim=256, num_attention_heads=8, num_key_value_heads=1)
    positions = torch.arange(L, device=CUDA)[None] + torch.tensor([0, 5, 11], device=CUDA)[:, None]
    q, k = inputs(8, (B, 8, L, 256), (B, 1, L, 256), dtype=DTYPES[dtype])
    cos, sin = GemmaRotaryEmbedding(config).to(CUDA)(q, positions)
    assert LigerPaliGemmaWithExpert.rotary is not PaliGemmaWithExpert.rotary
    compare("pi0_rotary", dtype, lambda _, *a: PaliGemmaWithExpert.rotary(*a), None, None, [q, k, cos, sin],
            [True, True, False, False], LAYER_BOUNDS[("pi0_rotary", dtype)],
            liger_call=lambda _, *a: LigerPaliGemmaWithExpert.rotary(*a))


def oft_loss(policy: nn.Module, batch: object) -> Tensor:
    return policy(batch, device=CUDA)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_whole_oft_policy_trains_as_the_eager_one(dtype):
    """The official layout: fused towers, grouped-query attention, proprio, two images, prompts of three lengths."""
    policy, batch = official_case()
    eager = policy.to(CUDA, DTYPES[dtype]).train()
    liger = swapped(eager)
    kinds = [type(m).__name__ for m in liger.modules() if type(m).__module__ == "vla_scale.models.liger"]
    layers = liger.spec.llm["num_hidden_layers"]
    assert sorted(set(kinds)) == ["LigerLlamaAttention", "LigerLlamaMLP", "LigerLlamaRMSNorm"]
    assert kinds.count("LigerLlamaRMSNorm") == 2 * layers + 1 and kinds.count("LigerLlamaMLP") == layers
    assert liger.state_dict().keys() == eager.state_dict().keys()
    compare("oft", dtype, lambda m, *_: oft_loss(m, batch), eager, liger, [], [], POLICY_BOUNDS[("oft", dtype)])


def pi0_case(pi05: bool, dtype: torch.dtype) -> tuple[Pi0Policy, Pi0Inputs]:
    """A tiny π0 (π0.5) with every parameter drawn at random, as tests/models/test_pi0.py draws it, and a batch."""
    torch.manual_seed(0)
    policy = Pi0Policy.from_spec(tiny_spec(pi05))
    with torch.no_grad():
        for param in policy.parameters():
            param.normal_(0.0, 0.2)
    s, g = policy.spec, torch.Generator().manual_seed(1)
    lengths = torch.tensor([3, s.max_token_len, 7])
    batch = Pi0Inputs(
        images=torch.rand(B, s.num_images, 3, s.vision.image_size, s.vision.image_size, generator=g) * 2 - 1,
        image_masks=torch.tensor([[True, True, False], [True, False, True], [True, True, True]]),
        tokens=torch.randint(1, s.vocab_size, (B, s.max_token_len), generator=g),
        token_masks=torch.arange(s.max_token_len)[None] < lengths[:, None],
        state=torch.randn(B, s.action_dim, generator=g))
    moved = Pi0Inputs(**{k: v.to(CUDA) for k, v in vars(batch).items()})
    return policy.to(CUDA, dtype), moved


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pi05", [False, True], ids=["pi0", "pi05"])
def test_a_whole_pi0_policy_trains_and_decodes_as_the_eager_one(pi05, dtype):
    eager, batch = pi0_case(pi05, DTYPES[dtype])
    eager.train()
    liger = swapped(eager)
    kinds = {type(m).__name__ for m in liger.modules() if type(m).__module__ == "vla_scale.models.liger"}
    assert kinds == {"LigerPaliGemmaWithExpert", "LigerGemmaRMSNorm", "LigerGemmaMLP",
                     *(["LigerAdaRMSNorm"] if pi05 else [])}
    s, g = eager.spec, torch.Generator().manual_seed(2)
    noise, actions = (torch.randn(B, s.action_horizon, s.action_dim, generator=g).to(CUDA) for _ in range(2))
    time = torch.tensor([0.2, 0.5, 0.9], device=CUDA)
    name = "pi05" if pi05 else "pi0"
    compare(name, dtype, lambda m: m.flow_loss(batch, actions, noise, time), eager, liger, [], [],
            POLICY_BOUNDS[(name, dtype)])
    with torch.no_grad():
        want, got = (p.eval().sample_actions(batch, noise, num_steps=3) for p in (eager, liger))
    error = relative(got, want)
    print(f"parity {name} decode {dtype}: actions {error:.2e}")
    assert error <= POLICY_BOUNDS[(name, dtype)][0]


@pytest.mark.parametrize("fast", [False, True], ids=["plain", "fast"])
def test_the_oft_rollout_engine_decodes_a_swapped_policy_as_the_eager_one(fast):
    """The engine's bf16 logits on both paths; the fast path runs its own norms and only the final norm is Liger's."""
    policy, batch = official_case()
    liger = swapped(policy)
    engines = [RolloutEngine(p, "cuda", seed=7, fast=fast, compile=False, dtype=torch.bfloat16, decoder=OFTDecoder())
               for p in (policy, liger)]
    with torch.no_grad():
        want, got = (e.logits(e.inputs(batch)) for e in engines)
    error = relative(got, want)
    print(f"parity oft engine {'fast' if fast else 'plain'} bf16: logits {error:.2e}")
    assert error <= POLICY_BOUNDS[("oft", "bf16")][0]


def test_swapping_back_gives_the_eager_classes_and_outputs():
    """`use_kernels(policy, "eager")` undoes a swap (what update_profile's `kernels=` rows do to the live actor)."""
    policy, batch = official_case()
    policy = policy.to(CUDA).eval()
    kinds = [type(m) for m in policy.modules()]
    with torch.no_grad():
        want = oft_loss(policy, batch)
        use_kernels(policy, "liger")
        assert [type(m) for m in policy.modules()] != kinds
        use_kernels(policy, "eager")
        assert [type(m) for m in policy.modules()] == kinds
        torch.testing.assert_close(oft_loss(policy, batch), want, rtol=0, atol=0)


def test_a_swapped_policy_on_the_cpu_computes_what_the_eager_one_does():
    policy, batch = official_case()
    liger = use_kernels(copy.deepcopy(policy), "liger")
    with torch.no_grad():
        torch.testing.assert_close(liger(batch), policy(batch), rtol=0, atol=0)
