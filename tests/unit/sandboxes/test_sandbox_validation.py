"""Spec and argument validation, path containment, labels, and the backend factory."""

from __future__ import annotations

import dataclasses
import os

import pytest

from agentrl.errors import ConfigError, SandboxError
from sandboxes import SandboxSpec, make_sandbox
from sandboxes.hostfs import force_rmtree, read_beneath, workdir_components, write_beneath
from sandboxes.labels import Owner, SandboxLabel, process_start_ticks, validate_run_id
from sandboxes.validation import normalize_command, validate_env, validate_spec, validate_timeout


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("memory_mb", 0, "memory_mb=0 must be an integer >= 16"),
        ("memory_mb", 1.5, "memory_mb=1.5"),
        ("pids_limit", 2, "pids_limit=2 must be an integer >= 8"),
        ("cpus", 0, "cpus=0 must be a finite number"),
        ("cpus", float("nan"), "cpus=nan"),
        ("network", "wifi", "network='wifi'; expected 'none', 'host' or 'bridge'"),
        ("writable_root", 1, "writable_root=1 must be a bool"),
        ("tmpfs_dirs", "/logs", "tmpfs_dirs='/logs' must be a sequence"),
        ("tmpfs_dirs", ("logs",), "tmpfs_dirs entry 'logs' must be a normalised absolute path"),
        ("tmpfs_dirs", ("/work/x",), "'/work/x' overlaps /work"),
        ("tmpfs_dirs", ("/logs", "/logs/v"), "'/logs/v' overlaps /logs"),
        ("workdir", "work", "workdir='work' must be a normalised absolute path"),
        ("workdir", "/work/../x", "workdir='/work/../x'"),
        ("workdir", "/", "workdir='/'"),
        ("workdir", "/usr/src", "workdir='/usr/src' lies in /usr"),
        ("workdir", "/proc", "lies in /proc"),
        ("output_limit_bytes", -1, "output_limit_bytes=-1"),
        ("default_timeout_s", 0, "default_timeout_s=0 must be a finite number of seconds > 0"),
        ("default_timeout_s", float("inf"), "default_timeout_s=inf"),
        ("run_id", "../etc", "run_id='../etc' is invalid"),
        ("run_id", "", "run_id='' is invalid"),
        ("env", {"A=B": "x"}, "env key 'A=B' is not a valid environment variable name"),
        ("env", {"A": "x\0y"}, "must be a str without NUL bytes"),
        ("ro_mounts", "/tmp:/x", "ro_mounts='/tmp:/x' must be a sequence of (host path, sandbox path) pairs"),
        ("ro_mounts", (("/tmp",),), "ro_mounts entry ('/tmp',) must be a (host path, sandbox path) pair"),
        ("ro_mounts", (("tmp", "/run/x"),), "'tmp' must be a normalised absolute path"),
        ("ro_mounts", (("/tmp", "/run/../x"),), "'/run/../x' must be a normalised absolute path"),
        ("ro_mounts", (("/no/such/dir/here", "/run/x"),), "the host path '/no/such/dir/here' does not exist"),
        ("ro_mounts", (("/tmp", "/usr/lib/x"),), "'/usr/lib/x' overlaps /usr"),
        ("ro_mounts", (("/tmp", "/work"),), "'/work' overlaps /work"),
        ("ro_mounts", (("/tmp", "/tmp/x"),), "overlaps /tmp"),
        ("ro_mounts", (("/tmp", "/run/x"), ("/usr", "/run/x")), "ro_mounts names '/run/x' twice"),
    ],
)
def test_invalid_spec_fields_name_the_value(field, value, message):
    spec = dataclasses.replace(SandboxSpec(), **{field: value})
    with pytest.raises(ConfigError) as info:
        validate_spec(spec)
    assert message in str(info.value)


def test_valid_spec_passes_unchanged():
    spec = SandboxSpec(workdir="/tmp/work", env={"X_1": "1"}, run_id="run-1.a_b")
    assert validate_spec(spec) is spec


def test_commands_normalise_to_shell_or_argv():
    assert normalize_command("echo hi") == ("echo hi", ["/bin/sh", "-c", "echo hi"])
    assert normalize_command(["python3", "-c", "pass"]) == (
        ("python3", "-c", "pass"),
        ["python3", "-c", "pass"],
    )
    with pytest.raises(ConfigError, match=r"command=\[\] is empty"):
        normalize_command([])
    with pytest.raises(ConfigError, match="must be a str without NUL"):
        normalize_command(["a", 3])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="NUL"):
        normalize_command("a\0b")
    with pytest.raises(ConfigError, match="shell string or a sequence"):
        normalize_command(b"ls")  # type: ignore[arg-type]


