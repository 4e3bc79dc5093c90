"""Meta-World behind the Env protocol (envs/metaworld.py) against Meta-World itself and LeRobot's way of building it:
the task lists, groups and experts; reset, step, reward and success on fixed seeds and actions; the corner2 image as
LeRobot's env renders it; held-out placements; the rendering keys; the refusals."""

from __future__ import annotations

import functools
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, script_env

metaworld = pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")

from hydra import compose, initialize_config_dir  # noqa: E402
from metaworld.env_dict import ALL_V3_ENVIRONMENTS, MT10_V3  # noqa: E402
from metaworld.policies import ENV_POLICY_MAP  # noqa: E402

from vla_scale.config import Config, ConfigError, register_configs, sft_problems, to_config, validate  # noqa: E402
from vla_scale.envs.metaworld import (  # noqa: E402
    CAMERA,
    DIFFICULTY,
    INSTRUCTIONS,
    MT10,
    MT50,
    SCENE_CAMERAS,
    MetaWorldEnv,
    task_groups,
)
from vla_scale.envs.registry import simulator  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402

TASKS = ("reach-v3", "pick-place-v3", "drawer-close-v3")


@functools.cache
def mt1(name: str) -> object:
    """Meta-World's MT1 benchmark of `name` as LeRobot makes it (seed 42: 50 placement draws, so made once)."""
    return metaworld.MT1(name, seed=42)


def lerobot_built(name: str, seed: int, **kwargs) -> object:
    """Meta-World's env of `name` as LeRobot's Meta-World env builds it (`lerobot/envs/metaworld.py`: an MT1 task set,
    corner2 moved, placements from the seeded generator), reset with `seed`."""
    benchmark = mt1(name)
    env = benchmark.train_classes[name](**kwargs)
    env.set_task(benchmark.train_tasks[0])
    env.model.cam_pos[2] = [0.75, 0.075, 0.7]
    env.reset()
    env._freeze_rand_vec = False
    env.seeded_rand_vec = True
    env.seed(seed)
    env.reset(seed=seed)
    return env


def test_the_tasks_groups_and_experts_are_metaworlds() -> None:
    assert MT50 == tuple(ALL_V3_ENVIRONMENTS) and MT10 == tuple(MT10_V3)
    assert set(ENV_POLICY_MAP) >= set(MT50) and set(INSTRUCTIONS) == set(MT50)
    assert sorted(t for group in DIFFICULTY.values() for t in group) == sorted(MT50)  # a partition of MT50
    assert [len(g) for g in DIFFICULTY.values()] == [28, 11, 6, 5]
    assert task_groups("mt10") == {"easy": [0, 3, 4, 5, 6, 8, 9], "medium": [7], "hard": [1, 2]}
    sim = simulator("metaworld")
    assert sim.groups("mt10", 3) == {"easy": [0], "hard": [1, 2]}  # only the tasks played
    assert sim.image_key(CAMERA) == "observation.image" and sim.cameras == (CAMERA,)
    env = ALL_V3_ENVIRONMENTS["reach-v3"]()
    assert tuple(env.model.camera(i).name for i in range(env.model.ncam)) == SCENE_CAMERAS
    env.close()


@pytest.mark.parametrize("name", TASKS)
def test_reset_step_reward_and_success_are_metaworlds(name: str) -> None:
    """Fixed seeds, the expert's actions then random ones: the same 39-D observations, rewards and success as
    Meta-World's env built as LeRobot builds it; the agent state is its first four numbers; a chunk stops at the
    first success."""
    ours = MetaWorldEnv(camera_resolution=32)
    rng = np.random.default_rng(0)
    for seed in (3, 1000):
        raw = lerobot_built(name, seed)
        want = raw._get_obs()
        observation = ours.reset(TaskSpec(name, 0, seed))
        assert np.array_equal(ours.state, want) and np.array_equal(observation.proprio, want[:4])
        assert observation.instruction == INSTRUCTIONS[name] and observation.images[CAMERA].shape == (32, 32, 3)
        expert = ENV_POLICY_MAP[name]()
        for t in range(12):
            action = expert.get_action(want) if t < 6 else rng.uniform(-1, 1, 4).astype(np.float32)
            want, reward, _, _, info = raw.step(action)
            step = ours.step(np.asarray(action)[None])
            assert np.array_equal(ours.state, want) and step.info["rewards"] == [float(reward)]
            assert step.success == bool(info["success"]) and step.steps_taken == 1
        raw.close()
    # the expert's whole episode as one chunk: it ends at the env's first success
    raw = lerobot_built(name, 5)
    ours.reset(TaskSpec(name, 0, 5))
    expert, obs, actions, first = ENV_POLICY_MAP[name](), raw._get_obs(), [], None
    for t in range(200):
        actions.append(expert.get_action(obs))
        obs, _, _, _, info = raw.step(actions[-1])
        if info["success"]:
            first = t + 1
            break
    assert first is not None
    step = ours.step(np.array(actions + [actions[-1]] * 5))
    assert step.success and step.done and step.steps_taken == first == step.info["episode_steps"]
    raw.close()
    ours.close()


