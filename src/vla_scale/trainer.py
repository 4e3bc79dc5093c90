"""The RL loop, top to bottom: rollout -> update batch -> DeepSpeed update -> weight sync -> eval/log/checkpoint.

One RL step (see docs/ARCHITECTURE.md):
  1. draw B task specs from the TRAIN init states, repeat each `group_size` times under one uid;
  2. play them on the simulator fleet with the rollout engine (temperature sampling);
  3. drop groups whose mean success lies outside [filter_low, filter_high] and roll out more (bounded);
  4. the algorithm's advantages (`algo/`: e.g. GRPO's group-normalised outcomes, PPO's chunk-level GAE on a critic's
     values); the clipped token loss plus the algorithm's own terms; `mini_batches` optimizer steps through
     DeepSpeed;
  5. gather the actor's weights into the rollout engine in buckets; the checksums must agree.
Evaluation (greedy, held-out init states) runs at step 0, every `eval_every` steps and at the end; with
`eval_every=0` never (the run's metrics then hold `eval/success_rate` NaN).

With `algo.max_staleness=1` the rollout of step k+1 is played during update k (`rollout/ahead.py`), with the weights
update k started from; the sync after update k waits for it. A step followed by a checkpoint (and the last step)
collects nothing ahead, so a checkpoint never has a rollout in flight and a resume continues exactly; after a SIGTERM
the rollout collected ahead is dropped (the resumed run plays the next step anew, with the saved weights); when the
rollout ahead loses a simulation node, the update it overlapped is kept and saved.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from tqdm import tqdm

from vla_scale import checkpoint
from vla_scale.batches import (
    StepBatch,
    Trajectory,
    group_uids,
    kept_groups,
    repeat_for_groups,
)
from vla_scale.config import Config, ConfigError, DeepSpeedConfig, as_yaml, init_state_ids, validate
from vla_scale.envs.registry import simulator
from vla_scale.envs.types import TaskSpec
from vla_scale.models.fp8 import fp8_problem
from vla_scale.models.fp8_update import update_problem
from vla_scale.models.interface import PolicySource
from vla_scale.parallel.actor import Actor, UpdateResult
from vla_scale.parallel.ranks import mean_over_ranks, sum_over_ranks
from vla_scale.parallel.sim.cluster import start_ray
from vla_scale.parallel.sim.fleet import SimFleet, SimNodeLost
from vla_scale.parallel.sync.weight_sync import SyncReport, sync_weights
from vla_scale.process_memory import fleet_memory, release_freed, rss_bytes
from vla_scale.rollout.ahead import RolloutAhead
from vla_scale.rollout.engine import RolloutEngine
from vla_scale.rollout.env_loop import EnvLoop, LoopStats, success_metrics
from vla_scale.rollout.sampler import TaskSampler, eval_specs
from vla_scale.rollout.stack import episode_steps, max_chunks, needs_ray, play_eval, start_fleet, start_ray_for
from vla_scale.run_log import RunLogger, progress
from vla_scale.run_setup import (
    checked_policy,
    init_distributed,
    launched_world_size,
    make_deterministic,
    resolved_config,
)
from vla_scale.stop_signals import Preempted, StopSignals


class SimulatorLost(RuntimeError):
    """The run stopped because simulators were lost with their node; the last finished step is saved."""


class PhaseTimer:
    """Wall seconds of named phases: `with timer("update"): ...`; `metrics()` gives `time/<name>_s` and, on a GPU,
    each phase's peak of allocated device memory, `memory/<name>_peak_gib` (the peak counter restarts per phase)."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.device = device if device is not None and device.type == "cuda" else None

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.device is not None:
            torch.cuda.reset_peak_memory_stats(self.device)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if self.device is not None:
                peak = torch.cuda.max_memory_allocated(self.device) / 2**30
                self.peaks[name] = max(self.peaks.get(name, 0.0), peak)

    def metrics(self) -> dict[str, float]:
        return {**{f"time/{name}_s": value for name, value in self.seconds.items()},
                **{f"memory/{name}_peak_gib": value for name, value in self.peaks.items()}}


