"""LIBERO against the real simulator: every suite builds, resets deterministically and steps; success is LIBERO's
predicate; simulator processes hold no torch; init states are read without torch; the TRAIN/EVAL split is disjoint.

The simulator-backed checks share two module fixtures (about 60-90 s on 2 cores): two `SimProcess`es that play one
task of every suite, and one fresh Python process that plays a task to success, runs gymnasium's `check_env` and
compares a soft reset with a rebuilt scene.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import subprocess
import sys
import textwrap
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from vla_scale.envs import libero
from vla_scale.envs.libero import (
    ACTION_DIM,
    NUM_INIT_STATES,
    OFT_MAX_STEPS,
    SUITES,
    load_init_states,
    oft_gripper_to_libero,
    quat_to_axis_angle,
)
from vla_scale.envs.sim_process import SimProcess
from vla_scale.envs.types import ChunkStep, Observation, TaskSpec

ROOT = Path(__file__).resolve().parents[2]
RES = 128
CHUNK = 8
BOOT_TIMEOUT_S = 240.0  # interpreter start, LIBERO import and the first scene build, on a busy machine
# one task per suite, spread over two processes so both cores work; (suite, task id)
PLAN = [[("libero_spatial", 3), ("libero_goal", 5), ("libero_90", 42)], [("libero_object", 7), ("libero_10", 1)]]


# ---- no simulator -------------------------------------------------------------------------------------------------
def test_task_map_matches_suite_task_counts() -> None:
    for suite in SUITES:
        names = libero.task_names(suite)
        assert len(names) == libero.num_tasks(suite)
        assert len(libero.instructions(suite)) == len(names) and all(libero.instructions(suite))
        if suite != "libero_90":  # LIBERO-90 repeats some instructions in different scenes
            assert len(set(libero.instructions(suite))) == len(names)
    assert libero.instructions("libero_spatial")[0] == (
        "pick up the black bowl between the plate and the ramekin and place it on the plate")
    name = "KITCHEN_SCENE10_put_the_butter_at_the_back_in_the_top_drawer_of_the_cabinet_and_close_it"
    assert libero.task_language(name) == "put the butter at the back in the top drawer of the cabinet and close it"
    with pytest.raises(ValueError, match="valid suites"):
        libero.num_tasks("libero_100")


def test_init_states_are_read_without_torch_and_equal_torch_load() -> None:
    for suite in SUITES:
        states = load_init_states(suite, libero.num_tasks(suite) - 1)
        assert states.shape[0] == NUM_INIT_STATES and states.dtype == np.float64
    import torch  # the test process may; simulator processes never do

    path = libero.libero_install.benchmark_root() / "init_files" / "libero_10" / (
        libero.task_names("libero_10")[4] + ".pruned_init")
    assert np.array_equal(load_init_states("libero_10", 4), torch.load(path, weights_only=False))


def test_init_state_reader_refuses_anything_but_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "libero" / "init_files" / "libero_goal"
    folder.mkdir(parents=True)
    name = libero.task_names("libero_goal")[0]
    with zipfile.ZipFile(folder / f"{name}.pruned_init", "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps(os.system))
    monkeypatch.setattr(libero.libero_install, "benchmark_root", lambda: tmp_path / "libero")
    load_init_states.cache_clear()
    try:
        with pytest.raises(pickle.UnpicklingError, match="only numpy arrays"):
            load_init_states("libero_goal", 0)
    finally:
        load_init_states.cache_clear()
    assert isinstance(pickle.load(io.BytesIO(pickle.dumps(np.zeros(2)))), np.ndarray)


def test_oft_gripper_to_libero_normalises_binarises_and_inverts() -> None:
    chunk = np.array([[0.1, -0.2, 0.3, 0.0, 0.0, 0.0, 0.9], [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.2]])
    out = oft_gripper_to_libero(chunk)
    assert out[:, -1].tolist() == [-1.0, 1.0]  # 0.9 = open in OpenVLA's data -> -1 (open) in LIBERO
    assert np.array_equal(out[:, :-1], chunk[:, :-1]) and chunk[0, -1] == 0.9  # input untouched
    assert oft_gripper_to_libero(chunk[0], invert=False)[-1] == 1.0


def test_quat_to_axis_angle() -> None:
    angle, axis = 0.7, np.array([0.0, 0.6, 0.8])
    quat = np.append(axis * np.sin(angle / 2), np.cos(angle / 2))  # (x, y, z, w)
    assert np.allclose(quat_to_axis_angle(quat), axis * angle)
    assert np.array_equal(quat_to_axis_angle(np.array([0.0, 0.0, 0.0, 1.0])), np.zeros(3))


def test_downscaled_assets_shrink_big_textures_and_link_the_rest(tmp_path: Path) -> None:
    from PIL import Image

    from vla_scale.envs.libero_install import downscaled_assets

    source = tmp_path / "assets"
    (source / "textures").mkdir(parents=True)
    big = np.arange(64 * 48 * 3, dtype=np.uint8).reshape(48, 64, 3)
    Image.fromarray(big).save(source / "textures" / "big.png")
    Image.fromarray(big[:8, :8]).save(source / "textures" / "small.png")
    (source / "scene.xml").write_text("<mujoco/>")
    mirror = downscaled_assets(source, 16, cache=tmp_path / "cache")
    shrunk = np.asarray(Image.open(mirror / "textures" / "big.png"))
    assert shrunk.shape == (12, 16, 3)  # factor ceil(64 / 16) = 4, a 4x4 box mean per texel
    assert np.allclose(shrunk[0, 0], big[:4, :4].reshape(-1, 3).mean(0), atol=1)
    assert (mirror / "textures" / "small.png").is_symlink() and (mirror / "scene.xml").is_symlink()
    assert downscaled_assets(source, 16, cache=tmp_path / "cache") == mirror  # built once


def test_train_and_eval_init_states_are_disjoint_unless_asked() -> None:
    from hydra import compose, initialize_config_dir

    from vla_scale.config import init_state_ids, register_configs, to_config, validate

    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        for suite in SUITES:
            env = validate(to_config(compose(config_name="config", overrides=[f"env={suite}"]))).env
            train, evals = init_state_ids(env, "train"), init_state_ids(env, "eval")
            assert (len(train), len(evals)) == (40, 10) and not set(train) & set(evals)
            assert env.max_steps == OFT_MAX_STEPS[suite] and env.settle_steps == 10
        simplevla = to_config(compose(config_name="config", overrides=[
            "env=libero_spatial", "env.train_on_eval_states=true", "env.num_train_init_states=0",
            "env.num_eval_init_states=50", "env.max_steps=512"]))
    validate(simplevla)
    assert init_state_ids(simplevla.env, "train") == init_state_ids(simplevla.env, "eval") == list(range(50))


# ---- simulator processes ------------------------------------------------------------------------------------------
def _play(plan: list[tuple[str, int]]) -> tuple[int, dict]:
    """In one simulator process: per task, reset twice to init state 0, then step one chunk."""
    out = {}
    with SimProcess("libero", 1, {"camera_resolution": RES, "settle_steps": 10}) as proc:
        for suite, task_id in plan:
            task = TaskSpec(suite, task_id, 0)
            proc.send_reset([task])
            first = proc.recv(BOOT_TIMEOUT_S)[0]
            proc.send_reset([task])
            again = proc.recv(BOOT_TIMEOUT_S)[0]
            chunk = np.zeros((1, CHUNK, ACTION_DIM))
            chunk[..., 2], chunk[..., 6] = 0.5, 1.0  # move up, close the gripper
            proc.send_step(chunk, np.array([True]))
            out[suite] = (task, first, again, proc.recv(BOOT_TIMEOUT_S)[0])
        maps = Path(f"/proc/{proc.pid}/maps").read_text()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_mib = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) / 1024
        out["_process"] = {"torch_mapped": "libtorch" in maps, "rss_mib": rss_mib}
    return proc.pid, out


@pytest.fixture(scope="module")
def played() -> dict:
    with ThreadPoolExecutor(len(PLAN)) as pool:
        results = list(pool.map(_play, PLAN))
    merged: dict = {"_processes": []}
    for _, out in results:
        merged["_processes"].append(out.pop("_process"))
        merged.update(out)
    return merged


@pytest.mark.parametrize("suite", SUITES)
def test_every_suite_builds_resets_to_an_init_state_and_steps_a_chunk(played: dict, suite: str) -> None:
    task, first, again, step = played[suite]
    assert isinstance(first, Observation) and isinstance(step, ChunkStep)
    assert first.instruction == libero.instructions(suite)[task.task_id]
    for obs in (first, step.observation):
        assert set(obs.images) == {"agentview", "wrist"}
        assert all(image.shape == (RES, RES, 3) and image.dtype == np.uint8 for image in obs.images.values())
        assert obs.proprio.shape == (8,) and obs.proprio.dtype == np.float32
    for name in first.images:  # the same init state gives the same first observation
        assert np.array_equal(first.images[name], again.images[name])
    assert np.array_equal(first.proprio, again.proprio)
    assert step.steps_taken == CHUNK and not step.done and not step.success and step.reward == 0.0
    assert step.observation.proprio[2] > first.proprio[2]  # the end-effector went up
    assert step.info["step_limit"] == OFT_MAX_STEPS[suite]
    assert step.observation.images["agentview"].std() > 10  # a rendered scene, not a blank frame


def test_simulator_processes_do_not_load_torch(played: dict) -> None:
    for proc in played["_processes"]:
        assert not proc["torch_mapped"], proc


PROBE = textwrap.dedent("""
    import json, resource, sys, warnings
    import numpy as np
    from vla_scale.envs.libero import LiberoEnv
    from vla_scale.envs.types import TaskSpec

    env = LiberoEnv(camera_resolution=128, settle_steps=10)
    env.reset(TaskSpec("libero_spatial", 0, 0))
    inner = env._env.env  # place the goal's object above its target: LIBERO's own predicate must then hold
    relation, obj, target = inner.parsed_problem["goal_state"][0]
    above = inner.sim.data.body_xpos[inner.obj_body_id[target]] + np.array([0.0, 0.0, 0.05])
    inner.sim.data.set_joint_qpos(inner.objects_dict[obj].joints[-1], np.concatenate([above, [1, 0, 0, 0]]))
    inner.sim.forward()
    noop = np.tile([0, 0, 0, 0, 0, 0, -1.0], (8, 1))
    steps = [env.step(noop)]
    while not steps[-1].done and len(steps) < 4:
        steps.append(env.step(noop))
    from gymnasium.utils.env_checker import check_env
    from vla_scale.envs.gym_adapter import GymEnv
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(GymEnv(env, suite="libero_spatial", task_id=0, init_state_ids=[0, 1]), skip_render_check=True)
    hard = LiberoEnv(camera_resolution=128, settle_steps=10, hard_reset=True)  # rebuilt at every reset, as LIBERO
    task = TaskSpec("libero_spatial", 0, 1)
    soft_obs, hard_obs = env.reset(task), hard.reset(task)  # `env` has played episodes since its build
    same = all(np.array_equal(soft_obs.images[k], hard_obs.images[k]) for k in soft_obs.images)
    print(json.dumps({"soft_equals_hard": same and bool(np.array_equal(soft_obs.proprio, hard_obs.proprio)),
                      "relation": relation, "success": steps[-1].success, "done": steps[-1].done,
                      "reward": steps[-1].reward, "torch": sorted(m for m in sys.modules if m.startswith("torch")),
                      "warnings": [str(w.message) for w in caught if "infinity" not in str(w.message)],
                      "maxrss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""")


@pytest.fixture(scope="module")
def probe() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_success_is_libero_predicate(probe: dict) -> None:
    assert probe["relation"] == "on"
    assert probe["success"] and probe["done"] and probe["reward"] == 1.0


def test_soft_reset_gives_the_observation_of_a_rebuilt_scene(probe: dict) -> None:
    assert probe["soft_equals_hard"]


def test_a_simulator_process_imports_no_torch(probe: dict) -> None:
    assert probe["torch"] == []


def test_gymnasium_check_env_passes_on_libero(probe: dict) -> None:
    assert probe["warnings"] == [], probe["warnings"]
