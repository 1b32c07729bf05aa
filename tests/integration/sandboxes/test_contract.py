"""The sandbox contract (sandboxes/base.py) and the abuse suite, on every backend.

Each test runs on bubblewrap and on Docker (``docker`` marker) against the real thing: real
``bwrap`` processes, a real ``dockerd`` with the base image (scripts/test.sh builds it).
What is left running is checked by scanning ``/proc`` and asking the daemon (conftest.py).
Backend-specific details live in test_bwrap_sandbox.py and test_docker_sandbox.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import resource
import shutil
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
from sandboxes import Sandbox
from sandboxes.labels import RUN_ID_ENV
from sandboxes.output import truncation_marker
from sandboxes.reaper import reaper_lock
from tests.helpers.sandbox_checks import (
    containers_with_label,
    procs_with_cmdline,
    procs_with_label,
    wait_until,
    what_is_left,
)

REPO_ROOT = Path(__file__).resolve().parents[3]

# ---------------------------------------------------------------------------- contract


def test_exec_reports_exit_code_streams_and_the_command(sandbox):
    assert isinstance(sandbox, Sandbox)
    r = sandbox.exec("echo out; echo err >&2; exit 3")
    assert isinstance(r, ExecResult)
    assert (r.exit_code, r.stdout, r.stderr, r.timed_out, r.truncated_bytes) == (3, "out\n", "err\n", False, 0)
    assert r.command == "echo out; echo err >&2; exit 3"
    assert 0 < r.duration_s < 10
    argv = ["python3", "-c", "import sys; print(sys.argv[1:]); sys.exit(5)", "a b", "c"]
    r = sandbox.exec(argv)
    assert (r.exit_code, r.stdout, r.command) == (5, "['a b', 'c']\n", tuple(argv))


def test_stdin_env_cwd_and_bad_arguments(sandbox):
    assert sandbox.exec("cat", stdin="héllo\n").stdout == "héllo\n"
    big = os.urandom(3_000_000)  # far more than a pipe buffer holds
    r = sandbox.exec("sha256sum", stdin=big)
    assert r.stdout.split()[0] == hashlib.sha256(big).hexdigest()
    text = big[:1_500_000].hex()  # ASCII, so the kept head and tail end on whole characters
    r = sandbox.exec("cat", stdin=text)  # echoed back: stdin and output flow at the same time
    assert r.exit_code == 0 and r.truncated_bytes == len(text) - sandbox.spec.output_limit_bytes
    assert sandbox.exec("echo $GREETING", env={"GREETING": "hi there"}).stdout == "hi there\n"
    sandbox.write_file("sub/dir/marker", "x")
    assert sandbox.exec("pwd").stdout == "/work\n"
    assert sandbox.exec("pwd; ls", cwd="sub/dir").stdout == "/work/sub/dir\nmarker\n"
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    with pytest.raises(ConfigError, match="stdin"):
        sandbox.exec("cat", stdin=123)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="timeout_s=-1"):
        sandbox.exec("true", timeout_s=-1)
    with pytest.raises(ConfigError, match="empty"):
        sandbox.exec([])


def test_spec_env_applies_and_the_host_environment_does_not_leak(make, run_id, monkeypatch):
    monkeypatch.setenv("AGENTRL_TEST_HOST_SECRET", "leaked")
    sb = make(env={"FROM_SPEC": "1", "OVERRIDE": "spec"})
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


def test_ro_mounts_are_bound_read_only_each_at_its_own_path(make):
    shared = tempfile.mkdtemp(prefix="agentrl-ro-mount-")  # under /tmp, readable by the sandbox's user
    try:
        os.chmod(shared, 0o755)
        Path(shared, "f.txt").write_text("hello")
        os.chmod(Path(shared, "f.txt"), 0o644)
        sb = make(ro_mounts=((shared, "/run/a"), (shared, "/opt/b")))  # one host path twice
        r = sb.exec("cat /run/a/f.txt /opt/b/f.txt; touch /run/a/x /opt/b/x 2>/dev/null; echo rc=$?")
        assert r.stdout == "hellohellorc=1\n", r
        assert sorted(os.listdir(shared)) == ["f.txt"]  # nothing written through either mount
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_missing_program_is_the_commands_failure(sandbox):
    r = sandbox.exec(["no-such-program", "x"])
    assert r.exit_code == 127
    assert "no-such-program: not found" in r.stderr


def test_files_round_trip_persist_and_refuse_escapes(sandbox, tmp_path):
    sandbox.write_file("a/b.txt", "héllo")
    assert sandbox.exec("cat a/b.txt").stdout == "héllo"
    sandbox.write_file("/work/bin.dat", bytes(range(256)))
    assert sandbox.read_file("bin.dat") == bytes(range(256))
    assert sandbox.exec("od -An -tx1 bin.dat | wc -w").stdout.strip() == "256"
    assert sandbox.exec("printf 'from exec' > made.txt").exit_code == 0
    assert sandbox.read_file("made.txt") == b"from exec"
    assert sandbox.exec("cat made.txt").stdout == "from exec"  # a later exec sees it
    with pytest.raises(SandboxError, match="No such file"):
        sandbox.read_file("missing.txt")
    for path in ("../../etc/passwd", "/etc/passwd", "/work/../etc/passwd"):
        with pytest.raises(SandboxError, match="outside the sandbox working directory"):
            sandbox.read_file(path)
        with pytest.raises(SandboxError, match="outside the sandbox working directory"):
            sandbox.write_file(path, "x")
    # A symlink planted by the command names a host path when followed from the host
    # (bubblewrap's working directory is a host directory) or a path of the container.
    host_secret = tmp_path / "host_secret.txt"
    host_secret.write_text("do not read")
    assert sandbox.exec(f"ln -s {host_secret} leak && ln -s /etc dirleak").exit_code == 0
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.read_file("leak")
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.read_file("dirleak/passwd")
    with pytest.raises(SandboxError, match="symlink"):
        sandbox.write_file("leak", "overwritten")
    assert host_secret.read_text() == "do not read"


def test_listeners_get_every_result_and_a_raising_one_is_skipped(sandbox, caplog):
    seen: list[ExecResult] = []

    def broken(result: ExecResult) -> None:
        raise RuntimeError("listener bug")

    sandbox.add_listener(broken)
    sandbox.add_listener(seen.append)
    with caplog.at_level(logging.ERROR, logger="sandboxes"):
        r1 = sandbox.exec("echo one")
        r2 = sandbox.exec("exit 4")
    assert seen == [r1, r2] and r2.exit_code == 4
    assert "listener bug" in caplog.text
    sandbox.remove_listener(seen.append)
    sandbox.remove_listener(seen.append)
    sandbox.exec("true")
    assert len(seen) == 2
    with pytest.raises(ConfigError, match="not callable"):
        sandbox.add_listener("nope")  # type: ignore[arg-type]


def test_close_is_idempotent_and_later_calls_raise(make):
    sb = make()
    sb.write_file("f", "x")
    sb.close()
    sb.close()
    assert sb.closed
    for call in (lambda: sb.exec("true"), lambda: sb.read_file("f"), lambda: sb.write_file("g", "y")):
        with pytest.raises(SandboxError, match="is closed"):
            call()


def test_C10_close_during_a_running_exec_kills_it_and_raises(make, run_id):
    sb = make()
    outcome: dict[str, object] = {}

    def run():
        try:
            outcome["result"] = sb.exec("setsid sh -c 'sleep 987654' & sleep 1000", timeout_s=600)
        except SandboxError as exc:
            outcome["error"] = exc

    worker = threading.Thread(target=run)
    worker.start()
    assert wait_until(lambda: procs_with_cmdline("sleep 987654") != [], timeout_s=10)
    t0 = time.monotonic()
    sb.close()
    worker.join(timeout=10)
    assert not worker.is_alive() and time.monotonic() - t0 < 3
    assert "closed while the command was running" in str(outcome["error"])
    assert wait_until(lambda: procs_with_label(run_id) == [] and procs_with_cmdline("sleep 987654") == [])


def test_capabilities_are_dropped_and_no_new_privileges(sandbox):
    status = sandbox.exec("cat /proc/self/status").stdout
    fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
    assert fields["CapEff"].strip() == "0000000000000000"
    assert fields["CapBnd"].strip() == "0000000000000000"
    assert fields["NoNewPrivs"].strip() == "1"


def test_constructing_a_sandbox_installs_no_signal_handler(make):
    # The program that owns the sandbox (the CLI, the controller, Ray's worker) decides what
    # a signal does; a library never takes that over as a side effect.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    make().exec("true")
    assert {sig: signal.getsignal(sig) for sig in before} == before


# ---------------------------------------------------------------------------- lifetime (C10)

# The owner process: makes one sandbox, says what it made, then runs a command with a setsid
# escapee until it is stopped. argv: run_id, backend, repo root, "own-sigterm" or "-".
_OWNER_SCRIPT = """
import json, signal, sys
sys.path.insert(0, sys.argv[3])
from sandboxes import SandboxSpec, make_sandbox
sb = make_sandbox(sys.argv[2], SandboxSpec(run_id=sys.argv[1]))
if sys.argv[4] == "own-sigterm":  # what a program that owns its signals does (the CLI does)
    def on_sigterm(signum, frame):
        raise SystemExit(128 + signum)
    signal.signal(signal.SIGTERM, on_sigterm)
