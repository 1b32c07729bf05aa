"""Case C10 for the training program: after SIGINT, and after SIGKILL followed by the next
start of the program, no sandbox (labelled process tree, cgroup or work dir) of the run is
left, and SIGINT leaves a resumable run behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sandboxes.labels import sandbox_root
from sandboxes.reaper import labelled_processes

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[3]


BACKENDS = ["bwrap", pytest.param("docker", marks=pytest.mark.docker)]


def _containers(name: str) -> list:
    from sandboxes.docker.daemon import docker_daemon_answers

    if not docker_daemon_answers():
        return []
    import docker

    # The low-level list answers in one call; containers.list() inspects each container
    # afterwards and raises NotFound for one removed in between (a race with the run's clean-up).
    client = docker.from_env()
    return [c["Id"] for c in client.api.containers(all=True, filters={"label": "agentrl.run_id"})
            if (c.get("Labels") or {}).get("agentrl.run_id", "").startswith(name + "-")]


def _need_backend(backend: str) -> None:
    if backend != "docker":
        return
    from sandboxes.docker.daemon import docker_daemon_answers

    if not docker_daemon_answers():
        if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
            pytest.fail("AGENTRL_REQUIRE_DOCKER=1 but no Docker daemon answers")
        pytest.skip("no Docker daemon answers (scripts/test.sh starts one)")


def _start(tmp_path: Path, name: str, model: str, backend: str = "bwrap") -> subprocess.Popen:
    cmd = [sys.executable, "-m", "agentrl.cli", "train",
           f"run.name={name}", f"run.dir={tmp_path / name}", "run.iterations=200", f"model.path={model}",
           "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_turns=2", "rollout.max_new_tokens=16",
           "rollout.max_context_tokens=1024", f"sandbox.backend={backend}", "cluster.num_cpus=4"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _run_dirs(name: str) -> list[Path]:
    root = sandbox_root()
    return [d for d in root.glob(f"{name}-*") if d.is_dir() and any(d.iterdir())] if root.is_dir() else []


def _wait_for_sandboxes(proc: subprocess.Popen, name: str, timeout_s: float = 240) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            out = proc.stdout.read().decode(errors="replace")
            pytest.fail(f"training exited early ({proc.returncode}):\n{out[-3000:]}")
        if _run_dirs(name) or _containers(name):
            return
        time.sleep(0.05)
    pytest.fail("no sandbox of the run appeared")


def _leftovers(name: str) -> tuple[list, list]:
    procs = [pid for pid, label in labelled_processes().items() if label.run_id.startswith(name + "-")]
    return procs, _run_dirs(name) + _containers(name)


@pytest.mark.parametrize("backend", BACKENDS)
def test_C10_sigint_stops_cleanly_and_leaves_no_sandbox(tmp_path, tiny_model_path, backend):
    _need_backend(backend)
    name = f"c10int{backend}"
    proc = _start(tmp_path, name, tiny_model_path, backend)
    try:
        _wait_for_sandboxes(proc, name)
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out = proc.stdout.read().decode(errors="replace")
    assert rc == 130, out[-3000:]
    assert "interrupted" in out
    procs, dirs = _leftovers(name)
    assert procs == [] and dirs == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_C10_sigkill_then_next_start_leaves_no_sandbox(tmp_path, tiny_model_path, backend):
    _need_backend(backend)
    name = f"c10kill{backend}"
    proc = _start(tmp_path, name, tiny_model_path, backend)
    try:
        _wait_for_sandboxes(proc, name)
        os.kill(proc.pid, signal.SIGKILL)  # the driver only; Ray's own processes must notice
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # The next start of the program (here its clean-up command) removes what is left.
    deadline = time.monotonic() + 60
    while True:
        gc = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "gc"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
        assert gc.returncode == 0, gc.stdout + gc.stderr
        procs, dirs = _leftovers(name)
        if (procs == [] and dirs == []) or time.monotonic() > deadline:
            break
        time.sleep(2)  # Ray takes a moment to notice its driver is gone and stop the actors
    try:  # Ray's head processes that the killed driver started
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    assert procs == [] and dirs == []