@dataclass(frozen=True)
class Schedule:
    """When a run evaluates, saves and sends the next step's resets ahead, by step count (`step` = steps done).
    `eval_every=0` evaluates never, `save_every=0` saves never."""

    steps: int
    eval_every: int
    save_every: int

    def evaluates_before(self, step: int) -> bool:
        """An evaluation runs before step `step + 1` (at step 0, every `eval_every`; the end has its own)."""
        return bool(self.eval_every) and step % self.eval_every == 0

    @property
    def evaluates_at_end(self) -> bool:
        """An evaluation runs after the last step."""
        return bool(self.eval_every)

    def saves_after(self, step: int) -> bool:
        """A checkpoint is written once `step` steps are done (before the end, which always saves if saving)."""
        return bool(self.save_every) and step % self.save_every == 0 and step < self.steps

    def prefetches_after(self, step: int) -> bool:
        """Once step `step + 1` has rolled out, the next one's resets may go out: it exists and starts with a
        rollout, not an evaluation."""
        following = step + 1
        return following < self.steps and not self.evaluates_before(following)

    def collects_ahead_during(self, step: int) -> bool:
        """With `algo.max_staleness=1`: while step `step + 1` updates, step `step + 2`'s rollout is played. Not when
        step `step + 1` is the last or is followed by a checkpoint (which then holds no rollout in flight)."""
        return step + 2 <= self.steps and not self.saves_after(step + 1)


class ColocatedMemory:
    """Who holds the GPU when the actor and the rollout engine share it, as the two colocated-memory options say:
    during a rollout the engine's weights and the actor's working shard; during an update the actor's optimizer
    state, fp32 weights and gradients (`deepspeed.offload_states_during_rollout`), the engine's weights released
    (`deepspeed.release_engine_during_update`). Without the options nothing moves."""

    def __init__(self, actor: Actor, engine: RolloutEngine, ds: DeepSpeedConfig):
        self.actor, self.engine, self.ds = actor, engine, ds

    def for_update(self) -> None:
        """Before an update: the engine's weights leave the GPU and the actor's optimizer state comes back."""
        if self.ds.release_engine_during_update:
            self.engine.release_memory_occupation()
        self.actor.reload_states()

    def for_rollout(self) -> None:
        """Before the weight sync that ends an update: the engine takes its memory back to receive the weights."""
        if self.ds.offload_states_during_rollout:
            self.actor.offload_states()
        self.engine.resume_memory_occupation()

    @contextmanager
    def optimizer_on_device(self) -> Iterator[None]:
        """The optimizer state where training keeps it (a checkpoint saves it from there), then back."""
        self.actor.reload_states()
        try:
            yield
        finally:
            if self.ds.offload_states_during_rollout:
                self.actor.offload_states()


class RunComplete(Exception):
    """A resumed run has already reached `steps`: there is nothing to do (the entry script exits 0)."""


