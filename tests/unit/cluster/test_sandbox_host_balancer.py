"""``HostBalancer`` (which sandbox host a rollout actor uses next) (``agentrl.cluster.actors.remote_sandbox``) and the
pure helpers of ``agentrl.cluster.actors.sandbox_host``; the hosts themselves run on real Ray in
``tests/integration/cluster/test_sandbox_host.py``."""

from __future__ import annotations

import threading

import pytest

from agentrl.cluster.actors.remote_sandbox import HostBalancer
from agentrl.cluster.actors.sandbox_host import _error_reply, _spec_of, sandbox_spec
from agentrl.config import load_config
from agentrl.errors import ConfigError, SandboxError
from sandboxes import SandboxSpec


def test_ties_go_round_robin_from_the_start_index():
    b = HostBalancer(3, start=1)
    picks = []
    for _ in range(6):
        i = b.pick()
        picks.append(i)
        b.opened(i)
    assert picks == [1, 2, 0, 1, 2, 0]
    assert b.open_counts() == [2, 2, 2]


def test_least_loaded_host_wins():
    b = HostBalancer(3)
    for i in (0, 0, 1):
        b.opened(i)
    assert b.pick() == 2
    b.opened(2)
    b.opened(2)
    assert b.open_counts() == [2, 1, 2]
    assert b.pick() == 1
    b.closed(0)
    b.closed(0)
    assert b.pick() == 0


def test_lost_hosts_take_no_new_sandboxes():
    b = HostBalancer(2)
    b.lost(0)
    assert [b.pick() for _ in range(3)] == [1, 1, 1]
    b.lost(1)
    assert b.pick() is None
    assert b.lost_hosts() == [0, 1]


def test_closed_never_goes_negative_and_start_wraps():
    b = HostBalancer(2, start=5)
    assert b.pick() == 1
    b.closed(1)
    assert b.open_counts() == [0, 0]


def test_concurrent_use_keeps_counts_exact():
    b = HostBalancer(4)

    def work():
        for _ in range(500):
            i = b.pick()
            b.opened(i)
            b.closed(i)
        b.opened(b.pick())

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(b.open_counts()) == [2, 2, 2, 2]


def test_bad_host_count_is_a_config_error():
    with pytest.raises(ConfigError, match="n_hosts=0"):
        HostBalancer(0)


def test_spec_from_dict_and_errors():
    spec = SandboxSpec(memory_mb=256, run_id="r1")
    assert _spec_of(spec) is spec
    assert _spec_of({"memory_mb": 256, "run_id": "r1"}) == spec
    with pytest.raises(ConfigError, match="not a SandboxSpec"):
        _spec_of({"memory": 256})
    with pytest.raises(ConfigError, match="must be a SandboxSpec"):
        _spec_of(3)


def test_error_replies_keep_class_command_and_output():
    assert _error_reply(ConfigError("timeout_s=-1 must be > 0"))[:3] == ("error", "ConfigError", "timeout_s=-1 must be > 0")
    reply = _error_reply(SandboxError("died", command=("python3", "-c", "1"), output="boom"))
    assert reply == ("error", "SandboxError", "died", ("python3", "-c", "1"), "boom")
    # Anything else is the sandbox's failure, named by its type.
    assert _error_reply(OSError(28, "No space left on device"))[1:3] == (
        "SandboxError", "OSError: [Errno 28] No space left on device")


def test_sandbox_spec_follows_the_sandbox_section():
    cfg = load_config(None, ["sandbox.memory_mb=300", "sandbox.timeout_s=7", "sandbox.pids_limit=64"])
    spec = sandbox_spec(cfg, "run-x")
    assert (spec.memory_mb, spec.default_timeout_s, spec.pids_limit, spec.run_id) == (300, 7.0, 64, "run-x")
