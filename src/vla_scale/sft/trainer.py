"""Supervised fine-tuning on demonstrations, on the RL run's stack: the ZeRO-3 actor (LoRA or full), TensorBoard,
the progress bar, checkpoints through `checkpoint.write_checkpoint`, `resume=true`, SIGTERM.

Everything a run could trip on is checked in the constructor, before any weight is built: the configuration, the
dataset's metadata against the env and the policy's cameras, its frames, its instructions against the tokenizer and
the prompt budget. The statistics are computed from the demonstrations and become the policy's (`unnorm_key` = the
env's suite), so the checkpoint folder this run writes acts in the env as `model.checkpoint=<run_dir>` for
launch/train.py and launch/eval.py.

One step: every rank draws the same `sft.batch_size` example indices from one seeded generator, takes its share and
splits it into `sft.micro_batches`; the actor accumulates them into one optimizer step.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from typing import Any

import numpy as np

from vla_scale import checkpoint
from vla_scale.config import Config, ConfigError, SftConfig, as_yaml, sft_problems, validate
from vla_scale.datasets.episodes import Episode
from vla_scale.datasets.lerobot import DatasetError, LeRobotKeys, read_dataset
from vla_scale.envs.registry import simulator
from vla_scale.envs.simulator import Simulator
from vla_scale.models.interface import PolicySource, SupervisedBatch
from vla_scale.parallel.ranks import mean_over_ranks
from vla_scale.run_log import RunLogger, progress
from vla_scale.run_policy import vla_for_env
from vla_scale.run_setup import (
    init_distributed,
    launched_world_size,
    make_deterministic,
    resolved_config,
)
from vla_scale.stop_signals import Preempted, StopSignals

RESUME_MAY_DIFFER = ("checkpoint", "steps", "save_every", "log_every")
"""What a resumed fine-tune may change: where the first weights came from, how long it runs, how often it saves and
logs."""


class SftComplete(Exception):
    """A resumed fine-tune has already reached `sft.steps`: there is nothing to do (the entry script exits 0)."""


def dataset_keys(sft: SftConfig, cameras: tuple[str, ...], sim: Simulator) -> LeRobotKeys:
    """The dataset features of the policy's cameras, state and action (`sft.cameras` maps cameras it names, the
    others have the simulator's feature names: `Simulator.image_key`)."""
    mapped = {camera: sft.cameras.get(camera, sim.image_key(camera)) for camera in cameras}
    return LeRobotKeys(mapped, sft.state_key, sft.action_key, setting="sft")


def load_demonstrations(cfg: Config, vla: PolicySource) -> list[Episode]:
    """`sft.dataset`'s episodes at the env's camera resolution, or a ConfigError saying what to change (the
    dataset's own problems, then what the policy's family finds in them: `demonstration_problems`)."""
    sim = simulator(cfg.env.name)
    keys = dataset_keys(cfg.sft, vla.cameras, sim)
    kwargs = cfg.env.simulator_kwargs()
    observed = sim.observation_name(kwargs)
    env_name = f"{cfg.env.name} env.{cfg.env.name}.observation={observed}" if observed else cfg.env.name
    try:
        episodes = read_dataset(cfg.sft.dataset, keys, action_dim=sim.action_dim,
                                state_dim=sim.state_size(kwargs) if vla.reads_state else None,
                                image_size=vla.camera_resolution(cfg.env), env_name=env_name)
    except DatasetError as err:
        raise ConfigError(f"sft.dataset={cfg.sft.dataset}: {err}") from err
    if not episodes:
        raise ConfigError(f"sft.dataset={cfg.sft.dataset} has no episodes: record some first")
    if cfg.sft.first_steps:
        episodes = [e.first(cfg.sft.first_steps) for e in episodes]
    problems = vla.demonstration_problems(episodes)
    if problems:
        raise ConfigError(f"sft.dataset={cfg.sft.dataset}:\n  - " + "\n  - ".join(problems))
    return episodes