class Trainer:
    def __init__(self, cfg: Config, run_dir: str, explicit: Collection[str] = (), vla: PolicySource | None = None):
        """Checks, starting nothing but the process group (`init_distributed`, after the checks that need none): the
        configuration, the Ray address, the policy against the env and the `explicit` keys of the command line
        (`run_setup.checked_policy`; `vla`: its result, when the caller ran it already, as the entry script does
        before it imports this module), a resumed run against its checkpoint, FP8 on this rank's device."""
        if cfg.deterministic:
            make_deterministic()
        self.world = launched_world_size()
        validate(cfg, self.world)
        # policy, tokenizer, processor and action post-processing from one source, checked against the env
        self.vla = vla if vla is not None else checked_policy(cfg, explicit)
        self.cfg = cfg = resolved_config(cfg, self.vla)
        self.run_dir = run_dir
        self._check_resume()
        self.rank, self.world = init_distributed()
        here = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        no_fp8 = fp8_problem(here) if cfg.rollout.precision == "fp8" else None
        no_fp8 = no_fp8 or update_problem(cfg.deepspeed.update_precision, here, cfg.deepspeed.bf16)
        if no_fp8:
            raise ConfigError(no_fp8)
        self.max_chunks = max_chunks(cfg.env, cfg.model.chunk_len)
        self.schedule = Schedule(cfg.steps, cfg.eval_every, cfg.save_every)
        self.tokenizer, self.processor = self.vla.tokenizer, self.vla.processor
        self.step, self.version = 0, 0
        self.groups = cfg.algo.batch_size // self.world  # groups this rank rolls out per step
        self.next_specs: list[TaskSpec] | None = None
        self.fleet: SimFleet | None = None
        self.ahead: RolloutAhead[StepBatch] | None = None
        self.pending: StepBatch | None = None  # the next step's rollout, collected during the last update
        self.lost_ahead: SimNodeLost | None = None
        self.ahead_urgent = True  # the rollout ahead's decodes go first until the update proves the longer phase
        self.stop = StopSignals()
        self.ready = False

    def _check_resume(self) -> None:
        """A resumed run must be resumable with this configuration, and not already at `steps`."""
        cfg, run_dir = self.cfg, self.run_dir
        if not cfg.resume:
            return
        problems = checkpoint.resume_problems(run_dir, self.run_groups(), self.world)
        if problems:
            raise ConfigError("cannot resume " + run_dir + ":\n  - " + "\n  - ".join(problems))
        done = checkpoint.latest_step(run_dir)
        if done is not None and done >= cfg.steps:
            raise RunComplete(f"{run_dir} is already at step {done} (steps={cfg.steps}): nothing to train, "
                              f"no file touched; pass steps=<more than {done}> to continue it")

    def run_groups(self) -> dict:
        """The config groups a checkpoint records and a resume must match."""
        return {"model": self.cfg.model, "algo": self.cfg.algo}

    def setup(self) -> None:
        """Start everything the checks in the constructor cleared: the run's logger, the DeepSpeed actor, the rollout
        engine, Ray and this rank's simulators; then a resumed run's checkpoint and the first (verified) sync."""
        cfg = self.cfg
        self.log = RunLogger(self.run_dir, self.rank)
        torch.manual_seed(cfg.seed)
        self.actor = Actor(self.vla.new_policy, cfg.deepspeed, cfg.algo, scorer=self.vla.chunk_scorer(),
                           lora=cfg.model.lora, critic_from=self.vla.weights)
        if self.actor.critic_source and self.rank == 0 and not cfg.resume:
            print(self.actor.critic_source, flush=True)
        engine_dtype = torch.bfloat16 if cfg.deepspeed.bf16 else None  # the engine holds what the actor holds
        # the engine is built empty: the first sync below fills every weight (one checkpoint read, the actor's)
        self.engine = RolloutEngine(self.vla.unfilled_policy(), self.actor.device, seed=cfg.seed * 1000 + self.rank,
                                    dtype=engine_dtype, precision=cfg.rollout.precision, filled=False,
                                    decoder=self.vla.chunk_decoder())
        self.memory = ColocatedMemory(self.actor, self.engine, cfg.deepspeed)
        self.sampler = TaskSampler(cfg.env, seed=cfg.seed * 1000 + self.rank)
        self._start_ray()
        self.fleet = start_fleet(cfg.env, cfg.parallel, self.vla, self.groups * cfg.algo.group_size,
                                 cfg.rollout.pipeline_stage_num)
        self.stop.install()  # after Ray's driver installed its own SIGTERM handler
        self.loop = EnvLoop(self.fleet, self.engine, self.vla, self.max_chunks)
        if cfg.algo.max_staleness:
            self.ahead = RolloutAhead(self.actor.device)
        if cfg.resume:
            self.load_latest()
        self._first_sync = self.version
        self.sync(self.version)
        if self.step == 0:
            self.log.text("config", "```\n" + as_yaml(cfg) + "\n```")
        self.ready = True

    def _start_ray(self) -> None:
        """Rank 0 starts (or joins) Ray when the run `needs_ray`; the other ranks then join the same instance."""
        p = self.cfg.parallel
        if not needs_ray(p):
            return
        if self.rank == 0:
            start_ray_for(p)
        if self.world > 1:
            dist.barrier()
            if self.rank > 0:
                start_ray(p.ray_address or "auto")

    # ---- the loop -------------------------------------------------------------------------------------------------
    def train(self) -> dict[str, float]:
        """The steps left, with their evaluations and checkpoints; the last value of every metric
        (`eval/success_rate` NaN where no evaluation ran)."""
        cfg = self.cfg
        if not self.ready:
            self.setup()
        last: dict[str, float] = {}
        if self.rank == 0:
            print(f"training steps {self.step + 1}-{cfg.steps}\n{self.evaluation_line()}", flush=True)
        bar = progress(cfg.steps, self.step, cfg.progress and self.rank == 0, "train")
        while self.step < cfg.steps:
            before = self.resume_state()  # what a checkpoint of the last finished step holds
            if self.schedule.evaluates_before(self.step):
                last.update(self.evaluate())
            try:
                metrics = self.train_step()
            except SimNodeLost as err:
                bar.close()
                self._stop_lost_node(err, before)
            self.log.scalars(metrics, self.step)
            if self.lost_ahead is not None:  # this step's update is done and synced: it is what gets saved
                bar.close()
                self._stop_lost_node(self.lost_ahead, self.resume_state())
            last.update(metrics)
            self._show_step(bar, last)
            saved = self.schedule.saves_after(self.step)
            if saved:
                self.save()
            if self.mean_over_ranks(float(self.stop.requested)) > 0:  # every rank stops after the same step
                bar.close()
                self._stop_preempted(saved)
        bar.close()
        if self.schedule.evaluates_at_end:
            last.update(self.evaluate())
        if cfg.save_every:
            self.save()
        self.log.close()
        return {"eval/success_rate": float("nan"), **last}

    def _show_step(self, bar: tqdm, last: dict[str, float]) -> None:
        """The step just done on the console: the steps' bar and its success rates, or with `progress=false` one
        line (rank 0)."""
        bar.update(1)
        rates = {"success": f"{last['train/success_rate']:.2f}"}
        if "eval/success_rate" in last:
            rates["eval"] = f"{last['eval/success_rate']:.2f}"
        bar.set_postfix(rates)
        if self.rank == 0 and not self.cfg.progress:
            print(f"step {self.step}/{self.cfg.steps}: success {rates['success']}, {last['train/env_steps']:.0f} env "
                  f"steps, rollout {last['time/rollout_s']:.0f} s, update {last['time/update_s']:.0f} s", flush=True)

    def evaluation_line(self) -> str:
        """What one evaluation plays and when it runs, with the keys that shrink or skip it (it takes minutes where
        the episodes are many and long)."""
        e = self.cfg.env
        if not self.schedule.evaluates_at_end:
            return "evaluation: none (eval_every=0)"
        states = len(init_state_ids(e, "eval"))
        first = "at step 0, " if self.step == 0 else ""
        return (f"evaluation: {e.num_tasks * states} episodes ({e.num_tasks} tasks x {states} init states) of up to "
                f"{episode_steps(e)} env steps {first}every {self.cfg.eval_every} steps and at the end; "
                "env.num_eval_init_states and env.num_tasks shrink it, eval_every=0 skips it")

    def _stop_lost_node(self, err: SimNodeLost, before: dict) -> None:
        """A simulation node lost mid-step: the last finished step saved (from the states it ended with, so a resume
        continues exactly), the loss counted in TensorBoard, then `SimulatorLost` saying how to go on."""
        self.log.scalars({"faults/lost_sim_workers": 1.0}, self.step + 1)
        if checkpoint.latest_step(self.run_dir) != self.step:
            self.save(before)
        self.log.close()
        raise SimulatorLost(f"{err}; step {self.step + 1} was abandoned and step {self.step} is saved in "
                            f"{os.path.join(checkpoint.checkpoint_root(self.run_dir), f'step_{self.step}')}: bring "
                            f"the simulation nodes back (`ray status`), then continue with the same command plus "
                            f"run_dir={self.run_dir} resume=true")

    def _stop_preempted(self, saved: bool) -> None:
        """After a SIGTERM: this step's checkpoint (unless just written), then `Preempted` saying how to resume. A
        rollout collected ahead is dropped: the resumed run plays the next step with the saved weights."""
        self.pending = None
        if not saved:
            self.save()
        self.log.close()
        raise Preempted(f"stopped by SIGTERM after step {self.step}, saved as "
                        f"{os.path.join(checkpoint.checkpoint_root(self.run_dir), f'step_{self.step}')}; continue with "
                        f"the same command plus run_dir={self.run_dir} resume=true")

    def train_step(self) -> dict[str, float]:
        """One RL step: rollout (with refills; or the one collected during the last update), the update (old log-probs
        recomputed first where configured), the weight sync. During the update the next step's resets go out, or
        with `algo.max_staleness=1` its whole rollout is played (`rollout_wait`: what the sync then waits for it).
        Returns the step's metrics, its phases timed under `time/`."""
        timer = PhaseTimer(self.actor.device)
        with timer("rollout"):
            batch = self.pending if self.pending is not None else self.collect()
        self.pending = None
        staleness = [self.version - v for traj in batch.trajectories for v in traj.versions]
        ahead = self.ahead is not None and self.schedule.collects_ahead_during(self.step)
        if ahead:
            assert self.ahead is not None
            self.ahead.start(lambda done=self.step + 1: self.collect_local(done), self.ahead_urgent)
        elif self.schedule.prefetches_after(self.step):
            self.next_specs = self.sampler.draw(self.groups)
            self.loop.prefetch(repeat_for_groups(self.next_specs, self.cfg.algo.group_size))
        with timer("make_room"):
            self.memory.for_update()
        with timer("update"):
            result = self.update(batch)
        ahead_s = self._wait_ahead(timer) if ahead else 0.0
        urgent = self.ahead_urgent
        if ahead:  # the next rollout ahead goes first only where the sync had to wait for this one
            self.ahead_urgent = timer.seconds["rollout_wait"] > 0.01 * timer.seconds["update"]
        with timer("sync"):
            report = self.sync(self.version + 1)
        self.step += 1
        release_freed()  # the step's freed arrays back to the system before its memory is read
        metrics = {
            "train/staleness_mean": float(np.mean(staleness)) if staleness else 0.0,
            "train/staleness_max": float(max(staleness, default=0)),
            "time/rollout_ahead_s": ahead_s,
            "rollout/ahead_urgent": float(urgent and ahead),
            "train/success_rate": batch.success_rate,
            "train/groups_kept": len(batch.groups),
            "train/rollout_rounds": batch.rounds,
            "train/episodes": batch.episodes,
            "train/env_steps": self.mean_over_ranks(float(batch.env_steps)) * self.world,
            **self.task_success(batch),
            **timer.metrics(),
            "time/recompute_s": result.recompute_s if result else 0.0,
            "sync/version": report.version, "sync/verify_s": report.verify_seconds,
            "sync/mib": report.bytes / 2**20,
            **{f"train/{k}": v for k, v in (result.metrics() if result else {"skipped_update": 1.0}).items()},
            **self.loop.stats.metrics(self.fleet.num_procs),
            **fleet_memory(rss_bytes(), self.fleet.rss()),
        }
        self.loop.stats = LoopStats()
        return metrics

    def _wait_ahead(self, timer: PhaseTimer) -> float:
        """The rollout collected during the update, kept for the next step; its seconds. A simulation node lost in
        it is kept in `lost_ahead` (the step finishes and is saved before the run stops)."""
        assert self.ahead is not None
        with timer("rollout_wait"):
            try:
                local, seconds = self.ahead.wait()
            except SimNodeLost as err:
                self.lost_ahead = err
                return 0.0
        self.pending = dataclasses.replace(local, success_rate=self.mean_over_ranks(local.success_rate))
        return seconds

    # ---- rollout ----------------------------------------------------------------------------------------------------
    def collect(self) -> StepBatch:
        """This rank's rollout (`collect_local`), its success rate averaged over the ranks."""
        local = self.collect_local(self.step)
        return dataclasses.replace(local, success_rate=self.mean_over_ranks(local.success_rate))

    def collect_local(self, done: int) -> StepBatch:
        """The rollout of step `done + 1`: groups until this rank's share carries signal, or the extra rounds run out
        (dynamic sampling). No collective: the success rate of the first round is this rank's (the rollout thread
        calls it too)."""
        a, n = self.cfg.algo, self.groups
        kept: list[list[Trajectory]] = []
        rates: list[float] = []
        rounds = env_steps = 0
        outcomes: tuple[tuple[int, bool], ...] = ()
        with self._episode_bar(n * a.group_size, f"rollout {done + 1}") as bar:
            while len(kept) < n and rounds <= a.max_resample_rounds:
                specs = self.next_specs if rounds == 0 and self.next_specs else self.sampler.draw(n)
                self.next_specs = None
                uids = group_uids(f"{self.rank}.{done}.{rounds}", n, a.group_size)
                bar.total = (rounds + 1) * n * a.group_size  # a refill round adds as many
                trajs = self.loop.run(repeat_for_groups(specs, a.group_size), uids, a.temperature, bar=bar)
                outcomes = outcomes or tuple((traj.task.task_id, traj.success) for traj in trajs)
                groups, rate = kept_groups(trajs, uids, a)
                kept += groups
                rates.append(rate)
                rounds += 1
                env_steps += sum(traj.env_steps for traj in trajs)
        return StepBatch(kept[:n], rates[0], rounds, rounds * n * a.group_size, env_steps, outcomes)

    def _episode_bar(self, total: int, desc: str) -> tqdm:
        """A bar below the steps' bar counting this rank's episodes of one rollout or evaluation as they end (on
        rank 0 with `progress=true`); it goes away when they are done."""
        return progress(total, 0, self.cfg.progress and self.rank == 0, desc, unit="episode", leave=False)

    def task_success(self, batch: StepBatch) -> dict[str, float]:
        """`train/task_<k>_success_rate`: the first round's success on task k over every rank's episodes, for each
        task some rank played (a collective)."""
        n = self.cfg.env.num_tasks
        counts = [0.0] * (2 * n)  # successes of each task, then episodes of each task
        for task, success in batch.outcomes:
            counts[task] += float(success)
            counts[n + task] += 1.0
        totals = sum_over_ranks(counts, self.world, self.actor.device)
        return {f"train/task_{k}_success_rate": totals[k] / totals[n + k] for k in range(n) if totals[n + k]}

    def mean_over_ranks(self, value: float) -> float:
        """`value`'s mean over the ranks (every rank must call it equally often: it is a collective)."""
        return mean_over_ranks(value, self.world, self.actor.device)

    # ---- update -----------------------------------------------------------------------------------------------------
    def update(self, batch: StepBatch) -> UpdateResult | None:
        """The mini-batches (`Algorithm.plan`), then the actor's update (`Actor.update`: old log-probs, the values
        where the algorithm needs them, its advantages, truncated importance weights, mismatch). None when some rank
        kept no group: then no rank updates."""
        algorithm = self.actor.algorithm
        assert algorithm is not None, "an RL run's actor holds its algorithm"
        plan = algorithm.plan(batch.trajectories, self.cfg.model, self.processor, self.mean_over_ranks)
        return self.actor.update(plan, self.step) if plan.minis else None

    def sync(self, version: int) -> SyncReport:
        """Actor -> engine in buckets; every rank's engine must hold the actor's exact weights (checksum logged).

        With the colocated-memory options the GPU is the rollout's again first (`ColocatedMemory.for_rollout`)."""
        sync = self.cfg.sync
        self.memory.for_rollout()
        verify = version % sync.verify_every == 0 or version == self._first_sync
        report = sync_weights(self.actor.policy, self.engine, version, sync.bucket_mb, verify)
        self.version = report.version
        if not verify:
            return report
        # every rank checked its engine bit for bit; the checksum is already one over all ranks' shares
        self.log.text("sync/checksum", f"v{version}: {report.checksum} on {self.world} rank(s)", version)
        return report

    # ---- evaluation -------------------------------------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """Every task on every held-out init state, greedy, the episodes shared out over the ranks; the success rates
        (logged; with `progress=false` rank 0 prints one line)."""
        specs = eval_specs(self.cfg.env)[self.rank :: self.world]  # each rank plays its share
        start = time.perf_counter()
        with self._episode_bar(len(specs), f"eval at step {self.step}") as bar:
            trajs = play_eval(self.loop, specs, self.cfg.algo.temperature, f"eval.{self.rank}.", bar)
        if self.world > 1:
            parts: list = [None] * self.world
            dist.all_gather_object(parts, [(t.task, t.success) for t in trajs])
            outcomes = [item for part in parts for item in part]
        else:
            outcomes = [(t.task, t.success) for t in trajs]
        e = self.cfg.env
        metrics = success_metrics(outcomes, e.num_tasks, simulator(e.name).groups(e.suite, e.num_tasks))
        self.log.scalars(metrics, self.step)
        if self.rank == 0 and not self.cfg.progress:
            print(f"eval at step {self.step}: success {metrics['eval/success_rate']:.3f} over {len(outcomes)} "
                  f"episodes in {time.perf_counter() - start:.0f} s", flush=True)
        videos = os.path.join(self.run_dir, "videos", f"step_{self.step}")
        self.log.episode_videos(trajs, self.cfg.env.eval_videos_per_task, self.step, videos)
        return metrics

    # ---- checkpoints ------------------------------------------------------------------------------------------------
    def resume_state(self) -> dict:
        """This rank's state a checkpoint holds beside the weights (step, version, sampler, RNGs, next task specs)."""
        return {"step": self.step, "version": self.version, "sampler": self.sampler.state_dict(),
                "engine_rng": self.engine.generator.get_state(), "rng": checkpoint.rng_state(),
                "next_specs": self.next_specs}

    def save(self, state: dict | None = None) -> None:
        """A checkpoint of this step, written into `step_<k>.partial` and renamed to `step_<k>` only when every rank
        has written its part, then named by `latest` (`checkpoint.write_checkpoint`). `state`: one taken earlier, with
        the weights of the same step (default: the state now)."""
        checkpoint.write_checkpoint(self.run_dir, self.step, self.actor, self.vla, state or self.resume_state(),
                                    self.run_groups(), self.cfg.sync.bucket_mb, self.cfg.model.lora,
                                    on_device=self.memory.optimizer_on_device, env=self.cfg.env)

    def load_latest(self) -> None:
        tag = checkpoint.latest_tag(self.run_dir)
        if tag is None:
            raise FileNotFoundError(
                f"resume=true but {checkpoint.checkpoint_root(self.run_dir)} has no checkpoint: "
                "point run_dir at a run that saved one, or drop resume=true")
        self.actor.load(checkpoint.checkpoint_root(self.run_dir), tag)
        state = checkpoint.read_trainer_state(os.path.join(checkpoint.checkpoint_root(self.run_dir), tag), self.rank)
        self.step, self.version = state["step"], state["version"]
        self.sampler.load_state_dict(state["sampler"])
        self.engine.generator.set_state(state["engine_rng"])
        checkpoint.set_rng_state(state["rng"])
        self.next_specs = state.get("next_specs")
        if self.next_specs:
            self.loop.prefetch(repeat_for_groups(self.next_specs, self.cfg.algo.group_size))

    def close(self) -> None:
        if self.ahead is not None:
            self.ahead.close()
        self.stop.uninstall()
        if self.fleet is not None:
            self.fleet.close()
