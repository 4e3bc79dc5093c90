"""Meta-World's scripted experts (`metaworld.policies`, one per task) as demonstrators, recorded step by step.

Each expert reads Meta-World's 39-D observation (`MetaWorldEnv.state`) and returns a 4-D action; Gaussian noise of
std `noise` goes on its xyz part, and the action recorded is the one the env ran, clipped to the action space
[-1, 1] (Meta-World clips the xyz displacement itself; the experts ask for more than 1 at times). Besides the
camera, the agent state and the action, every step keeps what LeRobot's Meta-World dataset keeps: the full
observation (`observation.environment_state`, float32 [39]) and the env's reward after the action (`next.reward`).
"""

from __future__ import annotations

import warnings

import numpy as np

from vla_scale.envs.metaworld import CAMERA, MetaWorldEnv
from vla_scale.envs.scripted import DemoEpisode
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

ENVIRONMENT_STATE = "observation.environment_state"
REWARD = "next.reward"


def expert(task: str) -> object:
    """Meta-World's scripted policy of `task`."""
    from metaworld.policies import ENV_POLICY_MAP

    return ENV_POLICY_MAP[task]()


def play_expert(env: MetaWorldEnv, task: TaskSpec, noise: float, rng: np.random.Generator) -> DemoEpisode:
    """Reset `env` to `task` and let the task's expert play it to its end, one action per env step
    (`envs/scripted.ScriptedDemo`)."""
    if noise < 0:
        raise ValueError(f"noise must be >= 0, got {noise}")
    observation = env.reset(task)
    policy = expert(env.raw_name)
    seen: list[Observation] = []
    states, actions, intended, rewards = [], [], [], []
    step: ChunkStep | None = None
    while step is None or not step.done:
        with warnings.catch_warnings():  # "Constant(s) may be too high": the experts' own gains, clipped below
            warnings.simplefilter("ignore", UserWarning)
            meant = np.asarray(policy.get_action(env.state), dtype=np.float64)  # type: ignore[attr-defined]
        action = meant.copy()
        if noise > 0:
            action[:3] += rng.normal(0.0, noise, 3)
        seen.append(observation)
        states.append(env.state)
        actions.append(np.clip(action, -1.0, 1.0))
        intended.append(np.clip(meant, -1.0, 1.0))
        step = env.step(actions[-1][None])
        rewards.append(step.info["rewards"][0])
        observation = step.observation
    return DemoEpisode(
        images={CAMERA: np.stack([o.images[CAMERA] for o in seen])},
        state=np.stack([o.proprio for o in seen]).astype(np.float32),
        actions=np.stack(actions).astype(np.float32),
        instruction=seen[0].instruction,
        success=step.success,
        intended=np.stack(intended).astype(np.float32),
        extras={ENVIRONMENT_STATE: np.stack(states).astype(np.float32),
                REWARD: np.array(rewards, dtype=np.float32)[:, None]},
    )
