"""Whole GRPO steps at a model's shape on one device, ours beside the anchors' way of running them, in one process.

    python benchmarks/rl_step.py --model oft_7b                    # one H200: ~10 min
    python benchmarks/rl_step.py --model oft_7b --sim-ms 26        # simulators as costly per env step as LIBERO's
    python benchmarks/rl_step.py --model tiny --dry-run            # CPU: the whole script in seconds (make test)
    python benchmarks/rl_step.py --model oft_7b --memory-gib 80 --dry-run  # CPU: its plan and memory, in seconds

The trainer is built as `launch/train.py` builds it (`Trainer`: the ZeRO-3 actor under the `zero3_bf16` settings,
the rollout engine on the same device, the embedded reach task's simulators in their processes, rendering through
EGL), and runs `--steps` RL steps (`Trainer.train_step`: rollout, old log-probs, update, weight sync) in each of two
ways, ours first. Both use SimpleVLA-RL's loss (old log-probs recomputed before the update: `algo.old_logprobs=
recompute`) and take one optimizer step per RL step (its recipe, configs/oft_libero.yaml, takes four).

- ours: `--stages` pipeline stages, the engine's fast decode of a whole stage at once, the next step's resets sent
  before the update; the update in micro-batches of `--micro-batch` samples, prompt padding trimmed per
  micro-batch, the old log-probs read off the update's own forward (with one optimizer step there is no recompute
  pass: `algo.old_logprobs_from_update`), the optimizer states in pinned host memory, visiting the GPU one sub-group
  at a time for the step (`deepspeed.stream_optimizer_states`);
- anchors (SimpleVLA-RL / RLinf as they run it): one stage, the plain decode with transformers' eager attention in
  micro-batches of 8, no reset during the update; the update in micro-batches of 16 samples (SimpleVLA-RL's
  16-step pieces of a trajectory) over the prompt budget's padding, after a recompute pass over every sample, with
  the whole optimizer state on the GPU during the update (moved to the host between updates, which is kinder to
  them than SimpleVLA-RL's CPU offload of the optimizer); after the update SimpleVLA-RL's extra no-gradient forward
  over every sample for its entropy metric (its trainer's `compute_entropy`, micro-batches of one trajectory: 64
  chunk steps; ours reads the entropy off the update's own logits). The sync and the rest of the update are the same
  code in both.

`--memory-gib N` caps the process's GPU memory at N GiB (the allocator's per-process fraction) from the start through
our way's steps, so "fits an N GB GPU" is shown, not claimed; the anchors' way then runs uncapped (it needs ~119 GiB).

`--sim-ms` gives the reach task's simulators real physics work (`env.reach.physics_substeps`, calibrated here to that
many CPU ms per env step) so that simulation costs what LIBERO's does: 26 ms of CPU per env step outside rendering,
measured for libero_spatial on the 2-core CPU machine (docs/performance.md). Per step it prints: rollout (decode busy,
decode waiting on the simulators, simulator busy and idle per process), recompute, update (seconds and MFU at the
matmul rate this run measures), colocated-memory moves, sync, env steps/s and peak device memory. After the steps,
the same update runs alone on the last step's samples (the update's own figure, beside its figure inside the loop).
Each phase's peak GPU memory is in the table (rollout, update, sync; the step's peak is the largest). Last line:
`rl_step: step_speedup=<x.xx> rollout_speedup=<y.yy> update_mfu=<z.zz> peak_gib=<m>` (peak_gib: our way's).

The pair in two calls, each under a device call's limit (the anchors' way alone takes ~5 min and ~119 GiB):
`--only-anchors --json A.json` runs only the anchors' way and writes its rows (last line `rl_step anchors: step_s=...
rollout_s=... device=... json=...`); `--anchors-from A.json` then runs our way only and prints the speedups against
those rows. The two must time the same shape (`SHAPE_KEYS`: model, groups, group size, episode length, simulator
cost, workers, simulators, LoRA rank), which is checked before anything is built; our way's own settings (memory cap,
stages, micro-batch, staleness) may differ. The file records the card it ran on.

`--action-head l1` runs our way with the L1-regression head and its Gaussian (`model.action_head=l1`, a fresh head
at the model's shape) instead of the LM head's bins; the anchors' way is then left out (they cannot train that head),
so the two heads are compared by two runs of the same command, `--only-ours`, one per head.

`--max-staleness 1` runs our way with `algo.max_staleness=1` (`algo.tis_cap=2.0`; the engine's weights and the
actor's states then stay on the GPU through the update): each step's update overlaps the next step's rollout. The
anchors' way is unchanged. A row's rollout columns are the rollout played during that step ("rollout s": in the
step's own rollout phase, "ahead s": during its update; "wait s": what the sync then waited for it; "ahead first":
its decodes went before the update's kernels, `rollout/ahead_urgent`); "GPU busy" is the mean of NVML's utilisation
(share of time some kernel ran) sampled through the step.

`--algo ppo` runs our way twice, each in a process of its own: with GRPO, then with PPO's critic (`algo=ppo` over
the same episodes, groups of one), and prints both rows and `rl_step ppo: step_ratio=<ppo / grpo> update_ratio=...
peak_gib=<ppo's> grpo_peak_gib=...`: what the value head and its pass before the update cost.

The update's levers, as `benchmarks/update_profile.py` names them, so that its best row runs as whole steps:
`--recompute-layers K` (`deepspeed.recompute_layers`: the first K Llama layers recompute, the rest keep their
activations), `--resident N` (`deepspeed.resident_sub_groups`: N sub-groups' optimizer states stay on the GPU) and
`--update-precision fp8` (`deepspeed.update_precision`: the blocks' matrix products, forward and backward, on FP8
tensor cores; on the CPU, a dry run, the same quantisation multiplied in float32: `fp8_emulated`). Our way only: the
anchors' way keeps its own update (every layer recomputed, bf16 products). The last line then carries our way's mean
step and the precision: `... step_s=<s> update_precision=<bf16|fp8>`.

`--precision fp8` runs our way's rollouts on the FP8 engine (`rollout.precision=fp8`; the table's mismatch
columns are then its gap to the actor, `train/mismatch_*`) and, after its steps, one rollout each with the FP8 and
the bf16 products on the same engine and fleet settings, side by side (`rl_step rollouts fp8: ...`; with
`--rollout-sweep`, before the sweep).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

from vla_scale.batches import Sample, policy_inputs  # noqa: E402
from vla_scale.config import Config, ConfigError, register_configs, to_config, validate  # noqa: E402
from vla_scale.models.oft.processor import PolicyInputs  # noqa: E402
from vla_scale.rollout.engine import Decoded, RolloutEngine  # noqa: E402
from vla_scale.rollout.env_loop import EnvLoop  # noqa: E402
from vla_scale.rollout.stack import start_fleet  # noqa: E402
from vla_scale.trainer import ColocatedMemory  # noqa: E402

ANCHOR_MICRO_BATCH = 8  # observations per decode
ANCHOR_UPDATE_MICRO_BATCH = 16  # samples per update micro-batch
sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode import matmul_rate, set_attention  # noqa: E402


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="oft_7b")
    p.add_argument("--groups", type=int, default=12, help="algo.batch_size: task groups per step")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-steps", type=int, default=64, help="env steps per episode (chunks of 8)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--sims", type=int, default=6, help="simulator processes per worker")
    p.add_argument("--stages", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="timed RL steps of each way")
    p.add_argument("--warmup-steps", type=int, default=1,
                   help="untimed steps first (the optimizer state's first allocation and pinning happen in them)")
    p.add_argument("--micro-batch", type=int, default=64,
                   help="samples per update micro-batch, ours (about; the anchors' way takes 16)")
    p.add_argument("--memory-gib", type=float, default=0.0,
                   help="cap the GPU memory at this many GiB through our way's steps (0: no cap)")
    p.add_argument("--sim-ms", type=float, default=0.0, help="CPU ms of physics per env step (0: none added)")
    p.add_argument("--rollout-sweep", type=float, nargs="*", default=None, metavar="SIM_MS",
                   help="rollouts only (no update), at each of these simulator costs (CPU ms per env step): ours at "
                        "S = 1 and --stages against the anchors' way")
    p.add_argument("--lora-rank", type=int, default=0,
                   help="train LoRA adapters of this rank (model.lora.rank; both ways), 0: full-parameter")
    p.add_argument("--only-ours", action="store_true", help="our way only (no anchors' steps, no speedups)")
    p.add_argument("--only-anchors", action="store_true",
                   help="the anchors' way only, its rows written to --json for a later --anchors-from")
    p.add_argument("--anchors-from", default="", metavar="JSON",
                   help="our way only, the speedups against the anchors' rows of an --only-anchors run's --json")
    p.add_argument("--update-sweep", type=int, nargs="*", default=None, metavar="SAMPLES",
                   help="after the warm-up steps, only our update alone at each of these micro-batch sizes")
    p.add_argument("--max-staleness", type=int, default=0, choices=(0, 1),
                   help="our way's algo.max_staleness (1: the next rollout during the update)")
    p.add_argument("--precision", default="bf16", choices=("bf16", "fp8"), help="our way's rollout.precision")
    p.add_argument("--update-precision", default="bf16", choices=("bf16", "fp8"),
                   help="our way's deepspeed.update_precision (fp8: the blocks' products on FP8 tensor cores; "
                        "fp8_emulated on the CPU)")
    p.add_argument("--recompute-layers", type=int, default=None, metavar="K",
                   help="our way's deepspeed.recompute_layers (-1: every layer; default: the config's)")
    p.add_argument("--resident", type=int, default=None, metavar="N",
                   help="our way's deepspeed.resident_sub_groups (optimizer states' sub-groups kept on the GPU)")
    p.add_argument("--action-head", default="tokens", choices=("tokens", "l1"),
                   help="model.action_head: l1 trains the L1-regression head's Gaussian (our way only: the anchors "
                        "cannot train it)")
    p.add_argument("--algo", default="grpo", choices=("grpo", "ppo"),
                   help="ppo: our way with PPO's critic (algo=ppo: a value head, its values read in a pass before the "
                        "update) beside our way with GRPO, each in a process of its own, and their ratios (the "
                        "anchors' way left out)")
    p.add_argument("--run-algo", default="", choices=("", "grpo", "ppo"), help=argparse.SUPPRESS)
    p.add_argument("--dry-run", action="store_true",
                   help="CPU: the script end to end at a small batch with the policy shrunk to a few thousand "
                        "parameters; for a model with timm towers (oft_7b), which do not shrink, its plan and memory "
                        "arithmetic at its size instead, no weight built")
    p.add_argument("--json", default="", help="write every figure here too")
    p.add_argument("--kernels", default="eager", choices=("eager", "liger"),
                   help="model.kernels of our way (liger: Liger Kernel's Triton kernels; the anchors' way is then "
                        "left out, as their trainers run the eager layers, unless --anchors-from gives their rows)")
    args = p.parse_args()
    args.shape = {k: getattr(args, k) for k in SHAPE_KEYS} | {"dry_run": args.dry_run}  # as asked, before a dry run
    problem = split_problem(args)
    if problem:
        p.error(problem)
    return args


SHAPE_KEYS = ("model", "groups", "group_size", "max_steps", "sim_ms", "workers", "sims", "lora_rank")
"""What must match between an --only-anchors run and the --anchors-from run that reads its rows."""


def split_problem(args: argparse.Namespace) -> str | None:
    """Why the pair of calls `--only-anchors` / `--anchors-from` cannot run as asked (None when it can), before
    anything is built."""
    if args.only_anchors:
        if args.only_ours or args.anchors_from:
            return "--only-anchors runs the anchors' way alone: leave out --only-ours and --anchors-from"
        if args.action_head != "tokens" or args.algo != "grpo" or args.rollout_sweep is not None \
                or args.update_sweep is not None:
            return ("--only-anchors times the anchors' GRPO steps with the LM head's bins: leave out --action-head, "
                    "--algo, --rollout-sweep and --update-sweep")
        if not args.json:
            return "--only-anchors writes its rows for a later --anchors-from: give --json FILE"
    if not args.anchors_from:
        return None
    path = Path(args.anchors_from)
    try:
        saved = json.loads(path.read_text())
        anchors = [r for r in saved["rows"] if r["way"] == "anchors"]
        shape = saved["shape"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        return f"--anchors-from {path}: not the --json of an --only-anchors run ({err!r}); run one first"
    if not anchors:
        return f"--anchors-from {path}: it holds no anchors' rows; write it with --only-anchors --json {path}"
    differ = [f"--{k.replace('_', '-')} {shape.get(k)} there, {v} here" for k, v in args.shape.items()
              if shape.get(k) != v]
    if differ:
        return f"--anchors-from {path} timed another shape: {'; '.join(differ)}. Give this run the same"
    args.only_ours = True
    return None


def trainer_config(args: argparse.Namespace, substeps: int, gpu: bool | None = None,
                   shrink: bool | None = None, check: bool = True, extra: Sequence[str] = ()) -> Config:
    """The run's configuration, `check`ed (`validate`). `gpu`: the settings of a run on a GPU or on the CPU (None:
    this machine's); `shrink`: the policy shrunk to a few thousand parameters (None: with --dry-run); `extra`: more
    overrides, last (another family's model keys)."""
    from hydra import compose, initialize_config_dir

    gpu = torch.cuda.is_available() if gpu is None else gpu
    shrink = args.dry_run if shrink is None else shrink
    moves = gpu and not args.max_staleness  # what the engine and the actor's states leave the GPU for, in turn
    episodes = args.groups * args.group_size
    samples = episodes * -(-args.max_steps // 8)
    overrides = [
        f"model={args.model}", "model.proprio_dim=4", f"model.lora.rank={args.lora_rank}",  # the reach task's proprio
        f"model.action_head={args.action_head}", f"model.kernels={getattr(args, 'kernels', 'eager')}",
        *algo_overrides(args),
        "algo.mini_batches=1", f"algo.micro_batches={max(1, samples // args.micro_batch)}",
        "algo.old_logprobs=recompute", "algo.old_logprobs_from_update=true", "deepspeed.stream_optimizer_states=true",
        "deepspeed.trim_prompt_padding=true",
        "algo.max_resample_rounds=0", "algo.filter_low=0", "algo.filter_high=1",  # every group kept: fixed work
        "env=reach", "env.reach.max_delta=1e-9",  # the end effector stays put: no episode ends early, the same work
        f"env.max_steps={args.max_steps}", "env.camera_resolution=0", f"parallel.num_workers={args.workers}",
        f"parallel.sims_per_worker={args.sims}", f"rollout.pipeline_stage_num={args.stages}",
        f"rollout.precision={args.precision}",
        f"env.reach.physics_substeps={substeps}", "parallel.step_timeout_s=600", "progress=false", "save_every=0",
        f"deepspeed={'zero3_bf16' if gpu else 'zero3'}",
        f"deepspeed.offload_states_during_rollout={str(moves).lower()}",
        f"deepspeed.release_engine_during_update={str(moves).lower()}",
    ]
    if args.max_staleness:
        overrides += [f"algo.max_staleness={args.max_staleness}", "algo.tis_cap=2.0"]
    overrides += lever_overrides(args, gpu)
    overrides += list(extra)
    register_configs()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = to_config(compose(config_name="config", overrides=overrides))
    if shrink:
        cfg = replace(cfg, model=replace(cfg.model, hidden_size=32, intermediate_size=64, num_layers=1,
                                         vision_dim=32, num_heads=2))
    return validate(cfg) if check else cfg


def update_precision(name: str, gpu: bool) -> str:
    """`deepspeed.update_precision` for `--update-precision name`: fp8 on FP8 tensor cores on a GPU; on the CPU
    (dry runs) the same quantisation multiplied in float32, `fp8_emulated`, which the run's lines then name."""
    return "fp8_emulated" if name == "fp8" and not gpu else name


def lever_overrides(args: argparse.Namespace, gpu: bool) -> list[str]:
    """The update's levers (`--recompute-layers`, `--resident`, `--update-precision`) as config overrides; the ones
    not given keep the config's values."""
    out = [f"deepspeed.update_precision={update_precision(getattr(args, 'update_precision', 'bf16'), gpu)}"]
    if getattr(args, "recompute_layers", None) is not None:
        out.append(f"deepspeed.recompute_layers={args.recompute_layers}")
    if getattr(args, "resident", None) is not None:
        out.append(f"deepspeed.resident_sub_groups={args.resident}")
    return out


def algo_overrides(args: argparse.Namespace) -> list[str]:
    """The run's algorithm: GRPO's groups, or PPO over the same episodes (groups of one; its critic's value head
    with ppo.yaml's settings)."""
    if (args.run_algo or "grpo") == "ppo":
        return ["algo=ppo", f"algo.batch_size={args.groups * args.group_size}", "algo.group_size=1"]
    return ["algo=grpo", f"algo.batch_size={args.groups}", f"algo.group_size={args.group_size}"]


def beside_grpo(args: argparse.Namespace) -> None:
    """`--algo ppo`: this script with our way's GRPO, then with PPO, each in a process of its own (one GPU's memory
    each), their rows side by side and `rl_step ppo: step_ratio=<ppo / grpo> update_ratio=... peak_gib=...
    grpo_peak_gib=...`."""
    import subprocess

    summary: dict[str, dict] = {}
    for algo in ("grpo", "ppo"):
        out = tempfile.mktemp(prefix=f"rl_step_{algo}_", suffix=".json")
        cmd = [sys.executable, *[a for a in sys.argv if not a.startswith("--algo") and a != "ppo"],
               "--only-ours", "--run-algo", algo, "--json", out]
        print(f"rl_step {algo}: {' '.join(cmd[1:])}", flush=True)
        if subprocess.run(cmd).returncode != 0:
            sys.exit(f"the {algo} run failed (its output is above)")
        with open(out) as f:
            summary[algo] = json.load(f)
    rows = {algo: [r for r in data["rows"] if r["way"] == "ours"] for algo, data in summary.items()}

    def mean(algo: str, key: str) -> float:
        return float(np.mean([r[key] for r in rows[algo]]))

    print("\n| algo | step s | update s | of which proximal pass s | sync s | peak GiB |\n|---|---|---|---|---|---|")
    for algo in rows:
        print(f"| {algo} | {mean(algo, 'step_s'):.1f} | {mean(algo, 'time/update_s'):.1f} | "
              f"{mean(algo, 'time/recompute_s'):.1f} | {mean(algo, 'time/sync_s'):.1f} | "
              f"{max(r['peak_gib'] for r in rows[algo]):.1f} |")
    print(f"rl_step ppo: step_ratio={mean('ppo', 'step_s') / mean('grpo', 'step_s'):.3f} "
          f"update_ratio={mean('ppo', 'time/update_s') / mean('grpo', 'time/update_s'):.3f} "
          f"peak_gib={max(r['peak_gib'] for r in rows['ppo']):.1f} "
          f"grpo_peak_gib={max(r['peak_gib'] for r in rows['grpo']):.1f}", flush=True)


def anchors_update(cfg: Config, samples: int) -> Config:
    """The anchors' update settings (module docstring) over ours: 16-sample micro-batches, a recompute pass, the
    prompt budget's padding, the optimizer state resident on the GPU during the update."""
    algo = replace(cfg.algo, micro_batches=max(1, samples // ANCHOR_UPDATE_MICRO_BATCH),
                   old_logprobs_from_update=False, max_staleness=0, tis_cap=0.0)
    gpu = torch.cuda.is_available()
    ds = replace(cfg.deepspeed, stream_optimizer_states=False, trim_prompt_padding=False,
                 offload_states_during_rollout=gpu, release_engine_during_update=gpu, recompute_layers=-1,
                 resident_sub_groups=0, update_precision="bf16")
    return replace(cfg, algo=algo, deepspeed=ds)


def use_update_settings(trainer, cfg: Config) -> None:
    """Run the trainer's next updates with `cfg`'s algorithm and actor settings (its engine stays as built)."""
    trainer.cfg = cfg
    trainer.memory = ColocatedMemory(trainer.actor, trainer.engine, cfg.deepspeed)
    trainer.actor.configure(cfg.deepspeed, cfg.algo)
    if cfg.deepspeed.offload_states_during_rollout:  # where a step of these settings finds them: off the GPU
        trainer.actor.offload_states()


def passes(cfg: Config) -> float:
    """Forward-equivalents of model FLOPs per sample in an update: forward + backward through activations and
    weights (3); with LoRA the frozen weights get no gradients (2). Checkpointing's recomputed forward is not
    counted: it is not useful work."""
    return 2.0 if cfg.model.lora.rank else 3.0


def cap_memory(gib: float) -> str:
    """Cap this process's GPU memory at `gib` GiB (0: lift the cap); what was done, for the log."""
    if not torch.cuda.is_available():
        return "no GPU: no memory cap"
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(min(1.0, gib * 2**30 / total) if gib > 0 else 1.0)
    return f"GPU memory capped at {gib:g} GiB of {total / 2**30:.1f}" if gib > 0 else "GPU memory cap lifted"


def substeps_for(ms: float) -> int:
    """mj_step calls per env step that cost `ms` of CPU in the reach task's model on this machine."""
    if ms <= 0:
        return 0
    import mujoco

    from vla_scale.envs.reach import ReachEnv

    env = ReachEnv()
    start = time.process_time()
    for _ in range(20000):
        mujoco.mj_step(env.model, env.data)
    per_step_ms = (time.process_time() - start) / 20000 * 1e3
    env.close()
    return max(1, round(ms / per_step_ms))


class MicroBatchedPlainDecode:
    """The anchors' decode: the policy's plain forward with eager attention, 8 observations at a time."""

    def __init__(self, engine: RolloutEngine, micro_batch: int = ANCHOR_MICRO_BATCH):
        self.engine, self.micro_batch = engine, micro_batch
        self.device = engine.device

    def decode(self, batch: PolicyInputs, temperature: float, greedy: bool = False) -> Decoded:
        parts = []
        for start in range(0, len(batch), self.micro_batch):
            rows = slice(start, start + self.micro_batch)
            parts.append(self.engine.decode(PolicyInputs(*(t[rows] for t in vars(batch).values())), temperature,
                                            greedy))
        return Decoded(np.concatenate([d.tokens for d in parts]), np.concatenate([d.logprobs for d in parts]),
                       np.concatenate([d.actions for d in parts]), parts[0].version)

    def __enter__(self) -> MicroBatchedPlainDecode:
        self._fast, self.engine.fast = self.engine.fast, None
        self._attention = set_attention(self.engine.policy, "eager")
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.fast = self._fast
        set_attention(self.engine.policy, self._attention)


class SequentialLoop(EnvLoop):
    """The anchors' env loop: resets only when a rollout begins (none sent ahead during the update)."""

    def prefetch(self, tasks: list) -> None:
        pass


def warm_up(trainer, cfg: Config) -> float:
    """Compile the engine's fast path (once, for every batch size: a stage's and the whole fleet's, S = 1) before
    anything is timed; seconds it took."""
    from vla_scale.envs.reach import instructions

    start = time.perf_counter()
    rng = np.random.default_rng(0)
    vla, m = trainer.vla, cfg.model
    for batch in (3, trainer.fleet.size // cfg.rollout.pipeline_stage_num, trainer.fleet.size):
        cams = len(vla.cameras)
        images = rng.integers(0, 256, (batch, cams, m.image_size, m.image_size, 3), dtype=np.uint8)
        proprio = rng.uniform(-1, 1, (batch, m.proprio_dim)).astype(np.float32)
        texts = [instructions()[i % 3] for i in range(batch)]
        inputs = vla.processor.from_prepared(images, texts, proprio)
        trainer.engine.decode(inputs, cfg.algo.temperature)
    return time.perf_counter() - start


def forward_flops(trainer, batch_rows: int = 8) -> float:
    """Model FLOPs of one sample's forward (matrix products; FlopCounterMode over the actor's forward with the prompt
    padding trimmed: useful FLOPs, the same count for both ways)."""
    from torch.utils.flop_counter import FlopCounterMode

    trajs = [t for group in trainer.last_batch.groups for t in group]
    samples = [Sample(t, 0, 0) for t in trajs[:batch_rows]]  # episodes of several instructions: their prompts
    inputs, tokens = policy_inputs(samples, trainer.processor)
    with FlopCounterMode(display=False) as counter:
        trainer.actor.logprobs(inputs, tokens)
    return counter.get_total_flops() / len(samples)


def peak_gib(device: torch.device) -> float:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")


def keep_batches(trainer) -> None:
    """The trainer keeps each step's samples (`trainer.last_batch`) for the FLOP count and the update alone."""
    collect = trainer.collect_local

    def collect_and_keep(done: int):
        trainer.last_batch = collect(done)
        return trainer.last_batch

    trainer.collect_local = collect_and_keep


class GpuBusy:
    """The mean of NVML's GPU utilisation (the share of time a kernel ran), sampled every 0.1 s while open; nan
    without a GPU or NVML."""

    def __init__(self, device: torch.device):
        self.device, self.samples = device, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.samples.append(torch.cuda.utilization(self.device) / 100)
            except Exception:  # noqa: BLE001 - no NVML here: no figure
                return

    def __enter__(self) -> GpuBusy:
        if self.device.type == "cuda":
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    @property
    def fraction(self) -> float:
        return float(np.mean(self.samples)) if self.samples else float("nan")


def timed_step(trainer, way: str) -> dict[str, float]:
    device = trainer.actor.device
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    with GpuBusy(device) as busy:
        m = trainer.train_step()
    m["step_s"] = time.perf_counter() - start
    m["gpu_busy"] = busy.fraction
    m.setdefault("time/rollout_wait_s", 0.0)
    m.setdefault("rollout/ahead_urgent", 0.0)
    m["rollout_wall_s"] = m["time/rollout_s"] + m["time/rollout_ahead_s"]  # the rollout played during this step
    phases = [v for k, v in m.items() if k.startswith("memory/") and k.endswith("_peak_gib")]  # device peaks
    m["peak_gib"] = max(phases) if phases else peak_gib(device)
    for phase in ("rollout", "update", "sync"):
        m.setdefault(f"memory/{phase}_peak_gib", float("nan"))
    m["way"] = way
    return m


ENTROPY_MICRO_BATCH = 64  # SimpleVLA-RL's compute_entropy: one trajectory (512 env steps / 8) per forward


def entropy_pass(trainer) -> float:
    """Seconds of the anchors' extra forward after the update: every sample of the step, no gradient, 64 at a time
    (the log-probs' forward: the same FLOPs as their entropy's)."""
    trajs = [t for group in trainer.last_batch.groups for t in group]
    samples = [Sample(t, k, e) for e, t in enumerate(trajs) for k in range(len(t))]
    device = trainer.actor.device
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for first in range(0, len(samples), ENTROPY_MICRO_BATCH):
        trainer.actor.logprobs(*policy_inputs(samples[first : first + ENTROPY_MICRO_BATCH], trainer.processor))
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def rollout_row(trainer, cfg: Config, sim_ms: float, substeps: int, way: str, stages: int) -> dict:
    """One rollout (`Trainer.collect`) on a fleet of its own: `way` ours (fast decode, `stages`) or anchors."""
    env = replace(cfg.env, reach=replace(cfg.env.reach, physics_substeps=substeps))
    fleet = start_fleet(env, cfg.parallel, trainer.vla, trainer.fleet.size, stages)
    try:
        boot = [s for s in trainer.sampler.draw(trainer.groups) for _ in range(cfg.algo.group_size)]
        fleet.send_reset(boot, np.ones(fleet.size, dtype=bool))  # simulators built and reset before the clock starts
        fleet.recv()
        plain = MicroBatchedPlainDecode(trainer.engine) if way == "anchors" else None
        loop_class = SequentialLoop if way == "anchors" else EnvLoop
        saved = trainer.fleet, trainer.loop
        trainer.fleet = fleet
        trainer.loop = loop_class(fleet, plain or trainer.engine, trainer.vla, trainer.max_chunks)  # type: ignore[arg-type]
        with plain or nullcontext():
            start = time.perf_counter()
            batch = trainer.collect()
            seconds = time.perf_counter() - start
        m = trainer.loop.stats.metrics(fleet.num_procs)
        steps = trainer.loop.stats.env_steps
        trainer.fleet, trainer.loop = saved
    finally:
        fleet.close()
    sim_busy = m["rollout/env_utilisation"] * seconds
    return {"sim_ms": sim_ms, "way": way, "S": stages, "rollout_s": seconds,
            "decode_s": m["rollout/decode_utilisation"] * seconds, "sim_busy_s": sim_busy,
            "ms_per_step": 1e3 * sim_busy * fleet.num_procs / max(steps, 1), "env_steps_per_s": steps / seconds,
            "episodes": batch.episodes}


SWEEP_COLUMNS = [("sim_ms", "--sim-ms", "{:g}"), ("ms_per_step", "sim CPU ms/env step (measured)", "{:.1f}"),
                 ("way", "way", "{}"), ("S", "S", "{}"), ("rollout_s", "rollout s", "{:.1f}"),
                 ("decode_s", "decode busy", "{:.1f}"), ("sim_busy_s", "sim busy/proc", "{:.1f}"),
                 ("env_steps_per_s", "env steps/s", "{:.0f}"), ("speedup", "anchors / this", "{:.2f}")]


@contextmanager
def bf16_products(engine: RolloutEngine) -> Iterator[None]:
    """The FP8 engine's fast path on its bf16 weights (the products the bf16 engine runs) for a while."""
    assert engine.fast is not None
    engine.fast.fp8 = None
    try:
        yield
    finally:
        engine.fast.fp8 = engine.fp8


def precision_rows(trainer, cfg: Config, stages: int) -> None:
    """One rollout with the FP8 products and one with bf16's, on the same engine and fleet settings."""
    fp8 = rollout_row(trainer, cfg, 0.0, cfg.env.reach.physics_substeps, "ours fp8", stages)
    with bf16_products(trainer.engine):
        warm_up(trainer, cfg)  # the bf16 products' own compile, before the clock
        bf16 = rollout_row(trainer, cfg, 0.0, cfg.env.reach.physics_substeps, "ours bf16", stages)
    for row in (fp8, bf16):
        row["speedup"] = bf16["rollout_s"] / row["rollout_s"]
        print(" | ".join(fmt.format(row[key]) for key, _, fmt in SWEEP_COLUMNS), flush=True)
    print(f"rl_step rollouts fp8: rollout_s={fp8['rollout_s']:.2f} bf16_rollout_s={bf16['rollout_s']:.2f} "
          f"decode_s={fp8['decode_s']:.2f} bf16_decode_s={bf16['decode_s']:.2f}", flush=True)


def rollout_sweep(trainer, cfg: Config, costs: list[float], stages: int) -> None:
    """Rollout seconds of ours (S = 1 and `stages`) and the anchors' way at each simulator cost, as a table."""
    rows: list[dict] = []
    for ms in costs:
        substeps = substeps_for(ms)
        anchors = rollout_row(trainer, cfg, ms, substeps, "anchors", 1)
        group = [rollout_row(trainer, cfg, ms, substeps, "ours", s) for s in sorted({1, stages})] + [anchors]
        for row in group:
            row["speedup"] = anchors["rollout_s"] / row["rollout_s"]
            print(" | ".join(fmt.format(row[key]) for key, _, fmt in SWEEP_COLUMNS), flush=True)
        rows += group
    lines = ["| " + " | ".join(t for _, t, _ in SWEEP_COLUMNS) + " |", "|" + "---|" * len(SWEEP_COLUMNS)]
    lines += ["| " + " | ".join(fmt.format(r[k]) for k, _, fmt in SWEEP_COLUMNS) + " |" for r in rows]
    print("\n" + "\n".join(lines))
    best = {ms: max(r["speedup"] for r in rows if r["sim_ms"] == ms and r["way"] == "ours") for ms in costs}
    print("rl_step rollouts: " + " ".join(f"sim_ms={ms:g}:rollout_speedup={v:.2f}" for ms, v in best.items()),
          flush=True)


def update_alone(trainer) -> tuple[float, float]:
    """Seconds and peak GiB of `Actor.update` on the last step's samples (old log-probs as the algorithm says,
    as the step runs it), mini-batches planned beforehand (nothing else timed)."""
    plan = trainer.actor.algorithm.plan(trainer.last_batch.trajectories, trainer.cfg.model, trainer.processor,
                                        trainer.mean_over_ranks)
    trainer.memory.for_update()
    device = trainer.actor.device
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    trainer.actor.update(plan, trainer.step)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    peak = peak_gib(device)
    trainer.sync(trainer.version + 1)
    return seconds, peak


def update_sweep(trainer, cfg: Config, sizes: list[int], flops: float, rate: float) -> None:
    """Our update alone on the last step's samples at each micro-batch size (samples per micro-batch), as a table."""
    samples = float(sum(len(t) for g in trainer.last_batch.groups for t in g))
    lines = ["| samples per micro-batch | micro-batches | update s | MFU | peak GiB |", "|---|---|---|---|---|"]
    for size in sizes:
        count = max(1, int(samples) // size)
        use_update_settings(trainer, replace(cfg, algo=replace(cfg.algo, micro_batches=count)))
        try:
            seconds, peak = update_alone(trainer)
            lines.append(f"| {size} | {count} | {seconds:.1f} | {passes(cfg) * flops * samples / seconds / rate:.1%} | "
                         f"{peak:.1f} |")
        except torch.OutOfMemoryError:
            lines.append(f"| {size} | {count} | out of memory | | |")
            trainer.actor.engine.optimizer.zero_grad()
            torch.cuda.empty_cache()
        print(lines[-1], flush=True)
    print("\n" + "\n".join(lines))
    use_update_settings(trainer, cfg)


COLUMNS = [("way", "way", "{}"), ("step_s", "step s", "{:.1f}"), ("time/rollout_s", "rollout s", "{:.1f}"),
           ("time/rollout_ahead_s", "ahead s", "{:.1f}"), ("time/rollout_wait_s", "wait s", "{:.1f}"),
           ("decode_s", "decode busy", "{:.1f}"), ("rollout/decode_wait_s", "decode waits", "{:.1f}"),
           ("sim_busy_s", "sim busy/proc", "{:.1f}"), ("sim_idle_s", "sim idle/proc", "{:.1f}"),
           ("time/recompute_s", "recompute s", "{:.1f}"), ("update_only_s", "update s", "{:.1f}"),
           ("update_mfu", "update MFU", "{:.1%}"), ("entropy_s", "entropy pass s", "{:.1f}"),
           ("time/make_room_s", "moves s", "{:.1f}"),
           ("time/sync_s", "sync s", "{:.2f}"), ("rollout/env_steps_per_s", "env steps/s", "{:.0f}"),
           ("train/samples", "samples", "{:.0f}"),
           ("train/mismatch_abs_log_ratio", "mismatch mean|d|", "{:.2e}"),
           ("train/mismatch_approx_kl", "mismatch k3", "{:.2e}"),
           ("train/mismatch_outside_clip", "mismatch outside clip", "{:.4f}"),
           ("memory/rollout_peak_gib", "rollout GiB", "{:.1f}"),
           ("memory/update_peak_gib", "update GiB", "{:.1f}"), ("memory/sync_peak_gib", "sync GiB", "{:.1f}"),
           ("peak_gib", "peak GiB", "{:.1f}"), ("gpu_busy", "GPU busy", "{:.0%}"),
           ("train/staleness_mean", "staleness", "{:.1f}"), ("rollout/ahead_urgent", "ahead first", "{:.0f}")]


GIB = 2**30
OPTIMIZER_BYTES = 12
"""Per trained parameter: AdamW's fp32 master weight and its two fp32 moments."""


def policy_on_meta(cfg: Config) -> torch.nn.Module:
    """The run's fresh policy (adapters too, with model.lora.rank) on the meta device: every parameter's shape, no
    weight allocated nor initialised."""
    from transformers import initialization

    from vla_scale.envs.registry import simulator
    from vla_scale.models.lora import add_adapters
    from vla_scale.models.oft.policy import OFTPolicy
    from vla_scale.models.tokenizer import WordTokenizer
    from vla_scale.run_policy import spec_from_model_config

    tokenizer = WordTokenizer.from_instructions(simulator(cfg.env.name).instructions(cfg.env.suite))
    spec = spec_from_model_config(cfg.model, tokenizer.vocab_size, tokenizer.eos_id)
    with initialization.no_init_weights():
        policy = OFTPolicy.from_spec(spec, device="meta")
    if cfg.model.lora.rank:
        add_adapters(policy, cfg.model.lora)
    return policy


def memory_plan(cfg: Config, policy: torch.nn.Module) -> dict[str, float]:
    """Bytes of the weights, gradients and optimizer state a one-device run of `cfg` holds, from the parameter counts
    alone, and where each lies in each phase under `cfg.deepspeed` (activations and decode buffers come on top):

    - the actor's weights, 2 bytes a parameter in bf16 (4 in fp32), and a gradient of each trained one alike;
    - the optimizer state, OPTIMIZER_BYTES a trained parameter: in pinned host memory when streamed
      (`deepspeed.stream_optimizer_states`; it visits the GPU one sub-group at a time), else on the GPU, moved to the
      host during the rollout with `deepspeed.offload_states_during_rollout`;
    - the rollout engine's copy of the merged weights (no adapters), bf16, or with `rollout.precision=fp8` one byte a
      parameter of the Llama layers' matrices; released during the update with
      `deepspeed.release_engine_during_update`.
    """
    from vla_scale.models.lora import is_adapter

    named = list(policy.named_parameters())
    width = 2 if cfg.deepspeed.bf16 else 4
    params = sum(p.numel() for _, p in named)
    trained = sum(p.numel() for _, p in named if p.requires_grad)
    served = [(n, p) for n, p in named if not is_adapter(n)]
    fp8 = sum(p.numel() for n, p in served if cfg.rollout.precision == "fp8" and p.ndim == 2
              and n.startswith("language_model.model.layers."))
    actor, grads = params * width, trained * width
    engine = (sum(p.numel() for _, p in served) - fp8) * width + fp8
    optimizer = trained * OPTIMIZER_BYTES
    streamed = cfg.deepspeed.stream_optimizer_states
    ds = cfg.deepspeed
    return {"params": params, "trained": trained, "actor_gib": actor / GIB, "grads_gib": grads / GIB,
            "engine_gib": engine / GIB, "optimizer_gib": optimizer / GIB,
            "rollout_gib": (actor + grads + engine
                            + (0 if streamed or ds.offload_states_during_rollout else optimizer)) / GIB,
            "update_gib": (actor + grads + (0 if ds.release_engine_during_update else engine)
                           + (0 if streamed else optimizer)) / GIB,
            "host_gib": (optimizer if streamed or ds.offload_states_during_rollout else 0) / GIB}


def print_plan(args: argparse.Namespace, cfg: Config) -> bool:
    """The plan of the run `cfg` (the model at its own size, as a GPU runs it: `trainer_config(..., gpu=True,
    shrink=False)`): the samples and micro-batches of a step, the memory arithmetic of both ways (no weight is built)
    and whether our way's weights, gradients and optimizer state leave room under --memory-gib. False when they do
    not."""
    chunks = -(-cfg.env.max_steps // cfg.model.chunk_len)
    episodes = cfg.algo.batch_size * cfg.algo.group_size
    samples = episodes * chunks
    anchors = anchors_update(cfg, samples)
    policy = policy_on_meta(cfg)
    print(f"rl_step plan: model={cfg.model.name} ({cfg.model.action_head} head, lora rank {cfg.model.lora.rank}) "
          f"{episodes} episodes/step x {chunks} chunks = {samples} samples; update in {cfg.algo.micro_batches} "
          f"micro-batches of ~{samples // cfg.algo.micro_batches} (ours), {anchors.algo.micro_batches} of "
          f"~{samples // anchors.algo.micro_batches} (anchors); rollout {cfg.rollout.precision} in "
          f"{cfg.rollout.pipeline_stage_num} stages; {cfg.parallel.num_workers * cfg.parallel.sims_per_worker} "
          "simulator processes", flush=True)
    ok = True
    for way, way_cfg in (("ours", cfg), ("anchors", replace(cfg, deepspeed=replace(
            anchors.deepspeed, offload_states_during_rollout=True, release_engine_during_update=True)))):
        m = memory_plan(way_cfg, policy)
        line = (f"rl_step plan memory ({way}): {m['params'] / 1e9:.3f}B parameters, {m['trained'] / 1e9:.3f}B "
                f"trained; actor {m['actor_gib']:.1f} GiB + gradients {m['grads_gib']:.1f} + optimizer state "
                f"{m['optimizer_gib']:.1f} + engine {m['engine_gib']:.1f}; on the GPU before activations: rollout "
                f"{m['rollout_gib']:.1f} GiB, update {m['update_gib']:.1f} GiB; host {m['host_gib']:.1f} GiB")
        if way == "ours" and args.memory_gib:
            floor = max(m["rollout_gib"], m["update_gib"])
            fits = floor < args.memory_gib
            ok = ok and fits
            line += (f"; {args.memory_gib - floor:.1f} GiB left for activations under --memory-gib "
                     f"{args.memory_gib:g}" if fits else
                     f"; does not fit --memory-gib {args.memory_gib:g}: train LoRA adapters (--lora-rank) or give "
                     "it more memory")
        print(line, flush=True)
        if way == "ours":
            ours = m
    print(f"rl_step plan: model={cfg.model.name} params={ours['params'] / 1e9:.3f}B rollout_gib="
          f"{ours['rollout_gib']:.1f} update_gib={ours['update_gib']:.1f} host_gib={ours['host_gib']:.1f} "
          f"fits={'unchecked' if not args.memory_gib else 'yes' if ok else 'no'}", flush=True)
    return ok


def anchors_alone(args: argparse.Namespace, rows: list[dict], setup_s: float, substeps: int, rate: float,
                  flops: float) -> None:
    """The --only-anchors run's end: its table, its rows in --json (for --anchors-from) and its last line."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print("\n" + table(rows))
    with open(args.json, "w") as f:
        json.dump({"args": vars(args), "shape": args.shape, "device": device, "setup_s": setup_s, "substeps": substeps,
                   "matmul_flops": rate, "forward_flops": flops, "rows": rows}, f, indent=1)
    step_s = float(np.mean([r["step_s"] for r in rows]))
    rollout_s = float(np.mean([r["rollout_wall_s"] for r in rows]))
    print(f"rl_step anchors: step_s={step_s:.2f} rollout_s={rollout_s:.2f} device={device.replace(' ', '_')} "
          f"json={args.json}", flush=True)


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |" for r in rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> None:
    if args.algo == "ppo" and not args.run_algo:
        beside_grpo(args)
        return
    if args.action_head == "l1" or args.kernels != "eager":
        args.only_ours = True  # the anchors' trainers decode LM-head bins only, through the eager layers
    if args.dry_run and (full := trainer_config(args, 0, gpu=True, shrink=False, check=False)).model.timm_model_ids:
        print(f"rl_step dry run: model={args.model}'s pretrained-architecture (timm) vision towers do not shrink to a "
              "CPU run: the plan and its memory arithmetic at the model's size only, its weights are not built (the "
              "script end to end: --model tiny --dry-run)", flush=True)
        try:
            fits = print_plan(args, validate(full))
        except ConfigError as err:
            print(f"rl_step plan: {err}", flush=True)
            fits = False
        sys.stdout.flush()
        os._exit(0 if fits else 1)
    if args.dry_run:
        args.groups, args.group_size, args.max_steps, args.workers, args.sims = 2, 4, 16, 1, 2
        args.steps, args.micro_batch, args.warmup_steps = 1, 8, 0
    from vla_scale.trainer import Trainer

    substeps = substeps_for(args.sim_ms)
    cfg = trainer_config(args, substeps)
    cap = cap_memory(args.memory_gib) if args.memory_gib else ""
    t0 = time.perf_counter()
    trainer = Trainer(cfg, tempfile.mkdtemp(prefix="rl_step_"))
    trainer.setup()
    keep_batches(trainer)
    setup_s = time.perf_counter() - t0
    warm_s = warm_up(trainer, cfg)
    device = trainer.actor.device
    size, dtype = (8192, torch.bfloat16) if device.type == "cuda" else (512, torch.float32)
    rate = matmul_rate(size, size, size, dtype=dtype)
    procs = trainer.fleet.num_procs
    print(f"rl_step setup {setup_s:.1f}s: model={cfg.model.name} action_head={cfg.model.action_head} device={device} "
          "episodes/step="
          f"{cfg.algo.batch_size * cfg.algo.group_size} max_steps={cfg.env.max_steps} sim procs={procs} "
          f"stages={cfg.rollout.pipeline_stage_num} physics substeps/env step={substeps} (--sim-ms {args.sim_ms}) "
          f"matmul {rate / 1e12:.1f} TFLOP/s; decode warm-up (compile) {warm_s:.1f}s; update: "
          f"{cfg.deepspeed.update_precision} products ({trainer.actor.fp8_layers} layers in FP8), recompute_layers="
          f"{cfg.deepspeed.recompute_layers}, resident_sub_groups={cfg.deepspeed.resident_sub_groups}"
          + (f"; {cap} (our way)" if cap else ""), flush=True)
    if args.rollout_sweep is not None:
        if args.precision == "fp8":
            precision_rows(trainer, cfg, args.stages)
        rollout_sweep(trainer, cfg, args.rollout_sweep or [0.0], args.stages)
        trainer.close()
        sys.stdout.flush()
        os._exit(0)
    for _ in range(max(args.warmup_steps, int(args.update_sweep is not None))):
        m = timed_step(trainer, "warm-up")
        print(f"warm-up step {m['step_s']:.1f}s (sync {m['time/sync_s']:.1f}s, update {m['time/update_s']:.1f}s, "
              f"peak {m['peak_gib']:.1f} GiB)", flush=True)
    if args.update_sweep is not None:
        update_sweep(trainer, cfg, args.update_sweep or [args.micro_batch], forward_flops(trainer), rate)
        trainer.close()
        sys.stdout.flush()
        os._exit(0)
    rows: list[dict] = []
    flops = 0.0
    ours_fleet, ours_loop = trainer.fleet, trainer.loop
    samples_per_step = cfg.algo.batch_size * cfg.algo.group_size * trainer.max_chunks
    for way in ("ours",) if args.only_ours else ("anchors",) if args.only_anchors else ("ours", "anchors"):
        if way == "anchors":
            if cap:
                print(cap_memory(0) + " (the anchors' way)", flush=True)
            use_update_settings(trainer, anchors_update(cfg, samples_per_step))
            if trainer.ahead is not None:  # the anchors collect no rollout ahead: ours' last one is dropped
                trainer.ahead.close()
                trainer.ahead, trainer.pending = None, None
            ours_loop.cancel_prefetch()
            trainer.next_specs = None
            trainer.fleet = start_fleet(cfg.env, cfg.parallel, trainer.vla, ours_fleet.size, stages=1)
            plain = MicroBatchedPlainDecode(trainer.engine)
            trainer.loop = SequentialLoop(trainer.fleet, plain, trainer.vla, trainer.max_chunks)  # type: ignore[arg-type]
            context = plain
        else:
            context = None
        with context or nullcontext():
            for _ in range(args.steps):
                m = timed_step(trainer, way)
                m["entropy_s"] = entropy_pass(trainer) if way == "anchors" else 0.0
                m["step_s"] += m["entropy_s"]
                if not flops:
                    flops = forward_flops(trainer)
                m["update_only_s"] = m["time/update_s"] - m["time/recompute_s"]
                m["update_mfu"] = passes(cfg) * flops * m["train/samples"] / m["update_only_s"] / rate
                m["decode_s"] = m["rollout/decode_utilisation"] * m["rollout_wall_s"]
                m["sim_busy_s"] = m["rollout/env_utilisation"] * m["rollout_wall_s"]
                m["sim_idle_s"] = m["rollout/env_wait_s"] / trainer.fleet.num_procs
                rows.append(m)
                print(table([m]).splitlines()[-1], flush=True)
        if way == "anchors":
            trainer.fleet.close()
            trainer.fleet, trainer.loop = ours_fleet, ours_loop
        elif args.precision == "fp8":
            ours_loop.cancel_prefetch()
            trainer.next_specs = None
            precision_rows(trainer, cfg, args.stages)
    if args.only_anchors:
        trainer.close()
        anchors_alone(args, rows, setup_s, substeps, rate, flops)
        return
    use_update_settings(trainer, cfg)
    if cap:
        print(cap_memory(args.memory_gib) + " (our update alone)", flush=True)
    alone_s, _ = update_alone(trainer)
    samples = float(sum(len(t) for g in trainer.last_batch.groups for t in g))
    alone_mfu = passes(cfg) * flops * samples / alone_s / rate
    trainer.close()

    if args.anchors_from:
        saved = json.loads(Path(args.anchors_from).read_text())
        rows += [r for r in saved["rows"] if r["way"] == "anchors"]
        print(f"the anchors' rows from {args.anchors_from} ({saved.get('device', 'device not recorded')})",
              flush=True)
    ours = [r for r in rows if r["way"] == "ours"]
    anchors = [r for r in rows if r["way"] == "anchors"]

    def mean(rs: list[dict], key: str) -> float:
        return float(np.mean([r[key] for r in rs]))

    step_speedup = mean(anchors, "step_s") / mean(ours, "step_s") if anchors else float("nan")
    rollout_speedup = mean(anchors, "rollout_wall_s") / mean(ours, "rollout_wall_s") if anchors else float("nan")
    update_mfu = mean(ours, "update_mfu")
    peak = max(r["peak_gib"] for r in ours)
    print("\n" + table(rows))
    print(f"\nforward {flops / 1e12:.3f} TFLOP per sample; update FLOPs = {passes(cfg):g} x forward x samples; MFU "
          "against "
          f"{rate / 1e12:.1f} TFLOP/s (this run's {'8192^3 bf16' if device.type == 'cuda' else '512^3 fp32'} matmul)")
    print(f"update alone on the last step's {samples:.0f} samples: {alone_s:.1f}s, MFU {alone_mfu:.1%}; inside the "
          f"loop (ours, mean): {update_mfu:.1%} ({update_mfu / alone_mfu:.2f} of alone)")
    if anchors:
        print(f"step_speedup = {mean(anchors, 'step_s'):.1f} / {mean(ours, 'step_s'):.1f}; rollout_speedup = "
              f"{mean(anchors, 'rollout_wall_s'):.1f} / {mean(ours, 'rollout_wall_s'):.1f}"
              + (" (ours: each rollout during the update before)" if args.max_staleness else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "setup_s": setup_s, "substeps": substeps, "matmul_flops": rate,
                       "forward_flops": flops, "alone_s": alone_s, "alone_mfu": alone_mfu, "rows": rows}, f, indent=1)
    print(f"rl_step: step_speedup={step_speedup:.2f} rollout_speedup={rollout_speedup:.2f} "
          f"update_mfu={update_mfu:.2f} peak_gib={peak:.1f} step_s={mean(ours, 'step_s'):.2f} "
          f"update_precision={cfg.deepspeed.update_precision}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # Ray's and DeepSpeed's threads can hold the interpreter at exit


if __name__ == "__main__":
    arguments = parse()  # before the try: --help and a bad argument end here, through argparse's own exit
    try:
        main(arguments)
    except BaseException:
        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)  # as above: an error must end the run, not leave it waiting on those threads
