"""A run directory is resumed only with the model, algorithm and number of ranks it trained with."""

from __future__ import annotations

import os
from dataclasses import replace

from vla_scale import checkpoint
from vla_scale.config import AlgoConfig, ModelConfig


def _saved_run(tmp_path, model: ModelConfig, algo: AlgoConfig, ranks: int) -> str:
    run = str(tmp_path / "run")
    step = os.path.join(checkpoint.checkpoint_root(run), "step_2")
    os.makedirs(step)
    checkpoint.write_run_config(step, {"model": model, "algo": algo}, ranks)
    for rank in range(ranks):
        checkpoint.write_trainer_state(step, rank, {"step": 2})
    open(os.path.join(step, "zero_pp_rank_0_mp_rank_00_model_states.pt"), "wb").close()  # only its name is read
    checkpoint.mark_latest(run, "step_2")
    return run


def _groups(model: ModelConfig, algo: AlgoConfig) -> dict:
    return {"model": model, "algo": algo}


def test_the_same_configuration_resumes(tmp_path):
    model, algo = ModelConfig(timm_model_ids=["a", "b"]), AlgoConfig()
    run = _saved_run(tmp_path, model, algo, 2)
    assert checkpoint.resume_problems(run, _groups(model, algo), 2) == []
    assert checkpoint.resume_problems(run, _groups(replace(model, checkpoint="/moved/folder"), algo), 2) == []


def test_another_model_algorithm_or_rank_count_is_refused_naming_each_key(tmp_path):
    model, algo = ModelConfig(), AlgoConfig()
    run = _saved_run(tmp_path, model, algo, 1)
    problems = checkpoint.resume_problems(run, _groups(replace(model, hidden_size=128), replace(algo, lr=1e-5)), 2)
    text = "\n".join(problems)
    assert len(problems) == 3
    assert "model.hidden_size=128 but the run trained with 96" in text
    assert "algo.lr=1e-05 but the run trained with 0.0003" in text
    assert "trained on 1 rank(s), this command has 2" in text


def test_a_run_without_checkpoints_or_with_a_dangling_latest_is_refused(tmp_path):
    model, algo = ModelConfig(), AlgoConfig()
    assert "has no checkpoint" in checkpoint.resume_problems(str(tmp_path / "empty"), _groups(model, algo), 1)[0]
    run = _saved_run(tmp_path, model, algo, 1)
    checkpoint.mark_latest(run, "step_9")
    (problem,) = checkpoint.resume_problems(run, _groups(model, algo), 1)
    assert "names 'step_9', which is not a step folder in" in problem


def test_a_damaged_step_is_refused_naming_the_file(tmp_path):
    model, algo = ModelConfig(), AlgoConfig()
    run = _saved_run(tmp_path, model, algo, 1)
    step = os.path.join(checkpoint.checkpoint_root(run), "step_2")
    with open(os.path.join(step, "trainer_state_rank0.json"), "w") as f:
        f.write('{"step": 2, "ver')  # a save cut short
    (problem,) = checkpoint.resume_problems(run, _groups(model, algo), 1)
    assert "trainer_state_rank0.json is unreadable" in problem and "earlier step" in problem
    os.remove(os.path.join(step, "trainer_state_rank0.json"))
    assert "trainer_state_rank0.json is missing" in checkpoint.resume_problems(run, _groups(model, algo), 1)[0]
    checkpoint.write_trainer_state(step, 0, {"step": 2})
    os.remove(os.path.join(step, "zero_pp_rank_0_mp_rank_00_model_states.pt"))
    assert "no DeepSpeed model states" in checkpoint.resume_problems(run, _groups(model, algo), 1)[0]


def test_latest_step_reads_the_step_from_the_pointer(tmp_path):
    run = _saved_run(tmp_path, ModelConfig(), AlgoConfig(), 1)
    assert checkpoint.latest_step(run) == 2
    assert checkpoint.latest_step(str(tmp_path / "none")) is None


def test_a_run_of_another_kind_is_refused(tmp_path):
    """A supervised fine-tune's run directory holds `sft`, not `algo`: an RL resume there says what to do instead."""
    model, algo = ModelConfig(), AlgoConfig()
    run = _saved_run(tmp_path, model, algo, 1)
    from vla_scale.config import SftConfig

    (problem,) = checkpoint.resume_problems(run, {"model": model, "sft": SftConfig()}, 1)
    assert "holds algo, not sft" in problem and f"model.checkpoint={run}" in problem