def test_timeouts_and_env_are_checked():
    assert validate_timeout(2) == 2.0
    for bad in (0, -1, float("nan"), True, "3"):
        with pytest.raises(ConfigError, match="timeout_s="):
            validate_timeout(bad)
    assert validate_env({"A": "1"}, "env") == {"A": "1"}
    with pytest.raises(ConfigError, match="1A"):
        validate_env({"1A": "x"}, "env")


@pytest.mark.parametrize(
    "path, expected",
    [
        ("a.txt", ["a.txt"]),
        ("sub/dir/a.txt", ["sub", "dir", "a.txt"]),
        ("./x/../y", ["y"]),
        ("/work/a.txt", ["a.txt"]),
        ("/work/sub/../b", ["b"]),
    ],
)
def test_paths_inside_the_workdir_resolve_to_components(path, expected):
    assert workdir_components(path, "/work") == expected


@pytest.mark.parametrize(
    "path",
    ["../../etc/passwd", "/etc/passwd", "/work/../etc/passwd", "..", "/work", ".", "", "a\0b", "/workx/a"],
)
def test_paths_leaving_the_workdir_are_refused(path):
    with pytest.raises(SandboxError):
        workdir_components(path, "/work")


def test_host_side_io_refuses_symlinks_and_special_files(tmp_path):
    root = tmp_path / "work"
    root.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("host secret")
    write_beneath(root, ["d", "f.txt"], "d/f.txt", b"data")
    assert read_beneath(root, ["d", "f.txt"], "d/f.txt") == b"data"
    os.symlink(secret, root / "link")
    os.symlink(tmp_path, root / "dirlink")
    with pytest.raises(SandboxError, match="symlink"):
        read_beneath(root, ["link"], "link")
    with pytest.raises(SandboxError, match="symlink"):
        read_beneath(root, ["dirlink", "secret.txt"], "dirlink/secret.txt")
    with pytest.raises(SandboxError, match="symlink"):
        write_beneath(root, ["link"], "link", b"overwrite")
    assert secret.read_text() == "host secret"
    os.mkfifo(root / "fifo")
    with pytest.raises(SandboxError, match="not a regular file"):
        read_beneath(root, ["fifo"], "fifo")
    with pytest.raises(SandboxError, match="No such file"):
        read_beneath(root, ["missing"], "missing")


def test_force_rmtree_removes_unreadable_dirs_and_never_follows_symlinks(tmp_path):
    keep = tmp_path / "keep.txt"
    keep.write_text("keep")
    target = tmp_path / "sandbox"
    (target / "a" / "b").mkdir(parents=True)
    (target / "a" / "b" / "f").write_text("x")
    os.symlink(tmp_path, target / "escape")
    os.chmod(target / "a", 0)
    assert force_rmtree(target)
    assert not target.exists()
    assert keep.read_text() == "keep"


def test_labels_round_trip_through_environment_and_directory_names():
    owner = Owner.current()
    assert owner.pid == os.getpid() and owner.is_alive()
    assert process_start_ticks(os.getpid()) == owner.start_ticks
    label = SandboxLabel("run-1", owner, "0123456789ab")
    assert SandboxLabel.from_environ(label.environ()) == label
    assert SandboxLabel.from_dir("run-1", label.dir_name) == label
    assert SandboxLabel.from_dir("run-1", "not-a-sandbox") is None
    assert SandboxLabel.from_environ({"PATH": "/usr/bin"}) is None
    assert not Owner(owner.pid, owner.start_ticks + 1).is_alive()  # same pid, other process
    assert validate_run_id("a.b-c_1") == "a.b-c_1"


def test_make_sandbox_rejects_unknown_backends_and_invalid_specs():
    # The spec is checked before any daemon is contacted.
    with pytest.raises(ConfigError, match="memory_mb=0 must be an integer >= 16"):
        make_sandbox("docker", SandboxSpec(memory_mb=0))
    with pytest.raises(ConfigError, match="backend='podman' is unknown"):
        make_sandbox("podman", SandboxSpec())
