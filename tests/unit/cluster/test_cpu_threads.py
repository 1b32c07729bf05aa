"""Per-actor OpenMP threads and engine cores (agentrl.cluster.cpu_threads), then on a real
small Ray instance: that an actor's runtime_env env_vars win over the job's, reach the
worker before torch is imported, and that OpenMP runs the given threads on the given cores;
and that EnginePool.ready is bounded when other actors hold the resources."""

from __future__ import annotations

import pytest

from agentrl.cluster.cpu_threads import actor_env_vars, engine_cores, role_threads
from agentrl.cluster.ray_setup import role_options
from agentrl.config import load_config
from agentrl.errors import ClusterError


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


# --------------------------------------------------------------------------- real Ray


@pytest.fixture(scope="module")
def small_ray():
    import ray

    # As connect() starts it: the job's runtime_env says every core; the actors' must win.
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "7", "TOKENIZERS_PARALLELISM": "false"}})
    yield ray
    ray.shutdown()


def test_actor_env_wins_over_the_job_env_and_binds_openmp(small_ray):
    ray = small_ray
    import os

    cores = sorted(os.sched_getaffinity(0))
    cfg = _cfg("rollout.num_engines=2")

    @ray.remote
    class Probe:
        def threads(self):
            import os

            before = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")}
            import sys

            fresh = "torch" not in sys.modules  # the env was there before torch (libgomp) was loaded
            import torch

            torch.ones(256, 256) @ torch.ones(256, 256)  # an OpenMP parallel region
            return before, fresh, torch.get_num_threads(), sorted(os.sched_getaffinity(0))

    opts = role_options(cfg, "rollout", 1)
    want = opts["runtime_env"]["env_vars"]
    before, fresh, threads, affinity = ray.get(Probe.options(**opts).remote().threads.remote())
    assert before["OMP_NUM_THREADS"] == want["OMP_NUM_THREADS"] != "7"
    assert fresh
    assert threads == int(want["OMP_NUM_THREADS"])
    if len(cores) >= 2:  # bound: OpenMP's initial thread runs on this engine's core(s) only
        assert before["OMP_PLACES"] == want["OMP_PLACES"]
        assert affinity == engine_cores(cfg, 1)
    plain = ray.get(Probe.remote().threads.remote())  # an actor without role options keeps the job's
    assert plain[0]["OMP_NUM_THREADS"] == "7"


def test_engine_pool_ready_is_bounded_when_other_actors_hold_the_cpus(small_ray, tmp_path):
    ray = small_ray
    from agentrl.cluster.engine_pool import EnginePool

    @ray.remote(num_cpus=2)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())  # holds both CPUs: the cluster has them in total, none free
    cfg = _cfg(f"run.dir={tmp_path}", "cluster.rendezvous_timeout_s=1.5")
    pool = EnginePool(cfg, cfg.model_dump(mode="json"), str(tmp_path / "never-loaded"), "bounded-ready")
    try:
        import time

        t0 = time.monotonic()
        with pytest.raises(ClusterError) as e:
            pool.ready()
        waited = time.monotonic() - t0
    finally:
        pool.kill()
        ray.kill(hog)
    msg = str(e.value)
    assert waited < 10, waited
    assert msg.startswith("rollout engine 0 was not placed on any node within cluster.rendezvous_timeout_s=1.5 s")
    assert "it asks for CPU 1 (cluster.placement.rollout)" in msg
    assert "the cluster has CPU 2 in all, nothing free" in msg
