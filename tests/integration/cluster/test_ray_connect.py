"""connect / check_placement / actor_failure_message against real Ray instances.

A one-node cluster (``ray.cluster_utils.Cluster``, 2 CPUs, its own ``RAY_TMPDIR`` so the record
it writes, like ``ray start`` does, never touches another Ray user's ``/tmp/ray``) stands for
"a cluster that is already running": with ``RAY_ADDRESS`` pointing at it, an unset
``cluster.address`` must still start a new local instance, ``auto`` must join it. The last test
kills the head without a clean shutdown, which leaves its record behind naming a dead cluster
(what broke ``agentrl train`` before), and checks that an unset address still starts.
"""

import os
import shutil
import socket
import tempfile
import time

import pytest

from agentrl.config import load_config
from agentrl.errors import ClusterError, ConfigError

ray = pytest.importorskip("ray")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _gcs() -> str:
    return ray.get_runtime_context().gcs_address


def _enable_token_auth(mp) -> None:
    try:
        from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
        from ray._raylet import Config
    except ImportError:  # a Ray without token authentication
        return
    mp.setenv("RAY_AUTH_MODE", "token")
    Config.initialize("")
    ensure_token_if_auth_enabled(None, create_token_if_missing=True)


@pytest.fixture(scope="module")
def head():
    from ray.cluster_utils import Cluster

    assert not ray.is_initialized()
    tmp = tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp")  # short: Ray's socket paths live under it
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_TMPDIR", tmp)
        mp.delenv("RAY_ADDRESS", raising=False)
        # Token authentication as a local ray.init() turns it on (Ray >= 2.59) and as `ray start`
        # clusters use it, before the head starts: head, local instances and joins then agree
        # (a driver that turned it on for a local instance cannot use a head started without it).
        _enable_token_auth(mp)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "resources": {"trainer": 1}})
        try:
            yield cluster
        finally:
            if ray.is_initialized():
                ray.shutdown()
            cluster.shutdown()  # also removes the record, stale or not
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def fresh():
    """Every test leaves Ray as it found it: not initialised."""
    assert not ray.is_initialized()
    yield
    if ray.is_initialized():
        ray.shutdown()


def test_unset_address_starts_a_local_instance_whatever_RAY_ADDRESS_says(head, fresh, monkeypatch):
    from agentrl.cluster.actors.ray_connect import connect

    monkeypatch.setenv("RAY_ADDRESS", head.address)
    # What the controller did before: address None follows RAY_ADDRESS, then refuses num_cpus.
    with pytest.raises(ValueError, match="num_cpus and num_gpus must not be provided"):
        ray.init(address=None, num_cpus=3, include_dashboard=False)
    assert connect(load_config(None, ["cluster.num_cpus=3"])) is True
    assert _gcs() != head.address
    assert ray.cluster_resources()["CPU"] == 3.0
    assert connect(load_config(None, [])) is False  # already initialised: used as it is


def test_auto_joins_RAY_ADDRESS_and_checks_placement_on_its_nodes(head, fresh, monkeypatch):
    from agentrl.cluster.actors.placement import check_placement, role_options
    from agentrl.cluster.actors.ray_connect import connect

    monkeypatch.setenv("RAY_ADDRESS", head.address)
    cfg = load_config(None, ["cluster.address=auto", "cluster.placement.trainer.resources={trainer: 1}"])
    assert connect(cfg) is True
    assert _gcs() == head.address
    assert ray.cluster_resources()["CPU"] == 2.0
    check_placement(cfg)  # 1 rank needing 'trainer' + 1 engine: fits the head's 2 CPUs

    bad = load_config(None, ["cluster.address=auto", "rollout.num_engines=3"])
    with pytest.raises(ConfigError) as e:
        check_placement(bad)
    assert "rollout.num_engines=3" in str(e.value)
    assert f"node {head.head_node.node_ip_address} (" in str(e.value) and "CPU 2, trainer 1" in str(e.value)
    nowhere = load_config(None, ["cluster.address=auto", "cluster.placement.rollout.resources={rollout: 1}"])
    with pytest.raises(ConfigError, match=r"cluster\.placement\.rollout \(num_cpus=1, resources=\{'rollout': 1\.0\}\)"):
        check_placement(nowhere)

    # A real actor death, as the controller reports it: one line naming actor and node.
    from agentrl.cluster.actors.actor_errors import actor_failure_message, as_cluster_error

    @ray.remote
    class Probe:
        def ping(self):
            return os.getpid()

    actor = Probe.options(name="probe-0", **role_options(cfg, "trainer")).remote()
    pid = ray.get(actor.ping.remote())
    ray.kill(actor)
    # ray.kill is asynchronous: under load a call can still be served before the kill lands
    # (fresh-clone CI: "DID NOT RAISE"), so call until the death shows, within a bound
    deadline = time.monotonic() + 30.0
    with pytest.raises(ray.exceptions.RayActorError) as died:
        while time.monotonic() < deadline:
            ray.get(actor.ping.remote())
            time.sleep(0.1)
    msg = actor_failure_message(died.value)
    assert msg == (f"actor Probe 'probe-0' (pid {pid}) on node {head.head_node.node_ip_address} died: "
                   "it was killed by `ray.kill`.")
    assert str(as_cluster_error(died.value)) == msg


