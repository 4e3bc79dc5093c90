"""Disaggregated mode on a two-node Ray cluster built on this machine (ray.cluster_utils.Cluster)."""

import pytest
import ray
from ray.cluster_utils import Cluster

from vla_scale.trainer import Trainer


@pytest.fixture
def cluster(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)  # ray.init(address=...) exports it; later tests start their own
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"train_rollout": 1}})
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.mark.slow
def test_sim_workers_land_on_the_sim_node_and_a_run_completes(cluster, tiny_config, tmp_path):
    cfg = tiny_config("parallel.disagg_sim.enable=true", "parallel.disagg_sim.nnodes=1",
                      f"parallel.ray_address={cluster.address}", "steps=3", "eval_every=100",
                      "rollout.pipeline_stage_num=2")
    with pytest.raises(RuntimeError, match="expects 1 simulation node"):
        Trainer(cfg, str(tmp_path / "refused")).setup()
    sim_node = cluster.add_node(num_cpus=1, resources={"sim": 1})
    cluster.wait_for_nodes()
    trainer = Trainer(cfg, str(tmp_path / "run"))
    try:
        trainer.setup()
        nodes = ray.get([w.node_id.remote() for w in trainer.fleet.workers.workers])
        assert nodes == [sim_node.node_id] * len(trainer.fleet.workers.workers)
        trainer.train_step()
        # reset overlap: the next step's task specs were drawn and their resets sent before this step's update
        assert trainer.next_specs is not None and len(trainer.next_specs) == trainer.groups
        metrics = trainer.train()
    finally:
        trainer.close()
    assert trainer.step == 3 and "eval/success_rate" in metrics
    assert trainer.next_specs is None  # the prefetched specs were the next rollout's, the last step prefetches none
    assert metrics["rollout/env_steps_per_s"] > 0 and 0 < metrics["rollout/decode_utilisation"] <= 1


@pytest.mark.slow
def test_a_simulation_node_lost_mid_rollout_stops_with_one_error_after_saving(cluster, tiny_config, tmp_path):
    """A head and two simulation nodes; the node of sim worker 0 is killed (its raylet and every process on it) once
    the first step has finished."""
    import threading
    import time

    from vla_scale import checkpoint
    from vla_scale.trainer import SimulatorLost

    nodes = [cluster.add_node(num_cpus=1, resources={"sim": 1}) for _ in range(2)]
    cluster.wait_for_nodes()
    cfg = tiny_config("parallel.disagg_sim.enable=true", "parallel.disagg_sim.nnodes=2",
                      f"parallel.ray_address={cluster.address}", "steps=60", "eval_every=100", "save_every=0")
    run = tmp_path / "run"
    trainer = Trainer(cfg, str(run))
    try:
        trainer.setup()
        where = ray.get(trainer.fleet.workers.workers[0].node_id.remote())
        victim = next(node for node in nodes if node.node_id == where)

        def kill_in_step_2() -> None:
            while trainer.step < 1:
                time.sleep(0.01)
            time.sleep(0.05)  # into the next step
            cluster.remove_node(victim, allow_graceful=False)

        threading.Thread(target=kill_in_step_2, daemon=True).start()
        with pytest.raises(SimulatorLost, match="sim worker .* is gone") as stopped:
            trainer.train()
    finally:
        trainer.close()
    assert "resume=true" in str(stopped.value)
    # the lost node's simulators could not remove their image blocks (their resource tracker died with them): the
    # fleet's close removed every block of a process that no longer exists
    from vla_scale.parallel.sim.shared_images import BLOCK_PREFIX, SHARED_MEMORY, _alive

    left = [p.name for p in SHARED_MEMORY.glob(f"{BLOCK_PREFIX}*")
            if not _alive(int(p.name[len(BLOCK_PREFIX):].split("_")[0]))]
    assert left == [], left
    done = checkpoint.latest_step(str(run))
    assert done == trainer.step >= 1  # every finished step kept, though save_every=0
    assert checkpoint.resume_problems(str(run), trainer.run_groups(), 1) == []
    from conftest import read_scalars

    assert read_scalars(str(run / "tb"))["faults/lost_sim_workers"] == [(done + 1, 1.0)]


@pytest.mark.slow
def test_meta_world_simulators_run_on_the_sim_node(cluster, tiny_config, tmp_path):
    """Meta-World's simulators as any other's: built on the simulation node, pipelined, a step trains."""
    pytest.importorskip("metaworld", reason="Meta-World is not installed: `make metaworld`")
    sim_node = cluster.add_node(num_cpus=1, resources={"sim": 1})
    cluster.wait_for_nodes()
    cfg = tiny_config("env=metaworld_mt10", "model=tiny_metaworld", "model.hidden_size=32", "model.num_layers=1",
                      "model.intermediate_size=64", "model.vision_dim=32", "model.num_heads=2", "env.num_tasks=2",
                      "env.camera_resolution=32", "env.max_steps=16", "env.num_eval_init_states=1",
                      "parallel.disagg_sim.enable=true", "parallel.disagg_sim.nnodes=1",
                      f"parallel.ray_address={cluster.address}", "steps=1", "eval_every=1",
                      "rollout.pipeline_stage_num=2")
    trainer = Trainer(cfg, str(tmp_path / "run"))
    try:
        trainer.setup()
        nodes = ray.get([w.node_id.remote() for w in trainer.fleet.workers.workers])
        assert nodes == [sim_node.node_id] * len(trainer.fleet.workers.workers)
        metrics = trainer.train()
    finally:
        trainer.close()
    assert trainer.step == 1 and {"eval/group_easy_success_rate", "eval/group_hard_success_rate"} <= set(metrics)
    assert metrics["rollout/env_steps_per_s"] > 0
