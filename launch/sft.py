"""Supervised fine-tuning on demonstrations: `python launch/sft.py env=pick_place sft.dataset=DIR [overrides]`, also
under `deepspeed launch/sft.py` or `torchrun` (the same command line handling as launch/train.py).

The policy is `model.*` (a fresh one or `model.checkpoint=`; OpenVLA-OFT, or π0 / π0.5 with `model=pi0_tiny` and
`model.pi0.tokenizer=<SentencePiece model>`), trained on the LeRobot dataset `sft.dataset` by
`vla_scale.sft.trainer.SupervisedTrainer`. The run directory's latest checkpoint is a policy folder with the
demonstrations' statistics: `model.checkpoint=<run_dir>` starts RL from it (launch/train.py) or evaluates it
(launch/eval.py). The last line printed is `sft: steps=<n> loss=<x> checkpoint=<folder>`.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from vla_scale.launcher import hydra_argv, run_to_the_end

sys.argv = hydra_argv(sys.argv)
warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
logging.getLogger("DeepSpeed").setLevel(logging.WARNING)

from vla_scale.config import (  # noqa: E402
    ConfigError,
    explicit_keys,
    moved_key_error,
    register_configs,
    sft_problems,
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
    world = int(os.environ.get("WORLD_SIZE", "1"))
    explicit = explicit_keys(HydraConfig.get().overrides.task)
    try:  # the configuration and the policy against the env first: they need no DeepSpeed nor Llama, whose imports
        validate(cfg, world)  # alone take seconds
        problems = sft_problems(cfg, world)
        if problems:
            raise ConfigError("cannot fine-tune:\n  - " + "\n  - ".join(problems))
        from vla_scale.run_policy import vla_for_env

        vla = vla_for_env(cfg.model, cfg.env, explicit)
    except ConfigError as err:
        sys.exit(f"error: {err}")
    from vla_scale.sft.trainer import SftComplete, SupervisedTrainer

    # the dataset, a resumed run's checkpoint: checked before any weight is built
    ran = run_to_the_end(lambda: SupervisedTrainer(cfg, run_dir, explicit, vla), SftComplete)
    if ran is None:
        return float("nan")
    trainer, metrics = ran
    if trainer.rank == 0:
        print(f"sft: steps={trainer.step} loss={metrics.get('sft/loss', float('nan')):.4f} "
              f"checkpoint={trainer.step_folder()}", flush=True)
    return metrics.get("sft/loss", float("nan"))


if __name__ == "__main__":
    main()
