"""Owner identity in sandbox labels: pid, start time and pid namespace, through the
environment, directory names and the Ray owner token; labels of the older format (no pid
namespace) still parse and are judged as the reader's namespace's; an owner of another pid
namespace is never judged gone. The reaper's behaviour across real namespaces:
tests/integration/sandboxes/test_reaper_namespaces.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sandboxes.labels import OWNER_PIDNS_ENV, Owner, OwnerJudge, SandboxLabel, namespaced_pids, pid_namespace


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_owner_carries_this_pid_namespace_through_environment_and_directory_names():
    owner = Owner.current()
    assert owner.pid_ns == pid_namespace() == os.stat("/proc/self/ns/pid").st_ino
    label = SandboxLabel("run-1", owner, "0123456789ab")
    assert label.dir_name == f"{owner.pid}-{owner.start_ticks}-{owner.pid_ns}-0123456789ab"
    assert label.environ()[OWNER_PIDNS_ENV] == str(owner.pid_ns)
    assert SandboxLabel.from_environ(label.environ()) == label
    assert SandboxLabel.from_dir("run-1", label.dir_name) == label
    assert Owner.parse_token(owner.token()) == owner
    assert owner.is_local() and owner.is_alive()


@pytest.mark.parametrize(
    ("name", "owner", "sid"),
    [
        ("123-456-0123456789ab", Owner(123, 456), "0123456789ab"),  # older format: no namespace
        ("123-456-012345678901", Owner(123, 456), "012345678901"),  # older, an all-digit sandbox id
        ("123-456-4026531836-012345678901", Owner(123, 456, 4026531836), "012345678901"),
        ("123-456-4026531836-abcdef", Owner(123, 456, 4026531836), "abcdef"),
    ],
)
def test_directory_names_of_both_formats_parse_without_ambiguity(name, owner, sid):
    label = SandboxLabel.from_dir("r", name)
    assert label == SandboxLabel("r", owner, sid)
    assert label.dir_name == name


@pytest.mark.parametrize(
    "name",
    ["not-a-sandbox", "1-2-3-4-abcdef", "1-2-abcde", "1-2-ABCDEF", "1-2-abcdef\n", "-1-2-abcdef",
     "1-2--abcdef", "\u0661-2-abcdef", "1-2-3-abcdef-"],
)
def test_other_directory_names_are_not_sandboxes(name):
    assert SandboxLabel.from_dir("r", name) is None


def test_environment_labels_of_both_formats_parse():
    old = {"AGENTRL_RUN_ID": "r", "AGENTRL_OWNER_PID": "12", "AGENTRL_OWNER_START": "34", "AGENTRL_SANDBOX_ID": "ab"}
    assert SandboxLabel.from_environ(old) == SandboxLabel("r", Owner(12, 34, None), "ab")
    assert SandboxLabel.from_environ({**old, OWNER_PIDNS_ENV: "56"}) == SandboxLabel("r", Owner(12, 34, 56), "ab")
    assert SandboxLabel.from_environ({**old, OWNER_PIDNS_ENV: "x"}).owner == Owner(0, -1)  # malformed
    assert SandboxLabel.from_environ({"PATH": "/usr/bin"}) is None


def test_ray_owner_tokens_of_both_formats_parse():
    assert Owner.parse_token("12-34") == Owner(12, 34, None)
    assert Owner.parse_token("12-34-56") == Owner(12, 34, 56)
    assert Owner(12, 34).token() == "12-34" and Owner(12, 34, 56).token() == "12-34-56"
    for bad in ("12", "12-34-56-78", "a-34", "12--34", "12-34-", "\u0661-2"):
        assert Owner.parse_token(bad) is None, bad


def test_only_owners_of_this_pid_namespace_are_judged_gone():
    here, dead = pid_namespace(), _dead_pid()
    assert not Owner(dead, 1, here).is_alive()  # this namespace's, gone
    assert not Owner(dead, 1, None).is_alive()  # an older label: judged as this namespace's
    me = Owner.current()
    assert not Owner(me.pid, me.start_ticks + 1, here).is_alive()  # same pid, another process
    other = Owner(dead, 1, here + 1)  # another namespace: its pid means nothing here
    assert not other.is_local() and other.is_alive()
    unknown = Owner(dead, 1, 0)  # written where the namespace could not be told
    assert not unknown.is_local() and unknown.is_alive()


def test_owner_judge_tells_gone_running_and_cannot_tell_apart():
    here, dead, me = pid_namespace(), _dead_pid(), Owner.current()
    judge = OwnerJudge()
    assert judge.is_gone(Owner(dead, 1, here)) is True
    assert judge.is_gone(Owner(dead, 1, None)) is True  # an older label: this namespace's
    assert judge.is_gone(me) is False
    assert judge.is_gone(Owner(dead, 1, 0)) is None  # namespace unknown: never judged
    # A namespace that holds no process: gone when this process sees every namespace below it
    # (root in the initial pid namespace), else it cannot be told.
    expected = None if namespaced_pids() is None else True
    assert judge.is_gone(Owner(dead, 1, here + 1)) is expected
