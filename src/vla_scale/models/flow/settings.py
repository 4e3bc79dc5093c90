"""The keys every flow-matching family takes for RL (π0's `model.pi0.*`, the same under each such family's group):
how a rollout makes the denoising chain stochastic so that its chunks have log-probs, πRL's two methods.

A family's settings dataclass derives from `FlowRLSettings`; `apply_rl_settings` hands the keys to its source, which
hands them to its decoder and its policies. No torch here: the configuration's checks read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

RL_NOISES = ("flow_sde", "flow_noise")
"""`rl_noise`: how an RL rollout's chain is made stochastic."""
STOCHASTIC_STEPS = ("one", "all")
"""`stochastic_steps`: one random stochastic step per chunk (πRL's mixed ODE-SDE sampling), or all K."""
METHOD_STEPS = {"flow_sde": "one", "flow_noise": "all"}
"""What `stochastic_steps=''` means for each method: πRL's Flow-SDE runs mixed ODE-SDE sampling, its Flow-Noise scores
the whole chain (RLinf's Flow-Noise configurations set `joint_logprob`)."""


def resolved_stochastic_steps(stochastic_steps: str, rl_noise: str) -> str:
    """`stochastic_steps`, '' resolved to the method's (`METHOD_STEPS`); ValueError naming the key for an unknown
    value of either."""
    if rl_noise not in RL_NOISES:
        raise ValueError(f"rl_noise={rl_noise!r}: choose one of {RL_NOISES}")
    if stochastic_steps not in ("", *STOCHASTIC_STEPS):
        raise ValueError(f"stochastic_steps={stochastic_steps!r}: choose one of {STOCHASTIC_STEPS} (or '': "
                         "the method's)")
    return stochastic_steps or METHOD_STEPS[rl_noise]


@dataclass
class FlowRLSettings:
    rl_noise: str = "flow_sde"
    """How an RL rollout (launch/train.py) makes the denoising chain stochastic so that its chunks have log-probs,
    πRL's two methods: flow_sde (a step is the SDE transition of noise level `noise_level`,
    objectives/flow_sde.py) or flow_noise (a step is the Euler step plus Gaussian noise whose std a small noise head
    reads from the action expert's output, trained with the policy; objectives/flow_noise.py). Evaluation decodes
    noise-free either way."""
    noise_level: float = 0.5
    """RL's Flow-SDE noise level a (objectives/flow_sde.py): with rl_noise=flow_sde the rollout of launch/train.py
    makes one denoising step per chunk, drawn at random, a Gaussian transition of std a * sqrt(t / (1 - t)) *
    sqrt(|dt|) (πRL's mixed ODE-SDE sampling); its log-prob is what GRPO trains. Evaluation decodes noise-free
    whatever it is."""
    stochastic_steps: str = ""
    """Which denoising steps of an RL rollout's chain are stochastic: one per chunk, drawn at random (πRL's mixed
    ODE-SDE sampling), all K of them (the chunk's log-prob sums every step's), or '' (the method's: one for
    flow_sde, all for flow_noise, as πRL runs them)."""
    noise_std_min: float = 0.08
    """Flow-Noise's smallest std of a denoising step (the noise head's lower bound; RLinf's noise_logvar_range[0])."""
    noise_std_max: float = 0.16
    """Flow-Noise's largest std of a denoising step (the noise head's upper bound; RLinf's noise_logvar_range[1])."""

    BOUNDS: ClassVar[dict[str, tuple[str, float, bool]]] = {
        k: ("> 0", 0, False) for k in ("noise_level", "noise_std_min", "noise_std_max")}
    """Key (within the group) -> (what it must be, the bound, whether the bound itself is allowed)."""

    @staticmethod
    def choices() -> dict[str, tuple[Any, ...]]:
        """Key (within the group) -> the values it may take."""
        return {"rl_noise": RL_NOISES, "stochastic_steps": ("", *STOCHASTIC_STEPS)}

    def problems(self, group: str) -> list[str]:
        """What the group's keys contradict, each naming them (`group`: e.g. `model.pi0`)."""
        if self.noise_std_min > self.noise_std_max:
            return [f"{group}.noise_std_min={self.noise_std_min} exceeds {group}.noise_std_max={self.noise_std_max}: "
                    "Flow-Noise's std range needs min <= max"]
        return []


def apply_rl_settings(source: Any, settings: FlowRLSettings) -> None:
    """The RL chain's keys onto a flow family's source (how its decoder samples, what its policies hold)."""
    source.noise_level, source.stochastic_steps = settings.noise_level, settings.stochastic_steps
    source.rl_noise, source.noise_std = settings.rl_noise, (settings.noise_std_min, settings.noise_std_max)