class SupervisedTrainer:
    def __init__(self, cfg: Config, run_dir: str, explicit: Collection[str] = (), vla: PolicySource | None = None):
        """Checks everything before any weight is built, then joins the process group: the configuration, the policy
        against the env (`vla`: when the caller checked it already with `run_policy.vla_for_env`), the dataset
        (`load_demonstrations`), a resumed run against its checkpoint."""
        if cfg.deterministic:
            make_deterministic()
        self.world = launched_world_size()
        validate(cfg, self.world)
        problems = sft_problems(cfg, self.world)
        if problems:
            raise ConfigError("cannot fine-tune:\n  - " + "\n  - ".join(problems))
        vla = vla if vla is not None else vla_for_env(cfg.model, cfg.env, explicit)
        if cfg.sft.image_augmentation not in ("auto", *vla.augmentations):
            raise ConfigError(f"sft.image_augmentation={cfg.sft.image_augmentation}: this policy's fine-tuning "
                              f"takes {' or '.join(('auto', *vla.augmentations))}")
        self.episodes = load_demonstrations(cfg, vla)
        self.vla = vla.with_demonstrations(cfg.env.suite, self.episodes)
        self.cfg = cfg = resolved_config(cfg, self.vla)
        self.run_dir = run_dir
        if cfg.resume:
            problems = checkpoint.resume_problems(run_dir, self.run_groups(), self.world, RESUME_MAY_DIFFER)
            if problems:
                raise ConfigError("cannot resume " + run_dir + ":\n  - " + "\n  - ".join(problems))
            done = checkpoint.latest_step(run_dir)
            if done is not None and done >= cfg.sft.steps:
                raise SftComplete(f"{run_dir} is already at step {done} (sft.steps={cfg.sft.steps}): nothing to "
                                  f"train, no file touched; pass sft.steps=<more than {done}> to continue it")
        self.rank, self.world = init_distributed()
        self.step = 0
        self.generator = np.random.default_rng(cfg.seed)
        self.stop = StopSignals()
        self.ready = False

    def run_groups(self) -> dict[str, Any]:
        """The config groups a checkpoint records and a resume must match."""
        return {"model": self.cfg.model, "sft": self.cfg.sft}

    def setup(self) -> None:
        """The logger, the DeepSpeed actor, the examples (images prepared once), a resumed run's checkpoint."""
        import torch

        from vla_scale.parallel.actor import Actor

        cfg = self.cfg
        self.log = RunLogger(self.run_dir, self.rank)
        torch.manual_seed(cfg.seed)
        self.actor = Actor(self.vla.new_policy, cfg.deepspeed, cfg.sft, scorer=self.vla.chunk_scorer(),
                           lora=cfg.model.lora)
        self.examples = self.vla.demonstrations(self.episodes, cfg.sft.image_augmentation)
        if cfg.resume:
            self.load_latest()
        self.stop.install()
        if self.step == 0:
            self.log.text("config", "```\n" + as_yaml(cfg) + "\n```")
        self.ready = True

    def train(self) -> dict[str, float]:
        """`sft.steps` optimizer steps, logged every `sft.log_every`, saved every `sft.save_every` and at the end;
        returns the last logged metrics (the loss and the head's measure averaged over the ranks)."""
        s = self.cfg.sft
        if not self.ready:
            self.setup()
        if self.rank == 0:
            print(f"fine-tuning steps {self.step + 1}-{s.steps} on {len(self.examples)} examples of "
                  f"{len(self.episodes)} episodes", flush=True)
        bar = progress(s.steps, self.step, self.cfg.progress and self.rank == 0, "sft")
        last: dict[str, float] = {}
        while self.step < s.steps:
            stats = self.actor.supervised_update(self.micro_batches())
            self.step += 1
            bar.update(1)
            if self.step % s.log_every == 0 or self.step == s.steps:
                last = {f"sft/{k}": mean_over_ranks(v, self.world, self.actor.device) for k, v in stats.items()}
                last["sft/epoch"] = self.step * s.batch_size / len(self.examples)
                self.log.scalars(last, self.step)
                bar.set_postfix(loss=f"{last['sft/loss']:.3f}")
            saved = bool(s.save_every) and self.step % s.save_every == 0 and self.step < s.steps
            if saved:
                self.save()
            if mean_over_ranks(float(self.stop.requested), self.world, self.actor.device) > 0:
                bar.close()
                if not saved:
                    self.save()
                self.log.close()
                raise Preempted(f"stopped by SIGTERM after step {self.step}, saved as {self.step_folder()}; "
                                f"continue with the same command plus run_dir={self.run_dir} resume=true")
        bar.close()
        if checkpoint.latest_step(self.run_dir) != self.step:
            self.save()
        self.log.close()
        return last

    def micro_batches(self) -> list[SupervisedBatch]:
        """This rank's share of the step's examples, split into `sft.micro_batches` micro-batches of the policy's
        family; the step's draw (examples, the family's noise) is the same on every rank."""
        s = self.cfg.sft
        draw = self.examples.draw(self.generator, s.batch_size)
        share = np.split(np.arange(s.batch_size), self.world)[self.rank]
        return [self.examples.batch(draw, part, self.actor.device) for part in np.split(share, s.micro_batches)]

    def step_folder(self) -> str:
        return os.path.join(checkpoint.checkpoint_root(self.run_dir), f"step_{self.step}")

    def save(self) -> None:
        state = {"step": self.step, "generator": self.generator.bit_generator.state, "rng": checkpoint.rng_state()}
        checkpoint.write_checkpoint(self.run_dir, self.step, self.actor, self.vla, state, self.run_groups(),
                                    self.cfg.sync.bucket_mb, self.cfg.model.lora, env=self.cfg.env)

    def load_latest(self) -> None:
        tag = checkpoint.latest_tag(self.run_dir)
        assert tag is not None  # resume_problems refused a run without one
        self.actor.load(checkpoint.checkpoint_root(self.run_dir), tag)
        state = checkpoint.read_trainer_state(os.path.join(checkpoint.checkpoint_root(self.run_dir), tag), self.rank)
        self.step = state["step"]
        self.generator.bit_generator.state = state["generator"]
        checkpoint.set_rng_state(state["rng"])

    def close(self) -> None:
        self.stop.uninstall()
