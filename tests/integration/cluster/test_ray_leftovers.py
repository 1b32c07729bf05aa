"""A run's local Ray instance does not outlive its killed driver for long: after SIGKILL of
the driver, Ray's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) usually stay,
reparented to init; the next local start (``ray_connect.connect``) or ``agentrl sandbox gc`` ends them,
and leaves alone the instance of a run whose driver still runs and a cluster started without
agentrl's label."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl.cluster.actors.ray_local import labelled_ray_processes, reap_dead_ray_instances

REPO = Path(__file__).resolve().parents[3]

# A driver that starts its local instance as a run does (connect with cluster.address unset),
# prints its pid and the instance's session dir, and waits to be killed.
_DRIVER = """
import json, os, sys, time
from agentrl.config import load_config
from agentrl.cluster.actors.ray_connect import connect
cfg = load_config(None, ["cluster.num_cpus=1"])
connect(cfg)
import ray
print(json.dumps({"pid": os.getpid(), "session": ray._private.worker._global_node.get_session_dir_path()}), flush=True)
time.sleep(600)
"""


def _start_driver(tmp_path: Path, name: str) -> tuple[subprocess.Popen, dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", RAY_TMPDIR=str(tmp_path))  # its own temp dir: no shared /tmp/ray
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, "-c", _DRIVER], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"driver {name} did not start its Ray instance (exit {proc.wait()})")
    return proc, json.loads(line)


def _owned_by(pid: int) -> list[int]:
    return sorted(p for p, owner in labelled_ray_processes().items() if owner.pid == pid)


def _names(pids: list[int]) -> list[str]:
    out = []
    for p in pids:
        try:
            out.append(Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
        except OSError:
            pass
    return out


def _wait_for(pred, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.2)
    return pred()


@pytest.mark.slow
def test_killed_drivers_ray_leftovers_are_reaped_and_a_live_instance_is_untouched():
    # short temp dirs of their own: Ray's socket paths live under them, and /tmp/ray is shared
    killed_tmp = Path(tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp"))
    live_tmp = Path(tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp"))
    killed, _ = _start_driver(killed_tmp, "killed")
    live, _ = _start_driver(live_tmp, "live")
    try:
        # The agents are started by the raylet once it runs: wait until the instance's GCS server,
        # raylet and both agents carry the label (by the label, not the process title: the
        # agents set their "ray::...Agent" titles only after their imports, late on a loaded machine).
        assert _wait_for(lambda: len(_owned_by(killed.pid)) >= 4, 120), _names(_owned_by(killed.pid))
        assert _wait_for(lambda: len(_owned_by(live.pid)) >= 4, 120), _names(_owned_by(live.pid))
        # Titled, the agents still carry the label (setproctitle leaves the environment alone).
        agents = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
        assert _wait_for(lambda: agents <= set(_names(_owned_by(killed.pid))), 120), _names(_owned_by(killed.pid))
        live_before = _owned_by(live.pid)
        os.kill(killed.pid, signal.SIGKILL)
        killed.wait(timeout=30)
        # Ray's head processes exit on their own once they notice the driver is gone; the agents stay.
        assert _wait_for(lambda: not any("raylet" in n for n in _names(_owned_by(killed.pid))), 60)
        time.sleep(2)
        # Whether the agents are still there now depends on timing: they end themselves once they
        # notice the raylet is gone (most runs here they stay; in some they are gone already).
        # The reaper itself is pinned with plain labelled processes in tests/unit/cluster/test_ray_local.py;
        # what counts here is that after gc nothing of the killed instance is left.
        left = _names(_owned_by(killed.pid))

        gc = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "gc"], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
        assert gc.returncode == 0, gc.stdout + gc.stderr
        if left:
            assert "processes of Ray instances whose run is gone" in gc.stdout, (left, gc.stdout)
        assert _wait_for(lambda: _owned_by(killed.pid) == [], 10), _names(_owned_by(killed.pid))
        # The live run's instance is whole: every process it had still runs.
        assert set(live_before) <= set(_owned_by(live.pid)), (live_before, _owned_by(live.pid))
        assert live.poll() is None
    finally:
        for proc in (killed, live):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        reap_dead_ray_instances()  # the live driver's instance, now dead too
        shutil.rmtree(killed_tmp, ignore_errors=True)
        shutil.rmtree(live_tmp, ignore_errors=True)
