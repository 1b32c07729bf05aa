"""role_options and check_placement against ray.nodes()-shaped lists; the Ray exception texts
the memory monitor and actor deaths produce (copied from real runs of Ray 2.60, see
tests/integration/cluster/test_ray_connect.py for the live versions) as one line."""

import pytest

from agentrl.cluster.actors.actor_errors import actor_failure_message, as_cluster_error

from agentrl.cluster.actors.placement import check_placement, role_options
from agentrl.config import load_config
from agentrl.errors import ClusterError, ConfigError


def _node(ip, cpu, gpu=0, alive=True, head=False, **custom):
    res = {"CPU": float(cpu), "memory": 8e9, "object_store_memory": 2e9, f"node:{ip}": 1.0, **custom}
    if gpu:
        res["GPU"] = float(gpu)
    if head:
        res["node:__internal_head__"] = 1.0
    return {"NodeID": ip.replace(".", "") + "ab" * 24, "Alive": alive, "NodeManagerAddress": ip, "Resources": res}


def _cfg(*overrides):
    return load_config(None, list(overrides))


def test_role_options_defaults_and_resources():
    cfg = _cfg("cluster.placement.rollout.resources={rollout: 1}", "cluster.placement.trainer.num_gpus=0.5")
    opts = {r: role_options(cfg, r) for r in ("trainer", "rollout", "sandbox")}
    envs = {r: o.pop("runtime_env") for r, o in opts.items()}
    assert opts["trainer"] == {"num_cpus": 1.0, "num_gpus": 0.5}
    assert opts["rollout"] == {"num_cpus": 1.0, "num_gpus": 0.0, "resources": {"rollout": 1.0}}
    assert opts["sandbox"] == {"num_cpus": 0.5, "num_gpus": 0.0}
    # every actor gets its own OpenMP thread count (tests/unit/cluster/test_cpu_threads.py)
    assert envs["sandbox"] == {"env_vars": {"OMP_NUM_THREADS": "1"}}
    assert set(envs["rollout"]["env_vars"]) == {"OMP_NUM_THREADS"}
    with pytest.raises(ConfigError, match="role='critic'"):
        role_options(cfg, "critic")


