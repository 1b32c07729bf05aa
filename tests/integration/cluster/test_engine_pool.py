"""The engine pool on real Ray and vLLM (tiny model, GuessNumber, no sandboxes): two engines
share a batch; an engine killed in the middle of a rollout loses its in-flight episodes as
``aborted`` (flagged, stored, never scored), which the survivor rolls out again; with every
with ``cluster.node_wait_s > 0`` a replacement engine takes the lost episodes; with every
engine lost the pool stops with a ``ClusterError``. Each engine runs its own OpenMP threads
on its own cores (``agentrl.cluster.actors.cpu_threads``, applied through the actor's runtime_env),
and ``ready()`` is bounded when other actors hold the CPUs an engine asks for.

One local Ray instance for the module. ``ray.kill`` raises the same ``ActorDiedError`` in
the pool as a removed node does (platform notes: ``c.remove_node`` kills that node's actors)."""

from __future__ import annotations

import threading
import time

import pytest

pytestmark = pytest.mark.slow

N_TASKS, GROUP = 2, 4  # 8 requests: 4 per engine


def _cfg(tmp_path, tiny_model_path, *extra):
    from agentrl.config import load_config

    return load_config(None, [f"run.dir={tmp_path}", f"model.path={tiny_model_path}", "env.id=agentrl/GuessNumber-v0",
                              "rollout.max_turns=2", "rollout.max_new_tokens=12", "rollout.max_context_tokens=512",
                              "rollout.kv_cache_gb=1", "rollout.max_num_seqs=16", *extra])


def _requests(cfg, iteration: int):
    from agentrl.cluster.actors.env_factory import env_task_ids
    from agentrl.tasks import TaskSource

    tasks = TaskSource(cfg.env.id, env_task_ids(cfg.env.id, cfg.env.split), 0, GROUP, run_id="pool-test")
    tasks.iteration = iteration
    return tasks.next_requests(N_TASKS)


@pytest.fixture(scope="module")
def pool(ray_session, tmp_path_factory, tiny_model_path):
    from agentrl.cluster.engines.pool import EnginePool

    cfg = _cfg(tmp_path_factory.mktemp("pool"), tiny_model_path, "rollout.num_engines=2")
    p = EnginePool(cfg, cfg.model_dump(mode="json"), tiny_model_path, "pool-test")
    starts = p.ready()
    assert len(starts) == 2 and all(s > 0 for s in starts)
    yield p
    p.kill()


def _answered_once(requests, episodes):
    from agentrl.types import TerminationReason

    finished = [e for e in episodes if e.termination_reason is not TerminationReason.ABORTED]
    assert len(finished) == len(requests)
    for req, ep in zip(requests, finished):  # request order, one finished episode each
        assert (ep.group_id, ep.task_id, ep.seed) == (req.group_id, req.task_id, req.seed)
        assert ep.episode_id.rsplit("/a", 1)[0] == req.episode_id.rsplit("/a", 1)[0]
        assert ep.turns and not ep.is_error
    return finished


def test_two_engines_share_one_batch(pool, tmp_path, tiny_model_path):
    requests = _requests(pool.cfg, 0)
    episodes, rollout_s, m = pool.rollout(requests, policy_version=0)
    assert [e.episode_id for e in episodes] == [r.episode_id for r in requests]
    _answered_once(requests, episodes)
    assert m["rollout/engine_0_episodes"] == m["rollout/engine_1_episodes"] == 4  # both engines worked
    assert m["cluster/engines"] == 2 and m["cluster/engines_lost"] == 0 and m["rollout/aborted_episodes"] == 0
    assert rollout_s > 0 and m["rollout/engine_0_s"] > 0
    nodes = pool.nodes()
    assert set(nodes) == {0, 1} and nodes[0]["pid"] != nodes[1]["pid"]


def test_one_router_address_reaches_each_engines_own_gateway(pool):
    """Before the tests below kill the pool's engines (they share the module's pool)."""
    import httpx

    from agentrl.cluster.engines.gateway_router import EngineGatewayRouter

    router = EngineGatewayRouter(pool.actors)
    try:
        backends = router.router.backends
        assert len(backends) == 2  # one gateway per engine process, each its own id
        for gateway_id, url in backends.items():
            # an unknown session of that gateway: answered by the gateway in the engine's
            # process (its own 404), not by the router
            r = httpx.get(f"{router.base_url}/v1/models", headers={"X-Session-ID": f"{gateway_id}-nosuch"})
            assert r.status_code == 404 and "does not exist" in r.json()["error"]["message"], r.text
        r = httpx.get(f"{router.base_url}/v1/models", headers={"X-Session-ID": "ffffffff-x"})
        assert r.status_code == 404 and "not one of this router's gateways" in r.json()["error"]["message"]
    finally:
        router.shutdown()