def test_the_image_is_lerobots_corner2_at_metaworlds_rendering() -> None:
    """With Meta-World's own scene settings (shadows, reflections, 4x multisampling) the image is bit for bit what
    LeRobot's env renders at 480 px (gymnasium's renderer, flipped on both axes); the defaults render the same scene
    without them."""
    name = "drawer-close-v3"
    raw = lerobot_built(name, 7, render_mode="rgb_array", camera_name="corner2")
    want = np.flip(raw.render(), (0, 1))
    full = MetaWorldEnv(480, shadows=True, reflections=True, multisamples=4)
    fast = MetaWorldEnv(480)
    got = full.reset(TaskSpec(name, 0, 7)).images[CAMERA]
    quick = fast.reset(TaskSpec(name, 0, 7)).images[CAMERA]
    assert np.array_equal(got, want)
    assert quick.shape == want.shape and not np.array_equal(quick, want)
    assert np.abs(quick.astype(np.int16) - want).mean() < 20  # the same scene: shading differs, not content
    for env in (raw, full, fast):
        env.close()


def test_eval_placements_are_held_out_from_training() -> None:
    """Init state k is Meta-World's placement draw after seed(k): the EVAL block's placements (1000..1009, LeRobot's
    evaluation seeds) are none of the TRAIN ones."""
    env = MetaWorldEnv(camera_resolution=16)
    placements = {}
    for k in [*range(100), *range(1000, 1010)]:
        env.reset(TaskSpec("push-v3", 0, k))
        placements[k] = env.raw._last_rand_vec.tobytes()
    train = {placements[k] for k in range(100)}
    assert len(train) == 100 and not {placements[k] for k in range(1000, 1010)} & train
    env.reset(TaskSpec("push-v3", 0, 3))
    assert env.raw._last_rand_vec.tobytes() == placements[3]  # the same state again
    env.close()


def shipped(*overrides: str) -> Config:
    """The shipped configuration with `overrides`, nothing shrunk."""
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=list(overrides)))


def test_the_shipped_configs_are_lerobots_protocol() -> None:
    for group, suite, tasks in (("metaworld_mt10", "mt10", 10), ("metaworld_mt50", "mt50", 50)):
        cfg = validate(shipped(f"env={group}", "model.action_dim=4"))
        e = cfg.env
        assert (e.suite, e.num_tasks, e.max_steps, e.camera_resolution) == (suite, tasks, 500, 480)
        assert (e.num_train_init_states, e.num_eval_init_states, e.metaworld.shadows) == (1000, 10, False)
        assert (cfg.record.fps, cfg.record.episodes, cfg.demo.noise) == (80, "successes", 0.0)
    one = validate(shipped("env=metaworld_mt1", "env.metaworld.task=push-v3", "model.action_dim=4")).env
    assert (one.suite, one.num_tasks) == ("push-v3", 1)


@pytest.mark.parametrize(("overrides", "words"), [
    (["env=metaworld_mt1", "env.metaworld.task=reach-v9"], ["env.metaworld.task='reach-v9' is not a Meta-World "
                                                            "task", "did you mean reach-v3"]),
    (["env=metaworld_mt10", "env.metaworld.task=shelf-place-v3"], ["'shelf-place-v3' is not in MT10",
                                                                   "env=metaworld_mt1 env.metaworld.task="]),
    (["env=metaworld_mt10", "env.metaworld.task=push-v3"], ["plays every task of MT10", "env=metaworld_mt1"]),
    (["env=metaworld_mt10", "env.camera_resolution=2048"], ["env.camera_resolution=2048 is beyond the 1024 px"]),
    (["env=metaworld_mt10", "env.metaworld.multisamples=-1"], ["env.metaworld.multisamples=-1"]),
])
def test_bad_metaworld_settings_are_refused(tiny_config, overrides: list[str], words: list[str]) -> None:
    with pytest.raises(ConfigError) as err:
        validate(tiny_config(*overrides, "model.action_dim=4"))
    for word in words:
        assert word in str(err.value), str(err.value)


