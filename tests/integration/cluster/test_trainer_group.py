"""The trainer ranks on a Ray cluster of two nodes on this machine
(``ray.cluster_utils.Cluster``, each node holding one ``trainer`` resource, every rank asking
for one through ``cluster.placement.trainer``, so the two ranks land on different nodes):
they meet at rank 0's node IP and a port rank 0 bound there, and one ``train_step`` gives the
metrics and per-token values of a one-rank run; a meeting that cannot complete (a rank that never sets up, a rank
that cannot be placed) fails within the bound ``cluster.rendezvous_timeout_s`` sets, with a
``ClusterError`` naming the node and the port."""

from __future__ import annotations

import re
import time

import pytest

from agentrl.config import load_config
from agentrl.errors import ClusterError

pytestmark = pytest.mark.slow

RENDEZVOUS_S = 5.0  # the meeting of started ranks takes well under a second here
FAIL_S = 2.0  # the bound in the tests where the meeting cannot complete


@pytest.fixture(scope="module")
def cluster():
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "resources": {"trainer": 1}})
    c.add_node(num_cpus=1, resources={"trainer": 1})
    ray.init(address=c.address, logging_level="WARNING",
             runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}})
    try:
        yield ray
    finally:
        ray.shutdown()
        c.shutdown()


def _cfg(model_path: str, num_ranks: int, *extra: str, timeout_s: float = RENDEZVOUS_S):
    return load_config(None, [
        f"model.path={model_path}", f"trainer.num_ranks={num_ranks}", "trainer.lr=1e-3",
        "trainer.micro_batch_size=2", f"cluster.rendezvous_timeout_s={timeout_s}",
        "cluster.placement.trainer.num_cpus=1", "cluster.placement.trainer.resources={trainer: 1}", *extra,
    ])


def _group(cfg, model_path: str, group_cls=None):
    from agentrl.cluster.actors.placement import role_options
    from agentrl.cluster.actors.trainer_group import TrainerGroup

    return (group_cls or TrainerGroup)(cfg, cfg.model_dump(mode="json"), model_path, role_options(cfg, "trainer"))


def test_two_ranks_meet_at_rank0_node_and_step_like_one_rank(cluster, tiny_llama_path, process_group):
    from agentrl.config import trainer_configs
    import torch

    from agentrl.trainer import PolicyTrainer
    from tests.helpers.trainer import make_batch

    ray = cluster
    cfg = _cfg(tiny_llama_path, 2)
    group = _group(cfg, tiny_llama_path)
    try:
        nodes = [ray.get(a.node.remote()) for a in group.actors]
        assert nodes == group.nodes and [n["rank"] for n in nodes] == [0, 1]
        assert nodes[0]["node_id"] != nodes[1]["node_id"]  # one rank per node, by the trainer resource
        trainer_nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("trainer")}
        assert {n["node_id"] for n in nodes} == trainer_nodes
        assert group.master_addr == nodes[0]["node_ip"]  # rank 0's node, not the driver's loopback
        assert not group.master_addr.startswith("127.") and 0 < group.master_port < 65536

        batch = make_batch(num_rows=6, seed=3)
        two_step = group.train_step(batch)
        # a second update, called on each rank directly: only rank 0 sends per-token values back
        put = ray.put(batch)
        per_rank = ray.get([a.step.remote(put) for a in group.actors])
        assert per_rank[0].log_probs is not None and per_rank[0].entropies is not None
        assert per_rank[1].log_probs is None and per_rank[1].entropies is None and per_rank[1].metrics
    finally:
        group.kill()

    one_step = PolicyTrainer(trainer_configs(cfg, tiny_llama_path)[0]).step(batch)  # a one-rank run, in this process
    one, two = one_step.metrics, two_step.metrics
    for got, want in ((two_step.log_probs, one_step.log_probs), (two_step.entropies, one_step.entropies)):
        assert got.shape == (batch.num_tokens,) and got.dtype == torch.float32  # every rank's rows, on rank 0
        torch.testing.assert_close(got, want, atol=1e-6, rtol=0)
    assert two.keys() == one.keys()
    assert one["actor/grad_norm"] > 1e-3 and one["actor/num_loss_tokens"] > 0  # a real update to compare
    for key, value in one.items():
        if not key.startswith(("perf/", "time/")):  # throughput and wall time differ by nature
            assert two[key] == pytest.approx(value, abs=1e-6), key