made = {"workdir": str(getattr(sb, "host_workdir", "")), "container": getattr(sb, "container_id", "")}
print(json.dumps(made), flush=True)
sb.exec("setsid sh -c 'sleep 987655' & sleep 1000", timeout_s=600)
"""


def _start_owner(backend: str, run_id: str, sigterm: str = "-") -> tuple[subprocess.Popen, dict]:
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER_SCRIPT, run_id, backend, str(REPO_ROOT), sigterm],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    line = owner.stdout.readline()
    assert line, owner.stderr.read()
    made = json.loads(line)
    assert wait_until(lambda: procs_with_cmdline("sleep 987655") != [], timeout_s=10)
    assert procs_with_label(run_id) != []
    return owner, made


def test_C10_owner_killed_with_SIGKILL_leaves_what_agentrl_sandbox_gc_removes(backend, run_id):
    owner, made = _start_owner(backend, run_id)
    with reaper_lock():  # no other process's reaper (another test run's start) takes the orphan first
        owner.kill()
        owner.wait()
        if backend == "bwrap":
            # bubblewrap dies with its parent, so the process tree is gone by itself ...
            assert wait_until(lambda: procs_with_label(run_id) == [])
            assert procs_with_cmdline("sleep 987655") == []
            assert Path(made["workdir"]).exists()  # ... but the crash left the working directory
        else:
            assert containers_with_label(run_id) == [made["container"]]  # the crash left it
    # The reaper removes it (here through the CLI, as after a crashed run).
    gc = subprocess.run(
        [sys.executable, "-m", "agentrl.cli", "sandbox", "gc", "--run-id", run_id],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
    )
    assert gc.returncode == 0, gc.stdout + gc.stderr
    assert wait_until(lambda: what_is_left(run_id) == [] and procs_with_cmdline("sleep 987655") == [])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_C10_owner_stopped_with_a_signal_cleans_up_by_itself(backend, run_id, sig):
    """SIGINT is KeyboardInterrupt; SIGTERM is what the owner makes it (here SystemExit, as
    the CLI does). Either way the sandboxes' finalizers remove everything at exit."""
    owner, _ = _start_owner(backend, run_id, sigterm="own-sigterm")
    owner.send_signal(sig)
    owner.wait(timeout=30)
    stderr = owner.stderr.read()
    if sig == signal.SIGINT:
        assert "KeyboardInterrupt" in stderr
    assert owner.returncode == (-signal.SIGINT if sig == signal.SIGINT else 128 + signal.SIGTERM), stderr
    assert wait_until(lambda: what_is_left(run_id) == [] and procs_with_cmdline("sleep 987655") == [],
                      timeout_s=10), (what_is_left(run_id), stderr)


