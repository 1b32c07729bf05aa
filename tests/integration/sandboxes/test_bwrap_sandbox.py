"""BwrapSandbox specifics against real bubblewrap: its file system and identity, ``limits``
modes (cgroup v1 or rlimits), set-up failures, ``auto`` without a daemon, and its lifetime
(C10: the host working directory and cgroups, the reaper of labelled processes).

The contract, abuse and owner-lifetime suites (capabilities, the owner killed, interrupted
or terminated) run on bubblewrap too (test_contract.py). No mocks: every test starts real
``bwrap`` processes; what is left is checked by scanning ``/proc``, the cgroup hierarchy and
the sandbox root (conftest.py), independently of the reaper's own scan.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import subprocess
import threading
import uuid
from pathlib import Path

import pytest
from tests.helpers.sandbox_checks import cgroup_run_dirs, procs_with_label, wait_until

from agentrl.errors import ConfigError, SandboxError
from sandboxes import BwrapSandbox, SandboxSpec, make_sandbox, reap_orphans
from sandboxes.labels import RUN_ID_ENV, process_start_ticks, sandbox_root
from sandboxes.reaper import reaper_lock


@pytest.fixture
def backend() -> str:
    """Only bubblewrap here: conftest's ``make`` and ``sandbox`` build BwrapSandbox."""
    return "bwrap"


# ---------------------------------------------------------------------------- set-up


def test_bubblewrap_setup_failure_raises_sandbox_error(sandbox):
    with pytest.raises(SandboxError, match="Can't chdir to /no/such/dir") as info:
        sandbox.exec("true", cwd="/no/such/dir")
    assert info.value.command == "true"
    assert sandbox.exec("echo still fine").stdout == "still fine\n"


def test_missing_bwrap_binary_raises_sandbox_error(run_id):
    with pytest.raises(SandboxError, match="bubblewrap not found at '/nonexistent/bwrap'"):
        BwrapSandbox(SandboxSpec(run_id=run_id), bwrap_path="/nonexistent/bwrap")


def test_make_sandbox_auto_chooses_bwrap_without_a_docker_daemon_and_says_so(run_id, caplog, monkeypatch, tmp_path):
    # No daemon named (DOCKER_HOST, sandbox.docker_host), none started by agentrl's scripts
    # and nothing at the default socket (a named daemon that does not answer is an error
    # instead, and one nobody named is not used: tests/integration/sandboxes/test_daemon_choice.py).
    import sandboxes.docker.daemon as daemon

    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, f"{tmp_path}/no-state.json")
    monkeypatch.setattr(daemon, "DOCKER_SOCKET", f"{tmp_path}/no-daemon.sock")
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id=run_id))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert "sandboxes: bwrap: no Docker daemon named (sandbox.docker_host / DOCKER_HOST) or started by agentrl" in caplog.text
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.close()


# ---------------------------------------------------------------------------- isolation


def test_the_root_holds_only_the_bound_system_directories(sandbox):
    host_top = [d for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{d}")]
    expected_root = sorted(["dev", "etc", "proc", "tmp", "usr", "work", *host_top])
    assert sandbox.exec("ls /").stdout.split() == expected_root


def test_sandbox_is_not_host_root_and_cannot_touch_kernel_or_device_settings(sandbox, run_id):
    assert sandbox.exec("id -u; id -un").stdout == "1000\nsandbox\n"
    null_mode = os.stat("/dev/null").st_mode
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    r = sandbox.exec("cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness; chmod 600 /dev/null")
    assert "cannot create /proc/sys/vm/swappiness: Permission denied" in r.stderr
    assert "changing permissions of '/dev/null': Operation not permitted" in r.stderr
    assert os.stat("/dev/null").st_mode == null_mode
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    # While a command runs, none of its processes (bwrap included) is host root.
    worker = threading.Thread(target=sandbox.exec, args=("while [ ! -e stop ]; do sleep 0.05; done",))
    worker.start()
    try:
        assert wait_until(lambda: procs_with_label(run_id) != [])
        host_uids = set()
        for pid in procs_with_label(run_id):
            try:
                host_uids.add(os.stat(f"/proc/{pid}").st_uid)
            except FileNotFoundError:  # a `sleep 0.05` that just ended
                continue
        assert host_uids and 0 not in host_uids, host_uids
    finally:
        sandbox.write_file("stop", "")
        worker.join(timeout=10)
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    assert sandbox.exec(f"touch /tmp/{marker} && ls /tmp").stdout == f"{marker}\n"
    assert not os.path.exists(f"/tmp/{marker}")  # a private tmpfs, not the host's /tmp
    assert sandbox.exec("ls /tmp").stdout == ""  # and a fresh one per exec


# ---------------------------------------------------------------------------- resource limits


def test_memory_bomb_in_rlimit_mode_fails_without_harming_the_host_and_the_sandbox_stays_usable(run_id):
    # The default mode ("auto": cgroup v1 where writable) is in test_contract.py's memory bomb.
    spec = SandboxSpec(run_id=run_id, memory_mb=256, default_timeout_s=60)
    with BwrapSandbox(spec, limits="rlimit") as sb:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = sb.exec(["python3", "-c", "x = b'x' * (2 * 1024**3); print('allocated')"])
        assert r.exit_code != 0 and not r.timed_out
        assert "allocated" not in r.stdout
        assert sb.limits == "rlimit" and "MemoryError" in r.stderr
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 50_000  # KiB
        assert sb.exec("echo ok").stdout == "ok\n"


def test_fork_bomb_is_stopped_by_the_pids_limit(run_id):
    spec = SandboxSpec(run_id=run_id, pids_limit=32)
    with BwrapSandbox(spec) as sb:
        if sb.limits != "cgroup-v1":
            pytest.skip(f"pids_limit is enforced only with cgroup v1 here (limits={sb.limits}); "
                        "a real fork bomb without it would harm the host")
        r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=4)
        counters = sb.limit_counters()
        assert counters["pids_limit_hits"] > 0  # forks were refused by pids.max
        assert r.duration_s < 6
        assert sb.exec("echo ok").stdout == "ok\n"
        assert sb.limit_counters()["pids_current"] == 0
    assert procs_with_label(run_id) == []