def test_rendezvous_with_a_rank_that_never_sets_up_fails_in_bounded_time(cluster, tiny_llama_path):
    from agentrl.cluster.actors.trainer_group import TrainerGroup, rendezvous_deadline_s

    class OnlyRankZeroMeets(TrainerGroup):
        """world_size 2, but only rank 0 is asked to set up: rank 1 never arrives."""

        def _meet(self) -> None:
            self._actors, others = self._actors[:1], self._actors[1:]
            try:
                super()._meet()
            finally:
                self._actors += others

    t0 = time.monotonic()
    with pytest.raises(ClusterError) as info:
        _group(_cfg(tiny_llama_path, 2, timeout_s=FAIL_S), tiny_llama_path, OnlyRankZeroMeets)
    waited = time.monotonic() - t0
    msg = str(info.value)
    node_ip = re.search(r"rank 0's node (\S+) port (\d+)", msg)
    assert node_ip, msg
    assert node_ip.group(1) == cluster.util.get_node_ip_address()  # this machine's interface address
    assert f"rendezvous_timeout_s={FAIL_S:g} s" in msg and "rank(s) [0] did not finish" in msg
    assert "waiting for clients" in msg  # rank 0's store waited for rank 1 and said so
    # rank 0 gave up after its own bound; the whole start (two actors, torch imports) stays bounded
    assert waited < rendezvous_deadline_s(FAIL_S) + 30.0, waited


def test_a_rank_dialing_a_port_nobody_listens_on_fails_in_bounded_time(cluster, tiny_llama_path):
    """Rank 1 of 2 sets up at rank 0's node IP but a port no one serves (bound, then closed):
    its store connect gives up on its own, naming the address and port."""
    import socket

    from agentrl.cluster.actors.trainer_actor import TrainerActor

    ray = cluster
    cfg = _cfg(tiny_llama_path, 2)
    ip = ray.util.get_node_ip_address()
    with socket.socket() as s:
        s.bind((ip, 0))
        port = s.getsockname()[1]
    rank1 = TrainerActor.options(num_cpus=1, resources={"trainer": 1}).remote(1, 2, cfg.model_dump(mode="json"),
                                                                              tiny_llama_path)
    try:
        ray.get(rank1.node.remote())  # started (torch imported): what follows is the meeting alone
        t0 = time.monotonic()
        with pytest.raises(ClusterError) as info:
            ray.get(rank1.setup.remote(ip, port, FAIL_S))
        waited = time.monotonic() - t0
    finally:
        ray.kill(rank1)
    msg = str(info.value)
    assert f"trainer rank 1 (node {ip}) could not meet rank 0 at {ip}:{port} within " \
           f"cluster.rendezvous_timeout_s={FAIL_S:g} s" in msg, msg
    assert "DistNetworkError" in msg
    # torch's client retries its connect once after the timeout: about 2 x the bound plus a back-off
    assert waited < 3 * FAIL_S + 5.0, waited


def test_a_rank_no_node_can_hold_is_a_bounded_placement_error(cluster, tiny_llama_path, monkeypatch):
    from agentrl.cluster.actors import trainer_group
    from agentrl.cluster.actors.trainer_group import TrainerGroup

    monkeypatch.setattr(trainer_group, "START_S", 0.0)  # the start allowance (60 s) is not what is tested here

    cfg = load_config(None, [f"model.path={tiny_llama_path}", "trainer.num_ranks=1",
                             "cluster.rendezvous_timeout_s=2"])
    t0 = time.monotonic()
    with pytest.raises(ClusterError, match=r"rank\(s\) \[0\] were not placed on any node \(or did not start\) "
                                           r"within cluster.rendezvous_timeout_s=2 s \+ 0 s to start.*'no_such_node'.*'trainer': 2\.0"):
        TrainerGroup(cfg, cfg.model_dump(mode="json"), tiny_llama_path, {"num_cpus": 1, "resources": {"no_such_node": 1}})
    assert time.monotonic() - t0 < 10.0