# ---------------------------------------------------------------------------- abuse


@pytest.mark.parametrize(
    "command", ["while :; do :; done", ["python3", "-c", "while True: pass"]], ids=["shell", "python"]
)
def test_abuse_infinite_loop_is_killed_at_its_timeout(sandbox, run_id, command):
    t0 = time.monotonic()
    r = sandbox.exec(command, timeout_s=1)
    assert r.timed_out and r.exit_code == 137
    assert time.monotonic() - t0 < 2.5
    assert procs_with_label(run_id) == []


def test_abuse_C10_sleep_1000_with_2s_timeout_reports_timeout_within_3s(sandbox, run_id):
    t0 = time.monotonic()
    r = sandbox.exec("sleep 1000", timeout_s=2)
    elapsed = time.monotonic() - t0
    assert r.timed_out and r.exit_code == 137
    assert 1.9 <= elapsed < 3.0, elapsed
    assert procs_with_cmdline("sleep 1000") == [] and procs_with_label(run_id) == []
    assert sandbox.exec("echo alive").stdout == "alive\n"


def test_abuse_C10_setsid_background_process_does_not_outlive_its_command(sandbox, run_id):
    r = sandbox.exec("setsid sh -c 'sleep 987651' > /dev/null 2>&1 & echo started")
    assert (r.exit_code, r.stdout, r.timed_out) == (0, "started\n", False)
    assert r.duration_s < 5
    assert procs_with_cmdline("sleep 987651") == []  # gone by the time exec returns
    r = sandbox.exec("setsid sh -c 'sleep 987652' & nohup sleep 987653 & sleep 1000", timeout_s=1)
    assert r.timed_out
    assert procs_with_cmdline("sleep 987652") == [] and procs_with_cmdline("sleep 987653") == []
    assert procs_with_label(run_id) == []


