"""Hydra entry of the trainer: `python launch/train.py [overrides]`, `deepspeed launch/train.py`, `torchrun`
(the launcher's command line made Hydra's by `vla_scale.launcher.hydra_argv`)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from vla_scale.launcher import hydra_argv

sys.argv = hydra_argv(sys.argv)
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

from vla_scale.config import (  # noqa: E402
    ConfigError,
    explicit_keys,
    moved_key_error,
    register_configs,
    to_config,
    validate,
)

register_configs()
if moved := moved_key_error(sys.argv[1:]):
    sys.exit(moved)


@hydra.main(config_path="../configs", config_name="config", version_base="1.3")
def main(dict_cfg: DictConfig) -> float:
    cfg = to_config(dict_cfg)
    run_dir = cfg.run_dir or HydraConfig.get().runtime.output_dir
    try:  # the configuration first: it needs no DeepSpeed, whose import alone takes seconds
        validate(cfg, int(os.environ.get("WORLD_SIZE", "1")))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    from vla_scale.checkpoint import CheckpointWriteError
    from vla_scale.run_log import RunLogError
    from vla_scale.stop_signals import EXIT_CODE, Preempted
    from vla_scale.trainer import RunComplete, SimulatorLost, Trainer

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a file-size limit: a write fails with an error we report

    try:  # the policy against the env, the Ray address, a resumed run's checkpoint: before anything starts
        trainer = Trainer(cfg, run_dir, explicit_keys(HydraConfig.get().overrides.task))
    except ConfigError as err:
        sys.exit(f"error: {err}")
    except RunComplete as done:
        print(done, flush=True)
        return float("nan")
    if trainer.rank == 0:
        print(f"run directory: {run_dir}\ntensorboard:   tensorboard --logdir {os.path.join(run_dir, 'tb')}\n"
              f"policy:        {trainer.vla.describe(trainer.cfg.env)}", flush=True)
    try:
        metrics = trainer.train()
    except Preempted as stopped:
        print(stopped, flush=True)
        sys.exit(EXIT_CODE)
    except (CheckpointWriteError, RunLogError, SimulatorLost) as err:
        sys.exit(f"error: {err}")
    finally:
        trainer.close()
    if trainer.rank == 0:
        print(f"run directory: {run_dir}")
        print("train: steps={} eval_success_rate={:.3f}".format(cfg.steps, metrics["eval/success_rate"]), flush=True)
    return metrics["eval/success_rate"]


if __name__ == "__main__":
    main()