def test_a_dead_address_is_a_ClusterError_at_once(fresh, monkeypatch):
    from agentrl.cluster.actors.ray_connect import connect

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    port = _free_port()
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match=rf"cluster\.address='127\.0\.0\.1:{port}': could not join .*nothing answers"):
        connect(load_config(None, [f"cluster.address=127.0.0.1:{port}"]))
    assert time.perf_counter() - t0 < 15  # Ray alone retried this for ~14 minutes
    assert not ray.is_initialized()


def test_memory_monitor_kill_is_one_line_naming_actor_node_and_memory(head, fresh, monkeypatch):
    """A real kill: a second node whose memory monitor has its threshold at 5% of the node's
    memory (every machine is above that) kills the actor's worker while it runs a call."""
    from agentrl.cluster.actors.actor_errors import as_cluster_error
    from agentrl.cluster.actors.ray_connect import connect

    monkeypatch.setenv("RAY_ADDRESS", head.address)
    connect(load_config(None, ["cluster.address=auto"]))
    with monkeypatch.context() as mp:  # read by the new node's raylet when it starts
        mp.setenv("RAY_memory_usage_threshold", "0.05")
        mp.setenv("RAY_memory_monitor_refresh_ms", "100")
        node = head.add_node(num_cpus=1, resources={"low_memory": 1})
    try:
        @ray.remote(max_restarts=0)
        class Hog:
            def hold(self, seconds):
                # 1.5 GiB touched: the node is over 5 % of its memory even on an idle machine
                # (on a quiet 23 GiB machine the rest alone can stay under it, and nothing is killed)
                blob = b"x" * (1536 << 20)
                time.sleep(seconds)  # the monitor kills workers that are running a task
                return os.getpid() + len(blob) * 0

        actor = Hog.options(name="hog-0", num_cpus=1, resources={"low_memory": 1}).remote()
        t0 = time.perf_counter()
        with pytest.raises(ray.exceptions.OutOfMemoryError) as killed:
            ray.get(actor.hold.remote(60), timeout=90)
        assert time.perf_counter() - t0 < 30
        err = as_cluster_error(killed.value)
        assert isinstance(err, ClusterError)
        msg = str(err)
        assert "\n" not in msg
        assert msg.startswith("actor Hog 'hog-0' (pid ")
        assert f"on node {node.node_ip_address} (node id {node.node_id}) was killed by Ray's memory monitor: " in msg
        assert "it used " in msg and "GB; the node had " in msg and "(kill threshold 5.0%)" in msg
    finally:
        ray.shutdown()
        head.remove_node(node, allow_graceful=False)


def test_stale_record_of_a_dead_cluster_does_not_break_an_unset_address(head, fresh, monkeypatch):
    from ray._private.utils import read_ray_address

    from agentrl.cluster.actors.ray_connect import connect

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    dead = head.address
    head.remove_node(head.head_node, allow_graceful=False)  # the head dies; its record stays
    assert read_ray_address() == dead
    assert connect(load_config(None, ["cluster.num_cpus=2"])) is True
    assert _gcs() != dead
    ray.shutdown()
    # 'auto' follows the record: the dead cluster is a ClusterError naming it, not a 14-minute wait.
    with pytest.raises(ClusterError, match=r"cluster\.address='auto'.*nothing answers"):
        connect(load_config(None, ["cluster.address=auto"]))