def test_abuse_command_that_closes_its_output_still_times_out(sandbox):
    r = sandbox.exec("exec >&- 2>&-; sleep 1000", timeout_s=1)
    assert r.timed_out and r.duration_s < 2.5


def test_abuse_fork_bomb_hits_the_pids_limit_and_the_sandbox_survives(make, run_id):
    sb = make(pids_limit=64, memory_mb=256)
    t0 = time.monotonic()
    r = sb.exec("bomb() { bomb | bomb & }; bomb; sleep 2", timeout_s=4)
    assert time.monotonic() - t0 < 10
    assert r.exit_code is not None
    assert wait_until(lambda: procs_with_label(run_id) == [], timeout_s=5)
    assert sb.exec("echo ok").stdout == "ok\n"


def test_abuse_memory_bomb_fails_and_the_sandbox_stays_usable(make):
    sb = make(memory_mb=256, default_timeout_s=60)
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    r = sb.exec(["python3", "-c", "x = b'x' * (2 * 1024**3); print('allocated')"])
    assert r.exit_code != 0 and "allocated" not in r.stdout
    assert not r.timed_out
    if getattr(sb, "limits", None) == "cgroup-v1":  # bubblewrap over cgroups (its rlimit mode: test_bwrap_sandbox.py)
        assert r.exit_code == 137  # the cgroup's OOM killer, inside the sandbox only
        assert sb.limit_counters()["memory_max_usage_bytes"] <= 256 * 1024 * 1024
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) * 1024 < 100 * 1024**2
    assert sb.exec("echo ok").stdout == "ok\n"


def test_abuse_C09_invalid_utf8_and_a_split_multibyte_character(sandbox):
    r = sandbox.exec("printf 'ok\\377\\376'; exit 3")
    assert (r.stdout, r.exit_code) == ("ok\ufffd\ufffd", 3)
    r = sandbox.exec(
        "printf '\\342\\202'; sleep 0.3; printf '\\254'; "
        "printf '\\342' >&2; sleep 0.2; printf '\\202\\254' >&2"
    )
    assert (r.stdout, r.stderr) == ("€", "€")