def test_a_camera_the_scene_has_not_is_refused(tiny_config) -> None:
    cfg = tiny_config("env=metaworld_mt10", "model.action_dim=4", "sft.dataset=/data",
                      "+sft.cameras={wrist: observation.images.wrist}")
    found = sft_problems(cfg)
    assert any("sft.cameras maps ['wrist']" in p and "its cameras: corner2" in p for p in found), found


def test_metaworld_missing_is_refused_before_anything_starts() -> None:
    """The same check in a process where the package cannot be imported (`sys.modules[name] = None` makes Python
    refuse it): one line saying what to install."""
    hide = ("import sys\n"
            "sys.modules['metaworld'] = None\n"
            "from vla_scale.envs.metaworld import MetaWorldSettings\n"
            "print('\\n'.join(MetaWorldSettings().startup_problems('mt10')))\n")
    proc = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, env=script_env(), capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Meta-World is not installed: run `make metaworld`" in proc.stdout, proc.stdout


def test_a_pi0_prompt_budget_the_tasks_do_not_fit_is_refused() -> None:
    """π0's prompt is the instruction alone, so every task's is known before anything starts: one over the budget
    would be cut at every decode."""
    from vla_scale.run_policy import vla_for_env

    tokenizer = ROOT / "tests" / "fixtures" / "openpi_reference" / "tokenizer.model"
    cfg = shipped("env=metaworld_mt10", "model=pi0_tiny", f"model.pi0.tokenizer={tokenizer}",
                  "model.pi0.max_token_len=12")
    with pytest.raises(ConfigError, match=r"the instruction '.+' of env.suite=mt10 makes a prompt of (\d+) tokens > "
                                          r"the policy's budget 12: set model.pi0.max_token_len=\1"):
        vla_for_env(cfg.model, cfg.env)
    cfg.model.pi0.max_token_len = 48
    assert vla_for_env(cfg.model, cfg.env).spec.max_token_len == 48


def test_a_simulator_keeps_at_most_tasks_kept_scenes_and_rebuilds_the_same() -> None:
    env = MetaWorldEnv(camera_resolution=32, tasks_kept=2)
    first = env.reset(TaskSpec("mt10", 0, 7))
    state = env.state
    for task in (1, 0, 2):  # task 1 is then the one used longest ago
        env.reset(TaskSpec("mt10", task, 7))
    assert env.built == ("reach-v3", "pick-place-v3")
    env.reset(TaskSpec("mt10", 1, 7))
    assert env.built == ("pick-place-v3", "push-v3")
    env.close()
    again = MetaWorldEnv(camera_resolution=32, tasks_kept=1)
    for task in (1, 0):
        observation = again.reset(TaskSpec("mt10", task, 7))
    assert np.array_equal(again.state, state) and np.array_equal(observation.images[CAMERA], first.images[CAMERA])
    assert again.built == ("reach-v3",)
    again.close()
    with pytest.raises(ValueError, match="tasks_kept must be >= 1"):
        MetaWorldEnv(tasks_kept=0)


def test_the_simulators_of_a_process_share_tasks_kept() -> None:
    """Simulators of one process (a training fleet's slots) share tasks_kept: two with 4 keep two scenes each, and
    the one left open keeps four (a process of 20 simulators with the default 10 keeps one scene each, not ten)."""
    envs = [MetaWorldEnv(camera_resolution=32, tasks_kept=4) for _ in range(2)]
    assert [env.kept for env in envs] == [2, 2]
    for task in (0, 1, 2):
        envs[0].reset(TaskSpec("mt10", task, 7))
    assert envs[0].built == ("push-v3", "pick-place-v3")
    envs[1].close()
    assert envs[0].kept == 4
    envs[0].close()
