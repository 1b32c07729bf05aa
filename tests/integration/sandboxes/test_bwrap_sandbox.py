"""BwrapSandbox against real bubblewrap: isolation, limits, output (C09), lifecycle (C10).

No mocks: every test starts real ``bwrap`` processes. Processes are checked by scanning
``/proc`` here, independently of the reaper's own scan.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes import BwrapSandbox, Sandbox, SandboxSpec, make_sandbox, reap_orphans
from sandboxes.labels import RUN_ID_ENV, process_start_ticks, sandbox_root
from sandboxes.limits import cgroup_v1_bases
from sandboxes.output import truncation_marker

REPO_ROOT = Path(__file__).resolve().parents[3]


# ---------------------------------------------------------------------------- helpers


def _live_pids() -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        if stat[stat.rfind(b")") + 2:][:1] != b"Z":  # zombies no longer run
            out.append(int(entry))
    return out


def procs_with_label(run_id: str) -> list[int]:
    """Running processes whose environment carries ``AGENTRL_RUN_ID=<run_id>``."""
    needle = f"{RUN_ID_ENV}={run_id}".encode()
    found = []
    for pid in _live_pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return found


def procs_with_cmdline(fragment: str) -> list[int]:
    found = []
    for pid in _live_pids():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if f.read().replace(b"\0", b" ").strip() == fragment.encode():
                    found.append(pid)
        except OSError:
            continue
    return found


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


def cgroup_run_dirs(run_id: str) -> list[Path]:
    return [base / run_id for base in (cgroup_v1_bases() or {}).values() if (base / run_id).exists()]


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def sandbox(run_id):
    spec = SandboxSpec(run_id=run_id, memory_mb=512, pids_limit=64, default_timeout_s=30)
    with BwrapSandbox(spec) as sb:
        yield sb
    assert procs_with_label(run_id) == []


# ---------------------------------------------------------------------------- basics


def test_sandbox_implements_the_protocol(sandbox):
    assert isinstance(sandbox, Sandbox)
    assert sandbox.limits in ("cgroup-v1", "rlimit")


def test_exec_reports_exit_code_and_both_streams(sandbox):
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.stdout, r.stderr) == (3, "out\n", "err\n")
    assert not r.timed_out and r.truncated_bytes == 0
    assert r.command == "echo out; echo err >&2; exit 3"
    assert 0 < r.duration_s < 10
    r = sandbox.exec(["python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(5)", "a b", "c"])
    assert r.exit_code == 5 and r.stdout == "['a b', 'c']\n"
    assert r.command == ("python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(5)", "a b", "c")


def test_stdin_env_and_cwd(sandbox):
    assert sandbox.exec("cat", stdin="héllo\n").stdout == "héllo\n"
    big = os.urandom(1_500_000).hex().encode()  # 3 MB, far more than a pipe buffer holds
    r = sandbox.exec("cat | sha256sum; cat /work/nothing 2>/dev/null", stdin=big)
    assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
    r = sandbox.exec("cat", stdin=big)  # echoed back: stdin and output flow at the same time
    assert r.truncated_bytes == len(big) - sandbox.spec.output_limit_bytes
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hi there"}).stdout == "hi there\n"
    sandbox.write_file("sub/dir/marker", "x")
    assert sandbox.exec("pwd").stdout == "/work\n"
    assert sandbox.exec("pwd; ls", cwd="sub/dir").stdout == "/work/sub/dir\nmarker\n"
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(ConfigError, match="stdin"):
        sandbox.exec("cat", stdin=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s=-1"):
        sandbox.exec("true", timeout_s=-1)


def test_spec_env_applies_and_host_environment_does_not_leak(run_id, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_HOST_SECRET", "leaked")
    spec = SandboxSpec(run_id=run_id, env={"FROM_SPEC": "1", "OVERRIDE": "spec"})
    with BwrapSandbox(spec) as sb:
        show = "import json, os, sys; print(json.dumps(dict(os.environ))); print(sys.executable, sys.prefix)"
        r = sb.exec(["python3", "-c", show], env={"OVERRIDE": "exec", RUN_ID_ENV: "forged"})
    env_line, py_line = r.stdout.splitlines()
    env = json.loads(env_line)
    assert "AGENTRL_TEST_HOST_SECRET" not in env
    assert env["FROM_SPEC"] == "1" and env["OVERRIDE"] == "exec"
    assert env[RUN_ID_ENV] == run_id  # the label cannot be overridden
    assert env["PATH"] == "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
    assert env["HOME"] == "/work"
    assert py_line == "/usr/bin/python3 /usr"  # the system python, not the caller's venv


def test_missing_program_is_the_commands_failure_not_the_sandboxes(sandbox):
    r = sandbox.exec(["no-such-program", "x"])
    assert r.exit_code == 127
    assert "no-such-program: not found" in r.stderr


def test_bubblewrap_setup_failure_raises_sandbox_error(sandbox):
    with pytest.raises(SandboxError, match="Can't chdir to /no/such/dir") as info:
        sandbox.exec("true", cwd="/no/such/dir")
    assert info.value.command == "true"
    assert sandbox.exec("echo still fine").stdout == "still fine\n"


def test_missing_bwrap_binary_raises_sandbox_error(run_id):
    with pytest.raises(SandboxError, match="bubblewrap not found at '/nonexistent/bwrap'"):
        BwrapSandbox(SandboxSpec(run_id=run_id), bwrap_path="/nonexistent/bwrap")


def test_make_sandbox_auto_chooses_bwrap_without_a_docker_daemon_and_says_so(run_id, caplog, monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")  # nothing answers there
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id=run_id))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert "chose 'bwrap' (no Docker daemon answers)" in caplog.text
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.close()


# ---------------------------------------------------------------------------- files


def test_files_round_trip_and_persist_across_execs(sandbox):
    sandbox.write_file("a/b.txt", "héllo")
    assert sandbox.exec("cat a/b.txt").stdout == "héllo"
    sandbox.write_file("/work/bin.dat", bytes(range(256)))
    assert sandbox.exec("od -An -tx1 bin.dat | wc -w").stdout.strip() == "256"
    assert sandbox.exec("printf 'from exec' > made.txt").exit_code == 0
    assert sandbox.read_file("made.txt") == b"from exec"
    assert sandbox.exec("cat made.txt").stdout == "from exec"  # a later exec sees it
    assert (sandbox.host_workdir / "made.txt").read_bytes() == b"from exec"


def test_read_and_write_refuse_paths_leaving_the_workdir(sandbox, tmp_path):
    host_secret = tmp_path / "host_secret.txt"
    host_secret.write_text("do not read")
    with pytest.raises(SandboxError, match="No such file"):
        sandbox.read_file("missing.txt")
    for path in ("../../etc/passwd", "/etc/passwd", "/work/../etc/passwd"):
        with pytest.raises(SandboxError, match="outside the sandbox working directory"):
            sandbox.read_file(path)
        with pytest.raises(SandboxError, match="outside the sandbox working directory"):
            sandbox.write_file(path, "x")
    # A symlink planted by the command points at a host path when followed from the host.
    assert sandbox.exec(f"ln -s {host_secret} leak && ln -s {tmp_path} dirleak").exit_code == 0
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.read_file("leak")
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.read_file("dirleak/host_secret.txt")
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.write_file("leak", "overwritten")
    assert host_secret.read_text() == "do not read"


# ---------------------------------------------------------------------------- isolation


def test_host_files_are_invisible(sandbox):
    with tempfile.NamedTemporaryFile("w", dir="/root", prefix="agentrl-secret-", delete=True) as f:
        f.write("host secret")
        f.flush()
        r = sandbox.exec(f"cat {f.name}; ls /root; cat {REPO_ROOT}/sandboxes/base.py")
    assert r.exit_code != 0
    assert "host secret" not in r.stdout
    assert "No such file" in r.stderr
    assert sandbox.exec(f"test -e {REPO_ROOT}").exit_code == 1
    assert sandbox.exec(f"test -e {sys.prefix}").exit_code == 1  # the caller's venv
    host_top = [d for d in ("bin", "sbin", "lib", "lib32", "lib64", "libx32") if os.path.lexists(f"/{d}")]
    expected_root = sorted(["dev", "etc", "proc", "tmp", "usr", "work", *host_top])
    assert sandbox.exec("ls /").stdout.split() == expected_root


def test_writes_outside_the_workdir_fail(sandbox):
    for target in ("/usr/x", "/etc/x", "/x", "/bin/x", "/lib/x", "/etc/passwd", "/proc/sys/kernel/hostname"):
        r = sandbox.exec(f"echo pwned > {target}")
        assert r.exit_code != 0, target
        assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr, (target, r.stderr)


def test_sandbox_is_not_host_root_and_cannot_touch_kernel_or_device_settings(sandbox):
    assert sandbox.exec("id -u; id -un").stdout == "1000\nsandbox\n"
    null_mode = os.stat("/dev/null").st_mode
    swappiness = Path("/proc/sys/vm/swappiness").read_text()
    r = sandbox.exec("cat /proc/sys/vm/swappiness > /proc/sys/vm/swappiness; chmod 600 /dev/null")
    assert "cannot create /proc/sys/vm/swappiness: Permission denied" in r.stderr
    assert "changing permissions of '/dev/null': Operation not permitted" in r.stderr
    assert os.stat("/dev/null").st_mode == null_mode
    assert Path("/proc/sys/vm/swappiness").read_text() == swappiness
    for pid in procs_with_label(sandbox.spec.run_id):  # none is left, but if any: not root
        assert os.stat(f"/proc/{pid}").st_uid != 0
    marker = f"agentrl-marker-{uuid.uuid4().hex}"
    assert sandbox.exec(f"touch /tmp/{marker} && ls /tmp").stdout == f"{marker}\n"
    assert not os.path.exists(f"/tmp/{marker}")  # a private tmpfs, not the host's /tmp
    assert sandbox.exec("ls /tmp").stdout == ""  # and a fresh one per exec


def test_no_network_reaches_the_host_or_the_internet(sandbox, run_id):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    probe = (
        "import socket, sys\n"
        "for host, port in ((sys.argv[1], int(sys.argv[2])), ('1.1.1.1', 53)):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect((host, port)); print('connected', host)\n"
        "    except OSError as e:\n"
        "        print('failed', host, type(e).__name__)\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )
    try:
        r = sandbox.exec(["python3", "-c", probe, "127.0.0.1", str(port)])
        assert r.stdout.splitlines() == [
            "failed 127.0.0.1 ConnectionRefusedError",  # its own loopback, not the host's
            "failed 1.1.1.1 OSError",  # no route: the namespace has only lo
            "['lo']",
        ], r.stderr
        # network="host" is the explicit opt-out: the same probe reaches the host's port.
        with BwrapSandbox(SandboxSpec(run_id=run_id, network="host")) as shared:
            r = shared.exec(["python3", "-c", probe, "127.0.0.1", str(port)])
        assert r.stdout.splitlines()[0] == "connected 127.0.0.1"
    finally:
        server.close()


def test_capabilities_are_dropped_and_no_new_privileges(sandbox):
    status = sandbox.exec("cat /proc/self/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["CapBnd"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"


# ---------------------------------------------------------------------------- time limits


def test_C10_sleep_1000_with_2s_timeout_reports_timeout_within_3s(sandbox, run_id):
    t0 = time.monotonic()
    r = sandbox.exec("sleep 1000", timeout_s=2)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code == 137
    assert 1.9 <= elapsed < 3.0, elapsed
    assert procs_with_cmdline("sleep 1000") == []
    assert procs_with_label(run_id) == []


def test_C10_setsid_background_process_does_not_survive_its_exec(sandbox, run_id):
    r = sandbox.exec("setsid sh -c 'sleep 987651' > /dev/null 2>&1 & echo started")
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "started\n", False)
    assert procs_with_cmdline("sleep 987651") == []
    # The same escapee under a command that times out.
    r = sandbox.exec("setsid sh -c 'sleep 987652' & nohup sleep 987653 & sleep 1000", timeout_s=1)
    assert r.timed_out
    assert procs_with_cmdline("sleep 987652") == [] and procs_with_cmdline("sleep 987653") == []
    assert procs_with_label(run_id) == []


@pytest.mark.parametrize(
    "command",
    ["while :; do :; done", ["python3", "-c", "while True: pass"]],
    ids=["shell", "python"],
)
def test_infinite_loop_is_killed_at_its_timeout(sandbox, run_id, command):
    t0 = time.monotonic()
    r = sandbox.exec(command, timeout_s=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - t0 < 2.5
    assert procs_with_label(run_id) == []


def test_command_that_closes_its_output_still_times_out(sandbox):
    r = sandbox.exec("exec >&- 2>&-; sleep 1000", timeout_s=1)
    assert r.timed_out and r.duration_s < 2.5


# ---------------------------------------------------------------------------- resource limits


@pytest.mark.parametrize("limits", ["auto", "rlimit"])
def test_memory_bomb_fails_without_harming_the_host_and_the_sandbox_stays_usable(run_id, limits):
    spec = SandboxSpec(run_id=run_id, memory_mb=256, default_timeout_s=60)
    with BwrapSandbox(spec, limits=limits) as sb:
        rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        r = sb.exec(["python3", "-c", "x = b'x' * (2 * 1024**3); print('allocated')"])
        assert r.exit_code != 0 and not r.timed_out
        assert "allocated" not in r.stdout
        if sb.limits == "cgroup-v1":
            assert r.exit_code == 137  # the cgroup's OOM killer, inside the sandbox only
            assert sb.limit_counters()["memory_max_usage_bytes"] <= 256 * 1024 * 1024
        else:
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


# ---------------------------------------------------------------------------- output (C09)


def test_C09_invalid_utf8_becomes_replacement_characters_and_the_exit_code_is_kept(sandbox):
    r = sandbox.exec("printf 'ok\\377\\376'; exit 3")
    assert r.stdout == "ok\ufffd\ufffd"
    assert r.exit_code == 3


def test_C09_three_byte_character_split_across_two_writes_arrives_intact(sandbox):
    r = sandbox.exec(
        "printf '\\342\\202'; sleep 0.3; printf '\\254'; "
        "printf '\\342' >&2; sleep 0.2; printf '\\202\\254' >&2"
    )
    assert r.stdout == "€"
    assert r.stderr == "€"


def test_C09_200MB_of_output_is_cut_to_head_and_tail_with_bounded_memory(run_id):
    limit = 64 * 1024
    total_out = 200_000_000 + len("HEAD") + len("TAIL")
    total_err = 1_000_000
    command = (
        "printf HEAD; head -c 200000000 /dev/zero | tr '\\0' a; printf TAIL; "
        "head -c 1000000 /dev/zero | tr '\\0' e >&2"
    )
    peak = {"rss": 0}
    stop = threading.Event()

    def sample_rss():
        page = os.sysconf("SC_PAGE_SIZE")
        while not stop.is_set():
            with open("/proc/self/statm") as f:
                peak["rss"] = max(peak["rss"], int(f.read().split()[1]) * page)
            time.sleep(0.005)

    with BwrapSandbox(SandboxSpec(run_id=run_id, output_limit_bytes=limit)) as sb:
        with open("/proc/self/statm") as f:
            rss_before = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        sampler = threading.Thread(target=sample_rss, daemon=True)
        sampler.start()
        try:
            r = sb.exec(command, timeout_s=120)
        finally:
            stop.set()
            sampler.join()
    assert r.exit_code == 0 and not r.timed_out
    dropped_out, dropped_err = total_out - limit, total_err - limit
    half = "a" * (limit // 2 - 4)
    assert r.stdout == "HEAD" + half + truncation_marker(dropped_out) + half + "TAIL"
    assert "[... 199,934,472 bytes truncated ...]" in r.stdout
    assert r.stderr == "e" * (limit // 2) + truncation_marker(dropped_err) + "e" * (limit // 2)
    assert r.truncated_bytes == dropped_out + dropped_err
    assert peak["rss"] - rss_before < 100 * 1024 * 1024
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before) * 1024 < 100 * 1024 * 1024


# ---------------------------------------------------------------------------- lifecycle (C10)


def test_close_is_idempotent_and_the_sandbox_is_gone_afterwards(run_id):
    sb = BwrapSandbox(SandboxSpec(run_id=run_id))
    workdir = sb.host_workdir
    sb.write_file("f", "x")
    assert workdir.exists()
    if sb.limits == "cgroup-v1":
        assert len(cgroup_run_dirs(run_id)) >= 2  # memory and pids (and cpu when mounted)
    sb.close()
    sb.close()
    assert sb.closed and not workdir.exists()
    assert not (sandbox_root() / run_id).exists()
    assert cgroup_run_dirs(run_id) == []
    with pytest.raises(SandboxError, match="is closed"):
        sb.exec("true")
    with pytest.raises(SandboxError, match="is closed"):
        sb.read_file("f")


def test_C10_close_during_a_running_exec_kills_it_and_raises(run_id):
    sb = BwrapSandbox(SandboxSpec(run_id=run_id))
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["result"] = sb.exec("setsid sh -c 'sleep 987654' & sleep 1000", timeout_s=600)
        except SandboxError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert wait_until(lambda: procs_with_cmdline("sleep 987654") != [])
    t0 = time.monotonic()
    sb.close()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - t0 < 3
    assert "closed while the command was running" in str(outcome["error"])
    assert procs_with_label(run_id) == [] and procs_with_cmdline("sleep 987654") == []
    assert not sb.host_workdir.exists() and cgroup_run_dirs(run_id) == []


_OWNER_SCRIPT = """
import sys
sys.path.insert(0, sys.argv[2])
from sandboxes import BwrapSandbox, SandboxSpec
sb = BwrapSandbox(SandboxSpec(run_id=sys.argv[1]))
print(sb.host_workdir, flush=True)
sb.exec("setsid sh -c 'sleep 987655' & sleep 1000", timeout_s=600)
"""


def _start_owner(run_id: str) -> tuple[subprocess.Popen, Path]:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, run_id, str(REPO_ROOT)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    workdir = Path(owner.stdout.readline().strip())
    assert workdir.is_dir(), owner.stderr.read()
    assert wait_until(lambda: procs_with_cmdline("sleep 987655") != [], timeout_s=10)
    assert procs_with_label(run_id) != []
    return owner, workdir


def test_C10_owner_killed_with_SIGKILL_leaves_nothing_once_reaped(run_id):
    owner, workdir = _start_owner(run_id)
    owner.kill()
    owner.wait()
    # bubblewrap dies with its parent, so the process tree is gone by itself ...
    assert wait_until(lambda: procs_with_label(run_id) == [])
    assert procs_with_cmdline("sleep 987655") == []
    # ... but the crash left the working directory (and cgroups); the reaper removes them.
    assert workdir.exists()
    reap_orphans(run_id)
    assert procs_with_label(run_id) == []
    assert not workdir.exists() and not (sandbox_root() / run_id).exists()
    assert cgroup_run_dirs(run_id) == []


def test_C10_owner_interrupted_with_SIGINT_cleans_up_by_itself(run_id):
    owner, workdir = _start_owner(run_id)
    owner.send_signal(signal.SIGINT)
    owner.wait(timeout=15)
    assert "KeyboardInterrupt" in owner.stderr.read()
    assert wait_until(lambda: procs_with_label(run_id) == [])
    assert procs_with_cmdline("sleep 987655") == []
    assert not workdir.exists()  # removed by the sandbox's finalizer at interpreter exit
    assert cgroup_run_dirs(run_id) == []


def test_C10_reaper_kills_labelled_orphans_but_spares_live_owners(run_id):
    root = sandbox_root() / run_id
    dead_dir = root / "999999999-1-0123456789ab"  # pid above pid_max: never alive
    live_dir = root / f"{os.getpid()}-{_start_ticks()}-abcdef012345"
    for d in (dead_dir, live_dir):
        (d / "work").mkdir(parents=True)

    def labelled_sleep(seconds: str, owner_pid: int, owner_start: int) -> subprocess.Popen:
        env = {
            "PATH": "/usr/bin:/bin", RUN_ID_ENV: run_id, "AGENTRL_SANDBOX_ID": uuid.uuid4().hex[:12],
            "AGENTRL_OWNER_PID": str(owner_pid), "AGENTRL_OWNER_START": str(owner_start),
        }
        return subprocess.Popen(["sleep", seconds], env=env, start_new_session=True)

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


# ---------------------------------------------------------------------------- concurrency, listeners


def test_eight_concurrent_execs_from_threads_on_one_sandbox(sandbox):
    def job(i: int) -> ExecResult:
        return sandbox.exec("echo $I > f_$I; sleep 0.5; cat f_$I; ls | grep -c '^f_'", env={"I": str(i)})

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(job, range(8)))
    elapsed = time.monotonic() - t0
    for i, r in enumerate(results):
        assert r.exit_code == 0, r
        assert r.stdout.splitlines()[0] == str(i)
    assert sorted(p.name for p in sandbox.host_workdir.iterdir()) == sorted(f"f_{i}" for i in range(8))
    assert elapsed < 8 * 0.5 * 0.75, elapsed  # they overlapped


def test_listeners_get_every_result_and_a_raising_listener_does_not_break_exec(sandbox, caplog):
    seen: list[ExecResult] = []

    def broken(result: ExecResult) -> None:
        raise RuntimeError("listener bug")

    sandbox.add_listener(broken)
    sandbox.add_listener(seen.append)
    with caplog.at_level(logging.ERROR, logger="sandboxes.bwrap"):
        r1 = sandbox.exec("echo one")
        r2 = sandbox.exec("exit 4")
    assert seen == [r1, r2]
    assert r2.exit_code == 4
    assert "listener bug" in caplog.text
    sandbox.remove_listener(seen.append)
    sandbox.remove_listener(seen.append)  # removing twice is a no-op
    sandbox.exec("true")
    assert len(seen) == 2
    with pytest.raises(ConfigError, match="not callable"):
        sandbox.add_listener("nope")  # type: ignore[arg-type]