# ---------------------------------------------------------------------------- lifetime (C10)


def test_the_working_directory_and_cgroups_live_on_the_host_until_close(make, run_id):
    sb = make()
    workdir = sb.host_workdir
    sb.write_file("f", "x")
    assert sb.exec("printf 'from exec' > made.txt").exit_code == 0
    assert sorted(p.name for p in workdir.iterdir()) == ["f", "made.txt"]
    assert (workdir / "made.txt").read_bytes() == b"from exec"
    if sb.limits == "cgroup-v1":
        assert len(cgroup_run_dirs(run_id)) >= 2  # memory and pids (and cpu when mounted)
    sb.close()
    assert not workdir.exists() and not (sandbox_root() / run_id).exists()
    assert cgroup_run_dirs(run_id) == []


def test_a_sandbox_starts_while_another_of_its_run_removes_the_run_directory(make, run_id, monkeypatch):
    """A closing sandbox removes its run's directory once it is empty; a sandbox being created
    for the same run between making that directory and its own must not fail (seen in CI:
    an episode lost to "could not create the sandbox directory ... No such file or
    directory"). The close is simulated at that exact point: the run directory is removed
    right after it was made and chmodded, once."""
    import sandboxes.bwrap as bwrap_mod

    real_chmod, removed = os.chmod, []
    run_dir = sandbox_root() / run_id

    def chmod_then_race(path, mode):
        real_chmod(path, mode)
        if Path(path) == run_dir and not removed and not any(run_dir.iterdir()):
            os.rmdir(run_dir)  # what the other sandbox's close does (its _cleanup)
            removed.append(path)

    monkeypatch.setattr(bwrap_mod.os, "chmod", chmod_then_race)
    sb = make()
    assert removed == [run_dir]  # the race happened
    assert sb.exec("echo ok").stdout.strip() == "ok" and sb.host_workdir.is_dir()
    sb.close()


def test_C10_reaper_kills_labelled_orphans_but_spares_live_owners(run_id):
    root = sandbox_root() / run_id
    dead_dir = root / "999999999-1-0123456789ab"  # pid above pid_max: never alive
    live_dir = root / f"{os.getpid()}-{_start_ticks()}-abcdef012345"

    def labelled_sleep(seconds: str, owner_pid: int, owner_start: int) -> subprocess.Popen:
        env = {
            "PATH": "/usr/bin:/bin", RUN_ID_ENV: run_id, "AGENTRL_SANDBOX_ID": uuid.uuid4().hex[:12],
            "AGENTRL_OWNER_PID": str(owner_pid), "AGENTRL_OWNER_START": str(owner_start),
        }
        return subprocess.Popen(["sleep", seconds], env=env, start_new_session=True)

    # the orphans are so from their start: no other process's reaper may take them before the test looks
    with reaper_lock():
        for d in (dead_dir, live_dir):
            (d / "work").mkdir(parents=True)
        orphan = labelled_sleep("987656", 999_999_999, 1)
        live = labelled_sleep("987657", os.getpid(), _start_ticks())
        try:
            assert wait_until(lambda: len(procs_with_label(run_id)) == 2)
            assert reap_orphans(run_id) == 1
            assert orphan.wait(timeout=5) == -signal.SIGKILL
            assert live.poll() is None and live_dir.exists() and not dead_dir.exists()
            with pytest.raises(ConfigError, match="needs a run_id"):
                reap_orphans(include_live_owners=True)
            assert reap_orphans(run_id, include_live_owners=True) == 1
            assert live.wait(timeout=5) == -signal.SIGKILL
            assert not root.exists()
        finally:
            for p in (orphan, live):
                if p.poll() is None:
                    p.kill()
                p.wait()


def _start_ticks() -> int:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    return ticks