def test_abuse_C09_200MB_of_output_is_cut_to_head_and_tail_with_bounded_memory(make):
    limit = 64 * 1024
    total_out = 200_000_000 + len("HEADTAIL")
    total_err = 1_000_000
    command = (
        "printf HEAD; head -c 200000000 /dev/zero | tr '\\0' a; printf TAIL; "
        "head -c 1000000 /dev/zero | tr '\\0' e >&2"
    )
    sb = make(output_limit_bytes=limit)
    page = os.sysconf("SC_PAGE_SIZE")
    peak = {"rss": 0}
    stop = threading.Event()

    def sample_rss():
        while not stop.is_set():
            with open("/proc/self/statm") as f:
                peak["rss"] = max(peak["rss"], int(f.read().split()[1]) * page)
            time.sleep(0.005)

    with open("/proc/self/statm") as f:
        rss_before = int(f.read().split()[1]) * page
    maxrss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    sampler = threading.Thread(target=sample_rss, daemon=True)
    sampler.start()
    try:
        r = sb.exec(command, timeout_s=120)
    finally:
        stop.set()
        sampler.join()
    assert r.exit_code == 0 and not r.timed_out
    half = "a" * (limit // 2 - 4)
    assert r.stdout == "HEAD" + half + truncation_marker(total_out - limit) + half + "TAIL"
    assert "[... 199,934,472 bytes truncated ...]" in r.stdout
    assert r.stderr == "e" * (limit // 2) + truncation_marker(total_err - limit) + "e" * (limit // 2)
    assert r.truncated_bytes == total_out - limit + total_err - limit
    assert peak["rss"] - rss_before < 100 * 1024**2
    assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - maxrss_before) * 1024 < 100 * 1024**2


def test_abuse_no_network_to_the_host_loopback_or_outside_unless_asked(sandbox, make):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    port = server.getsockname()[1]
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed; the attempt fails inside anyway.
    probe = (
        "import socket, sys\n"
        "for host, port in ((sys.argv[1], int(sys.argv[2])), ('192.0.2.1', 80)):\n"
        "    s = socket.socket(); s.settimeout(2)\n"
        "    try:\n"
        "        s.connect((host, port)); print('connected', host)\n"
        "    except OSError as e:\n"
        "        print('failed', host, type(e).__name__)\n"
        "print(sorted(n for _, n in socket.if_nameindex()))\n"
    )
    try:
        server.settimeout(0.1)
        r = sandbox.exec(["python3", "-c", probe, "127.0.0.1", str(port)])
        assert r.stdout.splitlines() == [
            "failed 127.0.0.1 ConnectionRefusedError",  # its own loopback, not the host's
            "failed 192.0.2.1 OSError",  # network unreachable: only lo exists
            "['lo']",
        ], r.stderr
        with pytest.raises(socket.timeout):
            server.accept()  # nothing reached the host's port
        # network="host" is the explicit opt-out: the same probe reaches the host's port.
        r = make(network="host").exec(["python3", "-c", probe, "127.0.0.1", str(port)])
        assert r.stdout.splitlines()[0] == "connected 127.0.0.1", r.stderr
    finally:
        server.close()


def test_abuse_host_files_are_invisible(sandbox):
    with tempfile.NamedTemporaryFile("w", dir="/root", prefix="agentrl-secret-", delete=True) as f:
        f.write("host secret")
        f.flush()
        r = sandbox.exec(f"cat {f.name}; ls /root; cat {REPO_ROOT}/sandboxes/base.py")
    assert r.exit_code != 0
    assert "host secret" not in r.stdout and "Sandbox" not in r.stdout
    assert "No such file" in r.stderr
    assert sandbox.exec(f"test -e {REPO_ROOT}/sandboxes").exit_code == 1
    assert sandbox.exec(f"test -e {sys.prefix}").exit_code == 1  # the caller's venv


def test_abuse_writes_outside_the_workdir_fail(sandbox):
    for target in ("/usr/x", "/etc/x", "/x", "/bin/x", "/lib/x", "/etc/passwd", "/proc/sys/kernel/hostname"):
        r = sandbox.exec(f"echo pwned > {target}")
        assert r.exit_code != 0, target
        assert "Read-only file system" in r.stderr or "Permission denied" in r.stderr, (target, r.stderr)
    assert sandbox.exec("id -u; id -un").stdout == "1000\nsandbox\n"  # not root
    assert sandbox.exec("echo fine > /work/ok && cat /work/ok").stdout == "fine\n"


def test_abuse_64_concurrent_execs_on_one_sandbox(make):
    sb = make(pids_limit=1024, memory_mb=1024)
    marker = uuid.uuid4().hex[:8]

    def job(i: int) -> ExecResult:
        return sb.exec(f"echo $I > f_{marker}_$I; sleep 0.5; cat f_{marker}_$I", env={"I": str(i)}, timeout_s=60)

    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=64) as pool:
        results = list(pool.map(job, range(64)))
    elapsed = time.monotonic() - t0
    for i, r in enumerate(results):
        assert (r.exit_code, r.stdout, r.timed_out) == (0, f"{i}\n", False), r
    assert sb.exec(f"ls | grep -c '^f_{marker}_'").stdout == "64\n"
    # They overlapped: run one after another they would take 32 s. (Half of that leaves room
    # for a loaded 2-core machine; a timing target belongs in tests/benchmarks.)
    assert elapsed < 64 * 0.5 / 2, elapsed