@pytest.mark.parametrize("override, match", [
    ("cluster.placement.rollout.num_cpus=-1", r"cluster\.placement\.rollout\.num_cpus=-1"),
    ("cluster.placement.sandbox.resources={'': 1}", r"cluster\.placement\.sandbox\.resources: a resource name must be non-empty"),
    ("cluster.placement.trainer.resources={t: -2}", r"cluster\.placement\.trainer\.resources: the amount of 't' must be >= 0"),
])
def test_placement_config_validation(override, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(override)


def test_default_fits_one_local_node():
    check_placement(_cfg(), nodes=[_node("10.0.0.1", 4, head=True)])


def test_dead_nodes_are_ignored():
    cfg = _cfg("cluster.placement.rollout.resources={rollout: 1}")
    with pytest.raises(ConfigError, match=r"no node has 'rollout' at all"):
        check_placement(cfg, nodes=[_node("10.0.0.1", 4), _node("10.0.0.2", 4, alive=False, rollout=1.0)])


def test_resource_no_node_has_names_value_and_cluster():
    cfg = _cfg("cluster.placement.rollout.resources={rollout: 1}")
    with pytest.raises(ConfigError) as e:
        check_placement(cfg, nodes=[_node("10.0.0.1", 4, head=True), _node("10.0.0.2", 2, gpu=1)])
    msg = str(e.value)
    assert "cluster.placement.rollout (num_cpus=1, resources={'rollout': 1.0})" in msg
    assert "rollout.num_engines=1" in msg
    assert "node 10.0.0.1 (" in msg and "head): CPU 4" in msg and "CPU 2, GPU 1" in msg
    assert "memory" not in msg and "node:" not in msg


def test_no_single_node_holds_the_combination():
    cfg = _cfg("cluster.placement.trainer.num_gpus=1", "cluster.placement.trainer.num_cpus=4")
    with pytest.raises(ConfigError, match=r"cluster\.placement\.trainer \(num_cpus=4, num_gpus=1\).*no single node has all of it"):
        check_placement(cfg, nodes=[_node("10.0.0.1", 8), _node("10.0.0.2", 2, gpu=1)])


def test_num_engines_larger_than_cluster_holds():
    cfg = _cfg("cluster.placement.rollout.resources={rollout: 1}", "rollout.num_engines=3")
    nodes = [_node("10.0.0.1", 4, rollout=1.0), _node("10.0.0.2", 4, rollout=1.0)]
    with pytest.raises(ConfigError) as e:
        check_placement(cfg, nodes=nodes)
    assert "rollout.num_engines=3" in str(e.value)
    assert "holds at most 2 of them" in str(e.value)
    check_placement(_cfg("cluster.placement.rollout.resources={rollout: 1}", "rollout.num_engines=2"), nodes=nodes)


def test_num_ranks_larger_than_cluster_holds():
    cfg = _cfg("trainer.num_ranks=3", "cluster.placement.trainer.num_gpus=1")
    with pytest.raises(ConfigError, match=r"trainer\.num_ranks=3 .*holds at most 2"):
        check_placement(cfg, nodes=[_node("10.0.0.1", 16, gpu=1), _node("10.0.0.2", 16, gpu=1)])


def test_roles_that_fit_alone_but_not_together():
    # 2 ranks x 2 CPU and 2 engines x 2 CPU: each fits alone on 2 x 4-CPU nodes, not all four (8 > 6).
    cfg = _cfg("trainer.num_ranks=2", "rollout.num_engines=2", "cluster.placement.trainer.num_cpus=2",
               "cluster.placement.rollout.num_cpus=2")
    nodes = [_node("10.0.0.1", 3), _node("10.0.0.2", 3)]
    with pytest.raises(ConfigError) as e:
        check_placement(cfg, nodes=nodes)
    msg = str(e.value)
    assert "trainer.num_ranks=2, rollout.num_engines=2 do not fit the cluster together" in msg
    assert "in all CPU 8" in msg
    check_placement(cfg, nodes=[_node("10.0.0.1", 4), _node("10.0.0.2", 4)])


def test_packing_is_exact_not_greedy():
    # 2 ranks x 4 CPU and 4 engines x 3 CPU on two 10-CPU nodes: first-fit decreasing puts both
    # ranks on one node and strands the 4th engine; 4+3+3 on each node fits.
    cfg = _cfg("trainer.num_ranks=2", "cluster.placement.trainer.num_cpus=4", "rollout.num_engines=4",
               "cluster.placement.rollout.num_cpus=3")
    check_placement(cfg, nodes=[_node("10.0.0.1", 10), _node("10.0.0.2", 10)])
    with pytest.raises(ConfigError, match="do not fit the cluster together"):
        check_placement(cfg, nodes=[_node("10.0.0.1", 10), _node("10.0.0.2", 9)])


def test_sandbox_hosts_are_counted():
    cfg = _cfg("cluster.sandbox_hosts=3", "cluster.placement.sandbox.resources={sandbox: 1}")
    with pytest.raises(ConfigError, match=r"cluster\.sandbox_hosts=3 with cluster\.placement\.sandbox .*holds at most 2"):
        check_placement(cfg, nodes=[_node("10.0.0.1", 4, sandbox=2.0)])


def test_custom_resource_placement_over_three_nodes():
    cfg = _cfg("trainer.num_ranks=2", "rollout.num_engines=2",
               "cluster.placement.trainer.resources={trainer: 1}", "cluster.placement.rollout.resources={rollout: 1}")
    nodes = [_node("10.0.0.1", 1, head=True, trainer=1.0), _node("10.0.0.2", 1, trainer=1.0),
             _node("10.0.0.3", 2, rollout=2.0)]
    check_placement(cfg, nodes=nodes)
    with pytest.raises(ConfigError, match=r"trainer\.num_ranks=2 .*holds at most 1"):
        check_placement(cfg, nodes=nodes[:1] + nodes[2:])


# Real messages, as Ray 2.60 raised them here (pids, ids and the top-memory table shortened).
OOM_TEXT = (
    "1 worker(s) were killed due to the node running low on memory. Memory on the node (IP: 192.0.2.2, ID: "
    "0bc4f3e20c65e6eed32bc4e7e0d715bb148f12ed8fb959bde3546671) was 5.66GB used / 23.54GB limit (0.240541)\n"
    "OOM kill reason: Memory usage 6038810624B exceeded threshold of 6015809536B (23.8% of 25276510208B limit)\n"
    "Object store memory usage: [- objects spillable: 0\n- bytes spillable: 0]\n"
    "Ray killed 1 worker(s) based on the killing policy\nConsidered workers: [\n"
    "Selected to kill: (Actor(bb2858bb0efaa4c2803c9e8901000000): job ID=01000000, lease ID=00000000, "
    "task name=rollout-0:RolloutActor.__init__, required resources={'CPU': 1.0}, pid=17784, actual memory "
    "used=1.42GB, worker ID=f698eb9a)\n]\nTotal non-selected idle workers: 0\n"
    "Top 10 memory users: PID\tMEM(GB)\tCOMMAND\n17784\t1.42\tray::RolloutActor\n"
)


def test_memory_monitor_kill_is_one_line_naming_actor_node_memory():
    from ray.exceptions import OutOfMemoryError

    msg = actor_failure_message(OutOfMemoryError(OOM_TEXT))
    assert "\n" not in msg
    assert msg.startswith("actor RolloutActor 'rollout-0' (pid 17784) on node 192.0.2.2 "
                          "(node id 0bc4f3e20c65e6eed32bc4e7e0d715bb148f12ed8fb959bde3546671) "
                          "was killed by Ray's memory monitor: it used 1.42GB; the node had 5.66GB used of 23.54GB "
                          "(kill threshold 23.8%)")
    assert actor_failure_message(OutOfMemoryError(OOM_TEXT), "rollout engine 0").startswith(
        "actor rollout engine 0 (pid 17784) on node 192.0.2.2")
    err = as_cluster_error(OutOfMemoryError(OOM_TEXT))
    assert isinstance(err, ClusterError) and str(err) == msg


def _died(text):
    from ray.exceptions import RayActorError

    return RayActorError("c2f66164693f2c7b661a429f01000000", text)


def test_node_death_and_worker_crash_are_one_line():
    node = _died("The actor died unexpectedly before finishing this task.\n\tclass_name: RolloutActor\n"
                 "\tactor_id: c2f66164693f2c7b661a429f01000000\n\tpid: 18479\n\tname: rollout-1\n\tnamespace: x\n"
                 "\tip: 192.0.2.3\nThe actor died because its node has died. Node Id: 7a68cb6eeb\n"
                 "\tthe actor's node was terminated expectedly: received SIGTERM")
    assert actor_failure_message(node) == (
        "actor RolloutActor 'rollout-1' (pid 18479) on node 192.0.2.3 (node id 7a68cb6eeb) died: its node has "
        "died. the actor's node was terminated expectedly: received SIGTERM")
    crash = _died("The actor died unexpectedly before finishing this task.\n\tclass_name: TrainerActor\n"
                  "\tactor_id: 470a\n\tpid: 18573\n\tip: 192.0.2.2\nThe actor is dead because its worker process "
                  "has died. Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
                  "connection error code 2. End of file. Some common causes include: (1) the process was killed "
                  "by the OOM killer due to high memory usage")
    msg = actor_failure_message(crash)
    assert msg == ("actor TrainerActor (pid 18573) on node 192.0.2.2 died: its worker process has died. Worker exit "
                   "type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. "
                   "End of file.")
    assert "memory monitor" not in msg  # a crash that *mentions* OOM is not the memory monitor's kill


def test_constructor_errors_and_other_exceptions_stay_what_they_are():
    from ray.exceptions import RayActorError

    init_failed = RayActorError("ab", "The actor died because of an error raised in its creation task, ...\n"
                                "agentrl.errors.ConfigError: env.id='x' unknown", actor_init_failed=True)
    assert as_cluster_error(init_failed) is None
    assert as_cluster_error(ValueError("x")) is None
    assert as_cluster_error(ClusterError("already one line")) is None


def test_packing_at_scale_is_quick_and_exact():
    # First-fit decreasing misses this one (two ranks per node first leaves 4 CPU-3 engines
    # homeless); the search finds 4+3+3 on each of the 8 nodes, and proves 1 CPU short impossible.
    import time

    cfg = _cfg("trainer.num_ranks=8", "cluster.placement.trainer.num_cpus=4", "rollout.num_engines=16",
               "cluster.placement.rollout.num_cpus=3", "cluster.sandbox_hosts=1000", "cluster.placement.sandbox.num_cpus=0")
    t0 = time.perf_counter()
    check_placement(cfg, nodes=[_node(f"10.0.0.{i}", 10) for i in range(8)])
    with pytest.raises(ConfigError, match="do not fit the cluster together"):
        check_placement(cfg, nodes=[_node(f"10.0.0.{i}", 10) for i in range(7)] + [_node("10.0.0.9", 9)])
    assert time.perf_counter() - t0 < 5


def test_cluster_address_local_is_unset_and_empty_is_an_error():
    """'local' (Ray's own word for a new local instance) is the unset address, so cluster.num_cpus
    applies to it and RAY_ADDRESS is ignored as for None; an empty address is a ConfigError at load,
    not a failed join of '' after Ray is asked for it."""
    assert _cfg("cluster.address=local").cluster.address is None
    assert _cfg("cluster.address=auto").cluster.address == "auto"
    for bad in ("cluster.address=", "cluster.address='  '"):
        with pytest.raises(ConfigError, match=r"cluster\.address"):
            _cfg(bad)


def test_too_many_actors_for_the_local_instance_names_cluster_num_cpus():
    """On the local instance (cluster.address unset) the CPUs are cluster.num_cpus's: the error
    says so, since that is the knob; on a joined cluster it does not."""
    local = _cfg("trainer.num_ranks=2", "rollout.num_engines=3")
    with pytest.raises(ConfigError, match=r"local Ray instance.*cluster\.num_cpus"):
        check_placement(local, nodes=[_node("10.0.0.1", 4, head=True)])
    joined = _cfg("trainer.num_ranks=2", "rollout.num_engines=3", "cluster.address=auto")
    with pytest.raises(ConfigError) as err:
        check_placement(joined, nodes=[_node("10.0.0.1", 4, head=True)])
    assert "cluster.num_cpus" not in str(err.value)


def test_a_local_ray_that_does_not_start_is_one_cluster_error(monkeypatch):
    """Under load, Ray's local start can fail with "The current node timed out during startup"
    (a bare Exception from ray.init): the run gets one ClusterError line naming it and where Ray
    logged why, not a raw traceback. A stand-in ray.init; the real local start is what every
    integration test's ``agentrl train`` does."""
    import ray

    from agentrl.cluster.actors.ray_connect import connect

    said = ("The current node timed out during startup. This could happen because some of the raylet "
            "failed to startup or the GCS has become overloaded.")

    def init(*args, **kwargs):
        raise Exception(said)

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", init)
    with pytest.raises(ClusterError) as info:
        connect(load_config(None, []))
    msg = str(info.value)
    assert "starting a local Ray instance failed" in msg and said in msg and "/tmp/ray/session_latest/logs" in msg
    assert "\n" not in msg
