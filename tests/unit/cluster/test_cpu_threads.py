"""Per-actor OpenMP threads and engine cores (agentrl.cluster.actors.cpu_threads). On real Ray (that
an actor's env_vars win over the job's, reach the worker before torch is imported, and bind
OpenMP): tests/integration/cluster/test_engine_pool.py."""

from __future__ import annotations

from agentrl.cluster.actors.cpu_threads import actor_env_vars, engine_cores, role_threads
from agentrl.cluster.actors.placement import role_options
from agentrl.config import load_config


def _cfg(*overrides):
    return load_config(None, list(overrides))


def test_local_instance_one_engine_one_rank_use_every_core():
    cfg = _cfg()
    assert role_threads(cfg, "rollout", cores=2) == 2
    assert role_threads(cfg, "trainer", cores=2) == 2
    assert role_threads(cfg, "sandbox", cores=2) == 1
    assert engine_cores(cfg, 0, cores=[0, 1]) is None  # one engine: not bound
    assert actor_env_vars(cfg, "rollout", 0, cores=[0, 1]) == {"OMP_NUM_THREADS": "2"}


def test_local_instance_two_engines_get_disjoint_cores():
    cfg = _cfg("rollout.num_engines=2")
    envs = [actor_env_vars(cfg, "rollout", i, cores=[0, 1]) for i in range(2)]
    assert envs == [
        {"OMP_NUM_THREADS": "1", "OMP_PLACES": "{0}", "OMP_PROC_BIND": "true", "VLLM_CPU_OMP_THREADS_BIND": "0"},
        {"OMP_NUM_THREADS": "1", "OMP_PLACES": "{1}", "OMP_PROC_BIND": "true", "VLLM_CPU_OMP_THREADS_BIND": "1"},
    ]
    # 16 cores (an affinity with gaps), 2 engines: 8 consecutive usable cores each
    cores = [0, 1, 2, 3, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    assert engine_cores(cfg, 0, cores=cores) == [0, 1, 2, 3, 8, 9, 10, 11]
    assert engine_cores(cfg, 1, cores=cores) == [12, 13, 14, 15, 16, 17, 18, 19]
    assert actor_env_vars(cfg, "rollout", 0, cores=cores)["VLLM_CPU_OMP_THREADS_BIND"] == "0-3,8-11"
    assert actor_env_vars(cfg, "rollout", 1, cores=cores)["OMP_PLACES"] == "{12,13,14,15,16,17,18,19}"


def test_more_engines_than_cores_wrap_around_one_thread_each():
    cfg = _cfg("rollout.num_engines=3")
    assert [engine_cores(cfg, i, cores=[4, 5]) for i in range(3)] == [[4], [5], [4]]
    assert role_threads(cfg, "rollout", cores=2) == 1


def test_two_trainer_ranks_share_the_cores_unbound():
    cfg = _cfg("trainer.num_ranks=2")
    assert actor_env_vars(cfg, "trainer", cores=[0, 1, 2, 3]) == {"OMP_NUM_THREADS": "2"}


def test_joined_cluster_threads_follow_num_cpus_and_nothing_is_bound():
    cfg = _cfg("cluster.address=auto", "rollout.num_engines=2", "cluster.placement.rollout.num_cpus=4",
               "cluster.placement.trainer.num_cpus=0.5")
    assert actor_env_vars(cfg, "rollout", 1, cores=[0, 1]) == {"OMP_NUM_THREADS": "4"}
    assert role_threads(cfg, "trainer") == 1  # fractional: at least one thread, as Ray's own default
    assert engine_cores(cfg, 0) is None


def test_role_options_carries_the_env_per_engine_index():
    cfg = _cfg("rollout.num_engines=2")
    a, b = (role_options(cfg, "rollout", i)["runtime_env"]["env_vars"] for i in range(2))
    assert a["OMP_NUM_THREADS"] == b["OMP_NUM_THREADS"]
    import os

    if len(os.sched_getaffinity(0)) >= 2:
        assert a["OMP_PLACES"] != b["OMP_PLACES"]


def test_async_mode_splits_the_local_cores_between_the_roles_by_num_cpus():
    one = _cfg("controller.mode=async")  # one engine, one rank, 1 CPU each: half the cores each
    assert (role_threads(one, "rollout", cores=2), role_threads(one, "trainer", cores=2)) == (1, 1)
    assert (role_threads(one, "rollout", cores=16), role_threads(one, "trainer", cores=16)) == (8, 8)
    assert role_threads(_cfg(), "trainer", cores=16) == 16  # sync mode: the roles take turns, every core each
    weighted = _cfg("controller.mode=async", "rollout.num_engines=2", "cluster.placement.rollout.num_cpus=3",
                    "cluster.placement.trainer.num_cpus=2")  # 2 x 3 + 1 x 2 = 8 shares of 16 cores
    assert (role_threads(weighted, "rollout", cores=16), role_threads(weighted, "trainer", cores=16)) == (6, 4)
    assert [engine_cores(weighted, i, cores=list(range(16))) for i in range(2)] == [list(range(6)), list(range(6, 12))]
    crowded = _cfg("controller.mode=async", "rollout.num_engines=2")  # 3 actors on 2 cores: one thread each
    assert [actor_env_vars(crowded, "rollout", i, cores=[0, 1])["OMP_PLACES"] for i in range(2)] == ["{0}", "{1}"]
    assert actor_env_vars(crowded, "trainer", cores=[0, 1]) == {"OMP_NUM_THREADS": "1"}
    zero = _cfg("controller.mode=async", "cluster.placement.rollout.num_cpus=0", "cluster.placement.trainer.num_cpus=0")
    assert role_threads(zero, "rollout", cores=4) == role_threads(zero, "trainer", cores=4) == 2  # equal shares
    joined = _cfg("controller.mode=async", "cluster.address=auto", "cluster.placement.trainer.num_cpus=4")
    assert role_threads(joined, "trainer", cores=2) == 4  # a joined cluster: num_cpus as in sync mode
