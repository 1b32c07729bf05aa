"""``reap_dead_ray_instances`` ends only processes whose label names a dead owner (plain
processes stand for Ray's here: the label is all it looks at; the real Ray instance is in
tests/integration/cluster/test_ray_leftovers.py)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.cluster.actors.ray_local import OWNER_VAR, labelled_ray_processes, labelled_start, reap_dead_ray_instances
from sandboxes.labels import Owner, namespaced_pids, process_start_ticks

REPO = Path(__file__).resolve().parents[3]


def _wait_for(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


def test_reap_leaves_unlabelled_and_live_owners_alone(tmp_path):
    """A process whose label names a dead owner of this pid namespace is ended (an older label
    without the namespace counts as this one's); one naming a live owner, one naming an owner
    whose pid namespace is unknown and one without a label are not (plain processes stand for
    Ray's, the label is all that counts)."""
    dead_owner = subprocess.Popen([sys.executable, "-c", "pass"])
    dead_owner.wait()
    start = process_start_ticks(os.getpid())
    here = Owner.current().pid_ns
    labels = {
        "dead": f"{dead_owner.pid}-12345-{here}",  # the pid is gone (or reused: the start time differs)
        "dead_old_format": f"{dead_owner.pid}-12345",  # a label without the pid namespace: judged here
        "live": f"{os.getpid()}-{start}-{here}",
        # a driver whose pid namespace could not be told: never judged, however dead it looks
        "unknown_namespace": f"{dead_owner.pid}-12345-0",
    }
    procs = {}
    try:
        for kind, label in labels.items():
            procs[kind] = subprocess.Popen(["sleep", "300"], env=dict(os.environ, **{OWNER_VAR: label}))
        env = dict(os.environ)
        env.pop(OWNER_VAR, None)
        procs["none"] = subprocess.Popen(["sleep", "300"], env=env)
        assert _wait_for(lambda: procs["dead"].pid in labelled_ray_processes(), 5)
        assert labelled_ray_processes()[procs["live"].pid] == Owner(os.getpid(), start, here)
        killed = reap_dead_ray_instances()
        for kind in ("dead", "dead_old_format"):
            assert procs[kind].pid in killed
            assert procs[kind].wait(timeout=10) == -signal.SIGKILL
        for kind in ("live", "none", "unknown_namespace"):
            assert procs[kind].poll() is None and procs[kind].pid not in killed
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_labelled_start_sets_the_label_only_inside_the_block(monkeypatch):
    monkeypatch.delenv(OWNER_VAR, raising=False)
    monkeypatch.delenv("SPT_NOENV", raising=False)
    with labelled_start() as label:
        assert os.environ[OWNER_VAR] == label == f"{os.getpid()}-{process_start_ticks(os.getpid())}-{Owner.current().pid_ns}"
        assert os.environ["SPT_NOENV"] == "1"  # a process title set by setproctitle keeps the label readable
    assert OWNER_VAR not in os.environ and "SPT_NOENV" not in os.environ


def test_a_titled_process_keeps_its_label_readable(monkeypatch):
    """Ray's processes set their titles with setproctitle, which by default writes the title
    over the memory /proc/<pid>/environ shows; inside labelled_start it must not."""
    setproctitle = pytest.importorskip("setproctitle")  # Ray's dependency; Ray's own copy reads SPT_NOENV too
    script = ("import sys, time, setproctitle; setproctitle.setproctitle('ray::DashboardAgent'); "
              "print('titled', flush=True); time.sleep(60)")
    monkeypatch.delenv(OWNER_VAR, raising=False)
    with labelled_start() as label:
        # a long argv, as Ray's agents have (the title must fit in it when the environment is kept)
        proc = subprocess.Popen([sys.executable, "-c", script, "x" * 200], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "titled"
        assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"ray::DashboardAgent")
        assert labelled_ray_processes()[proc.pid].token() == label
    finally:
        proc.kill()
        proc.wait()


_NAMESPACED_DRIVER = (
    "import time; from sandboxes.labels import Owner; print(Owner.current().token(), flush=True); time.sleep(300)"
)


def test_reap_judges_a_driver_of_another_pid_namespace_only_when_it_can_look_into_it():
    """A driver inside ``unshare --pid``: its pid (1 there) means another process here, so a
    process carrying its label is left alone while the driver runs; once its namespace is gone
    it is ended from where that can be seen (root in the initial pid namespace), else left."""
    if os.getuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare (util-linux) for a pid namespace of its own")
    driver = subprocess.Popen(["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c",
                               _NAMESPACED_DRIVER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    agent = None
    try:
        label = driver.stdout.readline().strip()
        owner = Owner.parse_token(label)
        assert owner is not None and owner.pid == 1 and owner.pid_ns != Owner.current().pid_ns
        agent = subprocess.Popen(["sleep", "300"], env=dict(os.environ, **{OWNER_VAR: label}))
        assert _wait_for(lambda: agent.pid in labelled_ray_processes(), 5)
        assert agent.pid not in reap_dead_ray_instances() and agent.poll() is None
        driver.kill()  # --kill-child: the namespace dies with its pid 1
        driver.wait()
        killed = reap_dead_ray_instances()
        if namespaced_pids() is None:  # cannot look into lower namespaces from here
            assert agent.pid not in killed and agent.poll() is None
        else:
            assert agent.pid in killed and agent.wait(timeout=10) == -signal.SIGKILL
    finally:
        for p in (driver, agent):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
