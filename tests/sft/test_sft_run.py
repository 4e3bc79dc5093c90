"""Supervised fine-tuning as a run (in process, CPU, gloo): the loss falls, the checkpoint is a policy folder with the
demonstrations' statistics, a resume continues bit for bit, and every bad input is refused before a weight is
built."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT, read_scalars

# before the imports that need it: without PyAV the module is skipped, not a collection error
pytest.importorskip("av", reason="PyAV (the av package) writes and reads the datasets' videos: `make install`")

from vla_scale import checkpoint  # noqa: E402
from vla_scale.config import ConfigError  # noqa: E402
from vla_scale.datasets.episodes import Episode  # noqa: E402
from vla_scale.datasets.lerobot import LeRobotKeys, write_dataset  # noqa: E402
from vla_scale.envs.pick_place import CAMERAS, PickPlaceEnv  # noqa: E402
from vla_scale.envs.pick_place_demo import Demonstrator, play  # noqa: E402
from vla_scale.envs.types import TaskSpec  # noqa: E402
from vla_scale.run_policy import vla_for_env  # noqa: E402
from vla_scale.sft.statistics import dataset_statistics  # noqa: E402
from vla_scale.sft.trainer import SftComplete, SupervisedTrainer  # noqa: E402

KEYS = LeRobotKeys(cameras={c: f"observation.images.{c}" for c in CAMERAS})


@pytest.fixture(scope="module")
def episodes() -> list[Episode]:
    env = PickPlaceEnv(camera_resolution=64, max_steps=40, max_delta=0.02)
    demonstrator = Demonstrator(0.2, 0)
    played = [play(env, TaskSpec("pick_place", i % 4, i), demonstrator) for i in range(4)]
    env.close()
    return [Episode(d.instruction, d.images, d.state, d.actions, d.success) for d in played]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory, episodes) -> Path:
    return write_dataset(tmp_path_factory.mktemp("demos") / "demos", episodes, KEYS, video=False)


def _config(*overrides: str):
    from hydra import compose, initialize_config_dir

    from vla_scale.config import register_configs, to_config

    register_configs()
    base = ["env=pick_place", "model=tiny_pick_place", "model.hidden_size=32", "model.intermediate_size=64",
            "model.num_layers=1", "model.vision_dim=32", "progress=false", "deterministic=true",
            "sft.batch_size=8", "sft.log_every=1"]
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        return to_config(compose(config_name="config", overrides=base + list(overrides)))


def _fine_tune(run: Path, dataset: Path, *overrides: str) -> SupervisedTrainer:
    trainer = SupervisedTrainer(_config(f"sft.dataset={dataset}", *overrides), str(run))
    try:
        trainer.train()
    finally:
        trainer.close()
    return trainer


@pytest.mark.slow  # fine-tunes
def test_the_loss_falls_and_the_checkpoint_is_a_policy_with_the_demonstrations_statistics(tmp_path, dataset,
                                                                                            episodes):
    run = tmp_path / "run"
    _fine_tune(run, dataset, "sft.steps=30", "sft.lr=2e-3")
    loss = [v for _, v in read_scalars(str(run / "tb"))["sft/loss"]]
    assert len(loss) == 30 and np.mean(loss[-5:]) < 0.6 * np.mean(loss[:5])
    folder = Path(checkpoint.checkpoint_root(str(run))) / "step_30"
    assert checkpoint.latest_tag(str(run)) == "step_30"
    saved = json.loads((folder / "dataset_statistics.json").read_text())
    want = dataset_statistics([e.actions for e in episodes], [e.state for e in episodes])
    assert saved["pick_place"]["action"]["q99"] == pytest.approx(want["action"]["q99"])
    cfg = _config(f"model.checkpoint={run}")
    vla = vla_for_env(cfg.model, cfg.env)  # as launch/train.py and launch/eval.py load it
    assert vla.spec.unnorm_key == "pick_place" and vla.cameras == CAMERAS
    assert vla.spec.resolved_convention == "env"


@pytest.mark.slow  # fine-tunes
def test_a_resumed_fine_tune_ends_bit_for_bit_where_an_uninterrupted_one_does(tmp_path, dataset):
    whole = tmp_path / "whole"
    _fine_tune(whole, dataset, "sft.steps=4")
    parts = tmp_path / "parts"
    _fine_tune(parts, dataset, "sft.steps=2")
    _fine_tune(parts, dataset, "sft.steps=4", "resume=true")
    a = (Path(checkpoint.checkpoint_root(str(whole))) / "step_4" / "model.safetensors").read_bytes()
    b = (Path(checkpoint.checkpoint_root(str(parts))) / "step_4" / "model.safetensors").read_bytes()
    assert a == b
    with pytest.raises(SftComplete, match="already at step 4"):
        SupervisedTrainer(_config(f"sft.dataset={dataset}", "sft.steps=4", "resume=true"), str(parts))
    with pytest.raises(ConfigError, match="sft.lr=0.01 but the run trained with"):
        SupervisedTrainer(_config(f"sft.dataset={dataset}", "sft.steps=6", "sft.lr=0.01", "resume=true"), str(parts))


def test_bad_inputs_are_refused_before_any_weight_is_built(tmp_path, dataset, episodes):
    def refused(*overrides: str) -> str:
        with pytest.raises(ConfigError) as err:
            SupervisedTrainer(_config(*overrides), str(tmp_path / "never"))
        assert not (tmp_path / "never").exists()
        return str(err.value)

    assert "sft.dataset is not set" in refused()
    assert "sft.first_steps=-1 must be >= 0" in refused(f"sft.dataset={dataset}", "sft.first_steps=-1")
    assert "no dataset folder at" in refused(f"sft.dataset={tmp_path / 'missing'}")
    assert "must split evenly" in refused(f"sft.dataset={dataset}", "sft.batch_size=9", "sft.micro_batches=2")
    text = refused(f"sft.dataset={dataset}", "+sft.cameras.wrist=observation.images.hand")
    assert "observation.images.hand" in text
    assert "sft.state_key" in refused(f"sft.dataset={dataset}", "sft.state_key=observation.joints")
    six = [Episode(e.instruction, e.images, e.state, e.actions[:, :6], e.success) for e in episodes[:1]]
    narrow = write_dataset(tmp_path / "six", six, KEYS, video=False)
    assert "map sft.action_key to a 7-dim feature" in refused(f"sft.dataset={narrow}")
    unfinished = shutil.copytree(dataset, tmp_path / "unfinished")
    shutil.rmtree(unfinished / "meta/episodes")  # as a recording leaves it before LeRobotDataset.finalize()
    text = refused(f"sft.dataset={unfinished}")
    assert "has no meta/episodes/" in text and "announces 4 episodes" in text and "record some first" not in text
    strange = [Episode("stack the purple cube", e.images, e.state, e.actions, e.success) for e in episodes[:1]]
    odd = write_dataset(tmp_path / "odd", strange, KEYS, video=False)
    assert "words the policy's tokenizer does not know" in refused(f"sft.dataset={odd}")
    assert "words the policy's tokenizer does not know" in refused(f"sft.dataset={dataset}", "env=reach",
                                                                   "model=tiny")  # another env's tasks


def test_first_steps_trains_on_the_head_of_each_demonstration_with_its_statistics(tmp_path, dataset, episodes):
    """`sft.first_steps=N`: the examples are each episode's first N steps, and the statistics are theirs."""
    trainer = SupervisedTrainer(_config(f"sft.dataset={dataset}", "sft.first_steps=5"), str(tmp_path / "run"))
    assert [len(e) for e in trainer.episodes] == [5] * len(episodes)
    for cut, whole in zip(trainer.episodes, episodes, strict=True):
        assert np.array_equal(cut.actions, whole.actions[:5]) and np.array_equal(cut.state, whole.state[:5])
        assert all(np.array_equal(cut.images[c], whole.images[c][:5]) for c in CAMERAS)
    want = dataset_statistics([e.actions[:5] for e in episodes], [e.state[:5] for e in episodes])
    assert trainer.vla.spec.norm_stats["pick_place"]["action"]["q99"] == pytest.approx(want["action"]["q99"])
    assert want["action"]["q99"] != pytest.approx(dataset_statistics([e.actions for e in episodes],
                                                                      [e.state for e in episodes])["action"]["q99"])
    assert episodes[0].first(10_000) is episodes[0]