def test_engine_killed_mid_rollout_its_episodes_are_aborted_and_regenerated(pool, ray_session, tmp_path):
    from agentrl.replay import ReplayStore
    from agentrl.rollout.loop import rollout_metrics
    from agentrl.types import TerminationReason

    assert pool.engine_indices == [0, 1]
    victim, victim_node = dict(zip(pool.engine_indices, pool.actors))[1], pool.nodes()[1]
    requests = _requests(pool.cfg, 1)
    killed = threading.Event()

    def kill_when_busy():
        deadline = time.monotonic() + 60
        while pool.loads().get(1, 0) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        ray_session.kill(victim)  # as a node removal does: the in-flight call raises ActorDiedError
        killed.set()

    t = threading.Thread(target=kill_when_busy, daemon=True)
    t.start()
    episodes, _, m = pool.rollout(requests, policy_version=0)
    t.join(5)
    assert killed.is_set()

    aborted = [e for e in episodes if e.termination_reason is TerminationReason.ABORTED]
    assert len(aborted) == 4 and m["rollout/aborted_episodes"] == 4  # engine 1's whole share was in flight
    assert m["cluster/engines_lost"] == 1 and m["cluster/engines"] == 1 and pool.engine_indices == [0]
    assert m["rollout/engine_0_episodes"] == 8  # its own share, then engine 1's again
    assert [e.episode_id for e in aborted] == [r.episode_id for r in requests[4:]]  # the second slice, attempt 0
    for ep in aborted:
        assert ep.is_error and ep.total_reward is None and ep.turns == []
        assert ep.error["type"] == "ActorDiedError" and ep.error["engine_index"] == "1"
        assert f"rollout engine 1 on node {victim_node['node_id']}" in ep.error["message"]
    finished = _answered_once(requests, episodes)
    assert [e.episode_id[-3:] for e in finished] == ["/a0"] * 4 + ["/a1"] * 4  # regenerated with attempt + 1
    # each aborted attempt sits just before its regenerated one
    assert [e.episode_id[-3:] for e in episodes[4:]] == ["/a0", "/a1"] * 4

    metrics = rollout_metrics(episodes)
    assert metrics["rollout/aborted_episodes"] == 4 and metrics["rollout/scored_episodes"] == 8

    store = ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}")
    store.start_run("pool-test", {})
    store.add_episodes("pool-test", 1, episodes)
    got = store.get_episode(aborted[0].episode_id)
    assert got.termination_reason is TerminationReason.ABORTED and got.is_error and got.error == aborted[0].error
    assert store.count_episodes("pool-test") == 12


def test_a_replacement_engine_takes_the_lost_episodes(pool, ray_session):
    from agentrl.types import TerminationReason

    # The same live pool (one engine left after the test above), switched to waiting for a
    # replacement: it saves starting a second pool's engines.
    cluster = pool.cfg.cluster.model_copy(update={"node_wait_s": 120.0})
    pool.cfg = pool.cfg.model_copy(update={"cluster": cluster})
    try:
        (index,) = pool.engine_indices
        ray_session.kill(pool.actors[0])  # lost between two calls: the next call's answer is ActorDiedError
        requests = _requests(pool.cfg, 3)
        episodes, _, m = pool.rollout(requests, policy_version=0)
    finally:
        pool.cfg = pool.cfg.model_copy(update={"cluster": cluster.model_copy(update={"node_wait_s": 0.0})})
    aborted = [e for e in episodes if e.termination_reason is TerminationReason.ABORTED]
    assert len(aborted) == 8 and m["rollout/aborted_episodes"] == 8
    assert m["cluster/engines_lost"] == 1 and m["cluster/engines_replaced"] == 1 and m["cluster/replacement_wait_s"] > 0
    assert m["cluster/engines"] == 1 and pool.engine_indices == [index]  # the replacement took the lost index
    assert m[f"rollout/engine_{index}_episodes"] == 8
    _answered_once(requests, episodes)


