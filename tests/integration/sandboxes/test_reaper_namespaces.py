"""The reaper judges only sandboxes whose owner it can look up (``sandboxes.labels.OwnerJudge``).

A process in another pid namespace (``unshare --pid --fork --mount-proc``, a container that
shares the cgroup file system, the sandbox root or the Docker daemon with the host) cannot look
up the owner of a sandbox made outside it: the owner's pid means another process there, or
none. Such a reaper must leave those sandboxes alone, and the host's reaper must leave the live
sandboxes made inside alone (it reaps them once their namespace is gone, where it can see that).
A real orphan (owner killed, same namespace) is still reaped.

Each reap here is limited to the test's run id: other suites' sandboxes may run on this machine.
Real bubblewrap, cgroups (when writable), namespaces (``unshare``, root) and Docker; no mocks.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers.sandbox_checks import (
    cgroup_run_dirs, containers_with_label, procs_with_label, require_docker, wait_until,
)

from sandboxes import BwrapSandbox, SandboxSpec, reap_orphans
from sandboxes.labels import namespaced_pids, sandbox_root
from sandboxes.reaper import reaper_lock

REPO = Path(__file__).resolve().parents[3]


def _unshare_argv() -> list[str]:
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a pid namespace of its own")
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]


def _in_new_pid_namespace(code: str, *args: str, **popen) -> subprocess.Popen:
    """``python -c code args...`` as pid 1 of a new pid namespace (with its own ``/proc``)."""
    return subprocess.Popen([*_unshare_argv(), sys.executable, "-c", code, *args], cwd=REPO, text=True, **popen)


def _run_in_new_pid_namespace(code: str) -> tuple[str, str]:
    """Runs ``code`` there with debug logging on stderr; returns (stdout, stderr)."""
    code = "import logging; logging.basicConfig(level=logging.DEBUG)\n" + code
    proc = _in_new_pid_namespace(code, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out, err


def test_reaper_in_another_pid_namespace_leaves_a_live_sandbox_alone(run_id):
    with BwrapSandbox(SandboxSpec(run_id=run_id)) as sb:
        cgroups = [d / sb.label.dir_name for d in cgroup_run_dirs(run_id)]  # [] in rlimit mode
        out, log = _run_in_new_pid_namespace(
            "import os; from sandboxes import reap_orphans\n"
            f"print(os.getpid(), os.stat('/proc/self/ns/pid').st_ino, reap_orphans({run_id!r}))"
        )
        inner_pid, inner_ns, reaped = out.split()
        assert inner_pid == "1" and int(inner_ns) != os.stat("/proc/self/ns/pid").st_ino  # it really ran elsewhere
        assert reaped == "0"
        assert f"left alone 1 sandboxes whose owner is of a pid namespace this one ({inner_ns}) cannot look into: " \
               f"{run_id}/{sb.label.sandbox_id} (pid ns {sb.label.owner.pid_ns})" in log
        assert sb.host_workdir.is_dir() and all(d.is_dir() for d in cgroups)
        assert sb.exec("echo ok").stdout == "ok\n"


def test_a_process_whose_proc_is_another_namespaces_judges_no_owner():
    """``unshare --pid --fork`` without ``--mount-proc``: ``/proc`` still shows the host's
    processes, so a pid of the new namespace cannot be looked up there; nothing is judged."""
    proc = subprocess.run(
        [*_unshare_argv()[:3], sys.executable, "-c",
         "import os; from sandboxes.labels import Owner, pid_namespace\n"
         "print(os.getpid(), pid_namespace(), Owner.current().pid_ns, Owner(999999999, 1).is_alive())"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )
    assert proc.stdout.split() == ["1", "None", "0", "True"]


_INNER_OWNER = """
import sys
from sandboxes import BwrapSandbox, SandboxSpec
sb = BwrapSandbox(SandboxSpec(run_id=sys.argv[1]))
print(sb.host_workdir, flush=True)
sb.exec("sleep 600", timeout_s=900)
"""


def test_host_reaper_leaves_live_sandboxes_of_a_child_pid_namespace_alone(run_id):
    """A live sandbox made in a child pid namespace (its exec's processes are visible here,
    labelled with an owner pid of that namespace) survives the host's reap; once the child
    namespace is gone, its leftovers are reaped from where that can be seen (root in the
    initial pid namespace), else left until ``include_live_owners`` (the run is over)."""
    inner = _in_new_pid_namespace(_INNER_OWNER, run_id, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    workdir = Path(inner.stdout.readline().strip())  # its sandbox (whose making reaps first) is up
    # the reaper lock: no other process's reaper takes what the killed owner leaves before this
    # test looks at it
    with reaper_lock():
        try:
            assert workdir.is_dir(), "the inner sandbox did not start"
            assert wait_until(lambda: len(procs_with_label(run_id)) >= 2, timeout_s=10)  # bwrap and sleep
            sleepers = procs_with_label(run_id)
            assert reap_orphans(run_id) == 0
            assert set(sleepers) <= set(procs_with_label(run_id))
            assert inner.poll() is None and workdir.is_dir()
        finally:
            inner.kill()  # --kill-child: the namespace's pid 1 dies, and with it all in the namespace
            inner.wait()
        assert wait_until(lambda: procs_with_label(run_id) == [], timeout_s=10)
        assert workdir is not None and workdir.is_dir()  # what the killed owner left
        reap_orphans(run_id)
        if namespaced_pids() is None:  # this process cannot look into lower namespaces: left alone
            assert workdir.is_dir()
            reap_orphans(run_id, include_live_owners=True)  # the run is over
    assert not (sandbox_root() / run_id).exists() and cgroup_run_dirs(run_id) == []


_DOOMED_OWNER = """
import os, signal, sys
from sandboxes import BwrapSandbox, SandboxSpec
sb = BwrapSandbox(SandboxSpec(run_id=sys.argv[1]))
print(sb.host_workdir, flush=True)
sys.stdin.readline()
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_orphan_of_a_killed_owner_in_the_same_pid_namespace_is_reaped(run_id):
    owner = subprocess.Popen([sys.executable, "-c", _DOOMED_OWNER, run_id], cwd=REPO, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    workdir = Path(owner.stdout.readline().strip())
    with reaper_lock():  # no other process's reaper takes the orphan before this test looks
        owner.stdin.write("\n")
        owner.stdin.flush()
        assert owner.wait(timeout=30) == -signal.SIGKILL
        assert workdir.is_dir()  # SIGKILL: no finalizer ran
        reap_orphans(run_id)
    assert not workdir.exists() and not (sandbox_root() / run_id).exists()
    assert cgroup_run_dirs(run_id) == [] and procs_with_label(run_id) == []


@pytest.mark.docker
def test_container_reaper_in_another_pid_namespace_leaves_a_live_container_alone(run_id):
    require_docker()
    from sandboxes.docker import DockerSandbox

    with DockerSandbox(SandboxSpec(run_id=run_id)) as sb:
        out, log = _run_in_new_pid_namespace(
            "from sandboxes.docker.reaper import reap_containers\n"
            f"print(reap_containers({run_id!r}))"
        )
        assert out.split() == ["0"] and f"left sandbox container {sb.container_id[:12]} alone" in log
        assert containers_with_label(run_id) == [sb.container_id]
        labels = sb._client.api.inspect_container(sb.container_id)["Config"]["Labels"]
        assert labels["agentrl.owner_pidns"] == str(os.stat("/proc/self/ns/pid").st_ino)
        assert sb.exec("echo ok").stdout == "ok\n"
    assert containers_with_label(run_id) == []
