"""Sandboxes on a node of their own (``cluster.sandbox_hosts``), on a real two-node Ray
cluster on this machine (``ray.cluster_utils.Cluster``): the ``SandboxHost`` lands on the
node that has the ``sandbox`` resource, a ``RemoteSandbox`` used from the driver and from
another actor runs real bubblewrap commands there, a lost host is an infrastructure error
naming host and node, and nothing of the run is left once the hosts are stopped."""

from __future__ import annotations

import threading
import time

import pytest

import environments  # noqa: F401  (registers agentrl/HumanEval-v0)
from agentrl.cluster.actors.remote_sandbox import HostBalancer, HostLost, RemoteSandbox, make_remote_sandbox
from agentrl.cluster.actors.sandbox_host import sandbox_spec, start_sandbox_hosts, stop_sandbox_hosts
from agentrl.config import load_config
from agentrl.errors import ClusterError, ConfigError, InfraError, SandboxError
from sandboxes.labels import sandbox_root

RUN = "test-sandbox-host"


def _cfg(run_id_suffix: str = "", **extra: str):
    overrides = ["env.id=agentrl/HumanEval-v0", "sandbox.backend=bwrap", "sandbox.memory_mb=512",
                 "cluster.sandbox_hosts=1",
                 "cluster.placement.sandbox.num_cpus=0.5", "cluster.placement.sandbox.resources={sandbox: 1}"]
    return load_config(None, overrides + [f"{k}={v}" for k, v in extra.items()])