def test_every_engine_lost_is_a_cluster_error_naming_them(pool, ray_session):
    from agentrl.errors import ClusterError

    assert pool.cfg.cluster.node_wait_s == 0
    for actor in pool.actors:
        ray_session.kill(actor)
    with pytest.raises(ClusterError, match=r"every rollout engine is lost: rollout engine \d on node .*node_wait_s=0"):
        pool.rollout(_requests(pool.cfg, 2), policy_version=0)
    assert pool.engine_indices == []


def test_an_engine_runs_its_own_threads_on_its_own_cores_whatever_the_job_says(ray_session, tmp_path):
    """role_options' env_vars win over the job's (ray_session's OMP_NUM_THREADS=1), are there
    before the worker imports torch, and OpenMP runs that many threads on the engine's cores."""
    import os

    from agentrl.cluster.actors.cpu_threads import engine_cores
    from agentrl.cluster.actors.placement import role_options

    ray = ray_session

    @ray.remote
    class Probe:
        def threads(self, load_torch=True):
            import os
            import sys

            env = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OMP_PLACES", "OMP_PROC_BIND")}
            fresh = "torch" not in sys.modules  # so libgomp reads this environment when torch loads it
            if not load_torch:
                return env, fresh, None, None
            import torch

            torch.ones(256, 256) @ torch.ones(256, 256)  # an OpenMP parallel region
            return env, fresh, torch.get_num_threads(), sorted(os.sched_getaffinity(0))

    cores = sorted(os.sched_getaffinity(0))
    two = _cfg(tmp_path, "unused", "rollout.num_engines=2")
    opts = role_options(two, "rollout", 1)
    want = opts["runtime_env"]["env_vars"]
    env, fresh, threads, affinity = ray.get(Probe.options(**opts).remote().threads.remote())
    assert fresh and env["OMP_NUM_THREADS"] == want["OMP_NUM_THREADS"] and threads == int(want["OMP_NUM_THREADS"])
    if len(cores) >= 2:  # bound: engine 1's OpenMP runs on its own core(s) only
        assert env["OMP_PLACES"] == want["OMP_PLACES"] and env["OMP_PROC_BIND"] == "true"
        assert affinity == engine_cores(two, 1) and affinity != engine_cores(two, 0)
    one = role_options(_cfg(tmp_path, "unused"), "trainer")  # one rank: every core, over the job's 1
    env, _, _, _ = ray.get(Probe.options(**one).remote().threads.remote(load_torch=False))
    assert env["OMP_NUM_THREADS"] == str(len(cores)) and env["OMP_PLACES"] is None


def test_ready_is_bounded_when_other_actors_hold_the_cpus(ray_session, tmp_path):
    """The cluster has the CPUs an engine asks for, but another actor holds them: ready()
    fails within cluster.rendezvous_timeout_s, naming the engine, its ask and what is free
    (Ray alone would keep the engine pending for ever)."""
    from agentrl.cluster.engines.pool import EnginePool
    from agentrl.errors import ClusterError

    ray = ray_session
    total = ray.cluster_resources()["CPU"]
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0.0) < total and time.monotonic() < deadline:
        time.sleep(0.2)  # the engines killed above give their CPUs back asynchronously

    @ray.remote(num_cpus=total)
    class Hog:
        def ping(self):
            return 1

    hog = Hog.remote()
    ray.get(hog.ping.remote())
    cfg = _cfg(tmp_path, str(tmp_path / "never-loaded"), "cluster.rendezvous_timeout_s=1.5")
    pool = EnginePool(cfg, cfg.model_dump(mode="json"), str(tmp_path / "never-loaded"), "bounded-ready")
    t0 = time.monotonic()
    try:
        with pytest.raises(ClusterError) as e:
            pool.ready()
    finally:
        waited = time.monotonic() - t0
        pool.kill()
        ray.kill(hog)
    msg = str(e.value)
    assert waited < 10, waited
    assert msg.startswith("rollout engine 0 was not placed on any node within cluster.rendezvous_timeout_s=1.5 s"), msg
    assert "it asks for CPU 1 (cluster.placement.rollout)" in msg
    assert f"the cluster has CPU {total:g} in all, nothing free" in msg

