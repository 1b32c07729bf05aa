"""Pure parts of the trainer ranks' meeting: the interface gloo is pinned to (the one holding
the node's IP, checked against psutil's view of this machine's interfaces), and the
driver's deadline for the meeting."""

from __future__ import annotations

import socket

import psutil
import pytest

from agentrl.cluster.actors.trainer_actor import _interface_of
from agentrl.cluster.actors.trainer_group import rendezvous_deadline_s


def test_interface_of_each_ipv4_address_of_this_machine():
    pairs = [(name, a.address) for name, addrs in psutil.net_if_addrs().items() for a in addrs
             if a.family == socket.AF_INET and not a.address.startswith("127.")]
    if not pairs:
        pytest.skip("this machine has no IPv4 address outside loopback")
    for name, addr in pairs:
        assert _interface_of(addr) == name, (name, addr)


@pytest.mark.parametrize("ip", ["127.0.0.1", "::1", "fd00::2", "203.0.113.77"])
def test_no_interface_for_loopback_ipv6_or_a_foreign_address(ip):
    assert _interface_of(ip) is None


def test_driver_deadline_exceeds_each_ranks_own_bound():
    assert rendezvous_deadline_s(5.0) == pytest.approx(10.5)
    assert rendezvous_deadline_s(120.0) == pytest.approx(137.0)