@pytest.fixture(scope="module")
def ray_cluster():
    """Two nodes on this machine: the head (the driver's, 2 CPUs) and one with ``sandbox: 1``."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    c.add_node(num_cpus=1, resources={"sandbox": 1})
    ray.init(address=c.address, logging_level="WARNING")
    try:
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture
def cluster(ray_cluster):
    import ray

    return ray


@pytest.fixture
def host(cluster):
    hosts = start_sandbox_hosts(_cfg(), RUN)
    yield hosts[0]
    stop_sandbox_hosts(hosts)


def test_no_hosts_by_default(cluster):
    assert start_sandbox_hosts(load_config(None, []), RUN) == []


def test_host_runs_on_the_sandbox_node(cluster, host):
    ray = cluster
    sandbox_nodes = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("sandbox")]
    assert host.node_id in sandbox_nodes
    assert host.node_id != ray.get_runtime_context().get_node_id()  # not the driver's node
    assert host.backend == "bwrap" and host.name == "sandbox-host-0"
    assert "sandbox-host-0" in host.where() and host.node_ip in host.where()


def test_remote_exec_files_listeners_and_close(cluster, host):
    spec = sandbox_spec(_cfg(), RUN)
    sb = RemoteSandbox(host, spec)
    seen = []
    sb.add_listener(seen.append)
    try:
        r = sb.exec(["python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"])
        assert (r.exit_code, r.stdout, r.stderr, r.timed_out) == (3, "out\n", "err\n", False)
        assert r.command == ("python3", "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)")
        assert 0 < r.duration_s < 10
        assert seen == [r]  # the listener fired here, in the caller's process

        t0 = time.monotonic()
        slow = sb.exec("sleep 20", timeout_s=1.0)
        assert slow.timed_out and slow.exit_code == 137
        assert 0.9 < slow.duration_s < 5 and time.monotonic() - t0 < 10  # enforced on the host
        assert seen[-1] == slow

        sb.write_file("sub/data.txt", "héllo")
        assert sb.read_file("sub/data.txt") == "héllo".encode()
        assert sb.exec("cat sub/data.txt", stdin=b"").stdout == "héllo"
        assert sb.exec(["python3", "-"], stdin="print(6 * 7)").stdout == "42\n"
        with pytest.raises(SandboxError, match="(?i)no such file"):
            sb.read_file("missing.txt")
        with pytest.raises(ConfigError, match="timeout_s"):
            sb.exec("true", timeout_s=-1)
        assert len(seen) == 4  # failed calls produce no result

        # The sandbox runs on the host's node, isolated: no network, its own /tmp.
        assert sb.exec("cat /proc/sys/kernel/hostname").stdout.strip() == "agentrl-sandbox"
        assert cluster.get(host.actor.stats.remote())["open"] == 1
    finally:
        sb.close()
    sb.close()  # idempotent
    assert sb.closed
    assert cluster.get(host.actor.stats.remote())["open"] == 0
    with pytest.raises(SandboxError, match="is closed"):
        sb.exec("true")


def test_env_factory_with_hosts_scores_a_humaneval_episode_from_another_actor(cluster, host):
    """``EnvFactory`` in a Ray actor on the driver's node: the HumanEval env it makes
    gets a RemoteSandbox on the sandbox node, a tool call and the canonical solution run
    there, and the episode scores 1."""
    ray = cluster

    @ray.remote(num_cpus=0.5)
    class Rollout:
        def episode(self, cfg_dict, run_id, hosts):
            import json

            from agentrl.cluster.actors.env_factory import EnvFactory
            from agentrl.cluster.actors.remote_sandbox import RemoteSandbox
            from agentrl.config import Config
            from agentrl.types import EpisodeRequest
            from environments.humaneval import get_task

            cfg = Config.model_validate(cfg_dict)
            factory = EnvFactory(cfg, run_id, hosts, engine_index=1)
            env, sb = factory(EpisodeRequest(env_id=cfg.env.id, task_id="HumanEval/3", seed=0, group_id="g",
                                             sample_seed=0))
            execs = []
            sb.add_listener(execs.append)
            try:
                obs, _ = env.reset(seed=0, options={"task_id": "HumanEval/3"})
                call = json.dumps({"name": "python", "arguments": {"code": "print(1 + 1)"}})
                obs, reward0, *_ = env.step(f"<tool_call>{call}</tool_call>")
                answer = f"```python\n{get_task('HumanEval/3').canonical_program}\n```"
                _, reward, terminated, truncated, info = env.step(answer)
                return {"remote": isinstance(sb, RemoteSandbox), "backend": factory.backend, "pool": factory.pool,
                        "sandbox_node": sb.host.node_id, "my_node": ray.get_runtime_context().get_node_id(),
                        "tool_obs": obs, "reward0": reward0, "reward": reward, "terminated": terminated,
                        "tests": (info["tests_passed"], info["tests_total"]), "execs": len(execs),
                        "open": factory.balancer.open_counts()}
            finally:
                env.close()
                sb.close()

    actor = Rollout.remote()
    try:
        cfg = _cfg(**{"env.kwargs": "{split: all}"})
        out = ray.get(actor.episode.remote(cfg.model_dump(), RUN, [host]), timeout=100)
    finally:
        ray.kill(actor)
    assert out["remote"] and out["backend"] == "bwrap" and out["pool"] is None
    assert out["sandbox_node"] != out["my_node"]
    assert "stdout:\n2" in out["tool_obs"] and out["reward0"] == 0.0
    assert (out["reward"], out["terminated"], out["tests"]) == (1.0, True, (6, 6))
    assert out["execs"] >= 2 and out["open"] == [1]  # tool call + grading; still open at return
    assert cluster.get(host.actor.stats.remote())["open"] == 0  # closed by the actor


def test_host_side_pool(cluster):
    hosts = start_sandbox_hosts(_cfg(**{"sandbox.pool_size": "1"}), RUN)
    try:
        spec = sandbox_spec(_cfg(), RUN)
        a = RemoteSandbox(hosts[0], spec)
        a.write_file("left.txt", "x")
        a.close()  # back to the pool, reset there
        b = RemoteSandbox(hosts[0], spec)
        assert b.exec("ls -A").stdout == ""  # a reused sandbox starts empty
        b.close()
        stats = cluster.get(hosts[0].actor.stats.remote())
        assert stats["pool"]["started"] >= 1 and stats["created"] == 2
    finally:
        stop_sandbox_hosts(hosts)


def test_lost_host_is_an_infra_error_naming_host_and_node(cluster):
    ray = cluster
    hosts = start_sandbox_hosts(_cfg(), RUN)
    h = hosts[0]
    balancer = HostBalancer(1)
    sb = make_remote_sandbox(hosts, balancer, sandbox_spec(_cfg(), RUN))
    assert balancer.open_counts() == [1]
    caught: list[BaseException] = []

    def in_flight():
        try:
            sb.exec("sleep 30", timeout_s=60)
        except BaseException as exc:  # noqa: BLE001
            caught.append(exc)

    t = threading.Thread(target=in_flight)
    t.start()
    time.sleep(1.0)
    ray.kill(h.actor)
    t.join(timeout=30)
    assert not t.is_alive()
    assert len(caught) == 1 and isinstance(caught[0], HostLost) and isinstance(caught[0], InfraError)
    msg = str(caught[0])
    assert "sandbox-host-0" in msg and h.node_ip in msg and h.node_id[:12] in msg
    assert caught[0].command == "sleep 30"
    with pytest.raises(HostLost, match="sandbox-host-0"):
        sb.exec("true")
    assert balancer.lost_hosts() == [0]
    with pytest.raises(HostLost, match="no sandbox host is left"):
        make_remote_sandbox(hosts, balancer, sandbox_spec(_cfg(), RUN))
    sb.close()  # the host took the sandbox with it: closing is quiet
    assert balancer.open_counts() == [0]
    stop_sandbox_hosts(hosts)  # a dead host does not make the clean-up raise


def test_stop_closes_everything_of_the_run(cluster):
    run = "test-sandbox-host-stop"
    hosts = start_sandbox_hosts(_cfg(), run)
    sbs = [RemoteSandbox(hosts[0], sandbox_spec(_cfg(), run)) for _ in range(2)]
    assert sbs[0].exec("echo up").stdout == "up\n"
    run_dir = sandbox_root() / run
    assert len(list(run_dir.iterdir())) == 2  # one working directory per sandbox, on this machine
    stop_sandbox_hosts(hosts)
    assert not run_dir.exists() or list(run_dir.iterdir()) == []
    with pytest.raises(SandboxError, match="sandbox-host-0"):
        sbs[1].exec("true")


def test_unsatisfiable_placement_fails_at_start(cluster):
    cfg = _cfg(**{"cluster.placement.sandbox.resources": "{gpu_box: 1}"})
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match="sandbox-host-0 not started within 2 s.*gpu_box"):
        start_sandbox_hosts(cfg, RUN, start_timeout_s=2.0)
    assert time.monotonic() - t0 < 10


def test_removed_node_is_an_infra_error_naming_the_dead_node(cluster, ray_cluster):
    """The sandbox node itself goes away (as in the multi-node node-loss test): the next
    exec is a ``HostLost`` that names the host, its node, and that the node is dead."""
    ray, c = cluster, ray_cluster
    node = c.add_node(num_cpus=1, resources={"sandbox_b": 1})
    cfg = _cfg(**{"cluster.placement.sandbox.resources": "{sandbox_b: 1}"})
    hosts = start_sandbox_hosts(cfg, RUN)
    h = hosts[0]
    sb = RemoteSandbox(h, sandbox_spec(cfg, RUN))
    assert sb.exec("echo ok").stdout == "ok\n"
    c.remove_node(node)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if any(n["NodeID"] == h.node_id and not n["Alive"] for n in ray.nodes()):
            break
        time.sleep(0.2)
    with pytest.raises(HostLost, match=f"sandbox-host-0.*{h.node_id[:12]}.*the node is dead"):
        sb.exec("true")
    sb.close()
    stop_sandbox_hosts(hosts)