@pytest.mark.slow
def test_launch_sft_output_loads_for_rl_and_eval_with_the_same_policy_line(tmp_path, dataset):
    """`python launch/sft.py ...` as a user runs it; its run directory is `model.checkpoint=` for one RL step of
    launch/train.py and for launch/eval.py, which describe the policy alike."""
    from conftest import run_script

    small = ["env=pick_place", "model=tiny_pick_place", "model.hidden_size=32", "model.intermediate_size=64",
             "model.num_layers=1", "model.vision_dim=32", "progress=false"]
    run = tmp_path / "sft"
    proc = run_script("sft", *small, f"sft.dataset={dataset}", "sft.steps=3", "sft.batch_size=8", f"run_dir={run}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1].startswith("sft: steps=3 loss=")
    assert proc.stdout.strip().endswith(f"checkpoint={run / 'checkpoints' / 'step_3'}")
    loaded = [*small[:2], f"model.checkpoint={run}", "parallel.num_workers=1", "parallel.sims_per_worker=2",
              "env.num_eval_init_states=1", "env.max_steps=8", "progress=false"]
    train = run_script("train", *loaded, "algo.batch_size=2", "algo.group_size=2", "algo.mini_batches=1",
                       "algo.micro_batches=1", "steps=1", "eval_every=10", "save_every=0", f"run_dir={tmp_path / 'rl'}")
    evaluation = run_script("eval", *loaded, f"run_dir={tmp_path / 'eval'}")
    lines = []
    for done in (train, evaluation):
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        lines.append(next(line for line in done.stdout.splitlines() if "policy:" in line).split("policy:")[1].strip())
    assert lines[0].startswith(f"{run / 'checkpoints' / 'step_3'}: images agentview+wrist")
    assert lines[1].startswith(lines[0])  # eval adds its protocol after the description
    assert "statistics 'pick_place'" in lines[0]


@pytest.mark.slow  # fine-tunes
def test_a_sigterm_finishes_the_step_saves_it_and_says_how_to_resume(tmp_path, dataset):
    import os
    import signal

    from vla_scale.stop_signals import Preempted

    run = tmp_path / "run"
    trainer = SupervisedTrainer(_config(f"sft.dataset={dataset}", "sft.steps=50"), str(run))
    trainer.setup()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # a real signal, handled by the run's own handler
        with pytest.raises(Preempted, match=f"run_dir={run} resume=true"):
            trainer.train()
    finally:
        trainer.close()
    assert checkpoint.latest_step(str(run)) == 1
    assert checkpoint.resume_problems(str(run), trainer.run_groups(), 1) == []
