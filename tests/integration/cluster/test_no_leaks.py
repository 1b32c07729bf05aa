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
           "rollout.max_context_tokens=1024", f"sandbox.backend={backend}", "cluster.num_cpus=4",
           "eval.before_training=false", "eval.after_training=false"]  # the packaged default evaluates; not this test's subject
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


def _stop(proc: subprocess.Popen, sig: int, timeout_s: float) -> tuple[int, str]:
    """Send ``sig`` to the driver only (Ray's own processes must notice); its exit code and output."""
    try:
        os.kill(proc.pid, sig)
        rc = proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return rc, proc.stdout.read().decode(errors="replace")


@pytest.mark.parametrize("backend", BACKENDS)
def test_C10_sigkill_then_next_start_then_sigint_leave_no_sandbox(tmp_path, tiny_model_path, backend):
    """Both halves of case C10 in one sequence, as a user meets them: a run is SIGKILLed with
    its sandboxes up; the next start of the program (a new run, which reaps at start-up, and
    the clean-up command ``agentrl sandbox gc``) removes what the killed run left; that next
    run, SIGINTed with its own sandboxes up, stops cleanly (exit 130, "interrupted"), leaves
    none of its own, and can be resumed (its directory holds the run)."""
    _need_backend(backend)
    killed, second = f"c10kill{backend}", f"c10int{backend}"
    proc = _start(tmp_path, killed, tiny_model_path, backend)
    try:
        _wait_for_sandboxes(proc, killed)
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    _stop(proc, signal.SIGKILL, 30)
    nxt = _start(tmp_path, second, tiny_model_path, backend)  # the next start of the program
    try:
        _wait_for_sandboxes(nxt, second)
        # The killed run's leftovers are gone by now (the start-up reaper took those whose
        # owners Ray had stopped), or go with the clean-up command once Ray notices.
        deadline = time.monotonic() + 60
        while True:
            procs, dirs = _leftovers(killed)
            if (procs == [] and dirs == []) or time.monotonic() > deadline:
                break
            gc = subprocess.run([sys.executable, "-m", "agentrl.cli", "sandbox", "gc"], cwd=REPO,
                                capture_output=True, text=True, timeout=60)
            assert gc.returncode == 0, gc.stdout + gc.stderr
            time.sleep(2)  # Ray takes a moment to notice its driver is gone and stop the actors
        assert procs == [] and dirs == [], f"the SIGKILLed run left {procs} {dirs}"
    except BaseException:
        os.killpg(nxt.pid, signal.SIGKILL)
        raise
    finally:
        try:  # Ray's head processes that the killed driver started
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    rc, out = _stop(nxt, signal.SIGINT, 120)
    assert rc == 130, out[-3000:]
    assert "interrupted" in out
    procs, dirs = _leftovers(second)
    assert procs == [] and dirs == []
    assert (tmp_path / second / "config.yaml").is_file()  # the run's directory holds it: resumable once checkpointed
