"""The front half both backends share (sandboxes/front.py), and the daemon check that needs
no Docker SDK (sandboxes/docker/daemon.py). No sandbox is started here."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, SandboxError
from sandboxes import SandboxSpec
from sandboxes.docker.daemon import docker_daemon_answers
from sandboxes.front import (
    SANDBOX_PATH,
    TIMEOUT_EXIT_CODE,
    OncePerProcess,
    SandboxFront,
    content_bytes,
    resolve_cwd,
    stdin_bytes,
)
from sandboxes.labels import RUN_ID_ENV

REPO_ROOT = Path(__file__).resolve().parents[3]


class _Owner:
    def __repr__(self) -> str:
        return "Owner(test)"


def _front(**fields) -> tuple[_Owner, SandboxFront]:
    owner = _Owner()
    return owner, SandboxFront(owner, SandboxSpec(run_id="front-test", **fields))


def test_exec_args_apply_defaults_and_normalise():
    _, front = _front(default_timeout_s=7)
    args = front.exec_args("echo hi", None, "héllo", None, None)
    assert (args.record, args.argv) == ("echo hi", ["/bin/sh", "-c", "echo hi"])
    assert (args.timeout_s, args.stdin, args.env, args.cwd) == (7.0, "héllo".encode(), {}, "/work")
    args = front.exec_args(["ls", "-l"], 2, b"x", {"A": "1"}, "sub/../dir")
    assert (args.record, args.argv, args.timeout_s, args.env, args.cwd) == (("ls", "-l"), ["ls", "-l"], 2.0, {"A": "1"}, "/work/dir")
    assert front.exec_args("true", None, None, None, "/tmp").cwd == "/tmp"


def test_exec_args_check_each_value_in_order_and_name_it():
    _, front = _front()
    with pytest.raises(ConfigError, match="empty"):
        front.exec_args([], -1, 5, {"A=": "x"}, "")  # the command first
    with pytest.raises(ConfigError, match="timeout_s=-1"):
        front.exec_args("true", -1, 5, {"A=": "x"}, "")
    with pytest.raises(ConfigError, match="stdin of type int"):
        front.exec_args("true", 1, 5, {"A=": "x"}, "")
    with pytest.raises(ConfigError, match="env key 'A='"):
        front.exec_args("true", 1, None, {"A=": "x"}, "")
    with pytest.raises(ConfigError, match="cwd=''"):
        front.exec_args("true", 1, None, None, "")


def test_environment_puts_the_run_label_last():
    _, front = _front(env={"FROM_SPEC": "1", "OVERRIDE": "spec"})
    env = front.environment({"OVERRIDE": "exec", RUN_ID_ENV: "forged", "PATH": "/evil"})
    assert env["OVERRIDE"] == "exec" and env["FROM_SPEC"] == "1" and env["PATH"] == "/evil"
    assert env[RUN_ID_ENV] == "front-test"  # cannot be forged
    assert front.environment({})["PATH"] == SANDBOX_PATH and front.environment({})["HOME"] == "/work"


def test_coercions_name_the_bad_type():
    assert stdin_bytes(None) is None and stdin_bytes(bytearray(b"ab")) == b"ab"
    assert content_bytes("é") == "é".encode() and content_bytes(memoryview(b"xy")) == b"xy"
    with pytest.raises(ConfigError, match="content of type list must be bytes or str"):
        content_bytes([1])  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="stdin of type float"):
        stdin_bytes(1.5)  # type: ignore[arg-type]
    assert resolve_cwd(None, "/w") == "/w" and resolve_cwd("a/./b", "/w") == "/w/a/b"
    with pytest.raises(ConfigError, match="NUL"):
        resolve_cwd("a\0b", "/w")
    assert TIMEOUT_EXIT_CODE == 137


def test_in_flight_execs_are_cancelled_by_close_which_runs_once():
    owner, front = _front()
    front.begin("a", "handle-a")
    assert not front.cancelled("a") and not front.closed
    assert front.close() == ["handle-a"]
    assert front.closed and front.cancelled("a")
    assert front.close() is None  # already closed
    front.begin("b", "handle-b")  # begun after close: cancelled at once
    assert front.cancelled("b")
    assert front.end("a") is True and front.end("b") is True
    assert front.end("never-begun") is False
    with pytest.raises(SandboxError, match=r"Owner\(test\) is closed") as info:
        front.check_open("ls")
    assert info.value.command == "ls"
    del owner  # held weakly: the owner's finalizer is not delayed by its front


def test_once_per_process_calls_once_and_logs_a_failure(caplog):
    calls = []
    once = OncePerProcess("test reaping")
    once(calls.append, 1)
    once(calls.append, 2)
    assert calls == [1]

    def boom():
        raise RuntimeError("reaper broke")

    failing = OncePerProcess("test reaping")
    failing(boom)  # logged, not raised
    assert "test reaping failed" in caplog.text and "reaper broke" in caplog.text


def _serve_once(path: str, reply: bytes) -> threading.Thread:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def run():
        conn, _ = server.accept()
        with conn, server:
            conn.recv(4096)
            conn.sendall(reply)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_docker_daemon_answers_asks_the_socket_named_by_docker_host(tmp_path, monkeypatch):
    good, bad = str(tmp_path / "good.sock"), str(tmp_path / "bad.sock")
    t1 = _serve_once(good, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nOK")
    t2 = _serve_once(bad, b"HTTP/1.1 500 Internal Server Error\r\n\r\nno")
    monkeypatch.setenv("DOCKER_HOST", f"unix://{good}")
    assert docker_daemon_answers(2.0) is True
    monkeypatch.setenv("DOCKER_HOST", f"unix://{bad}")
    assert docker_daemon_answers(2.0) is False
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    assert docker_daemon_answers(0.5) is False
    t1.join(5)
    t2.join(5)


def test_the_daemon_check_and_the_package_import_no_docker_sdk():
    code = (
        "import sys\n"
        "import sandboxes\n"
        "from sandboxes.docker import docker_daemon_answers\n"
        "from sandboxes.docker.daemon import docker_available\n"
        "docker_daemon_answers(0.2)\n"
        "assert 'docker' not in sys.modules, 'the docker SDK was imported'\n"
        "from sandboxes.docker import DockerSandbox\n"
        "assert 'docker' in sys.modules\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                       env={"PATH": "/usr/bin:/bin", "DOCKER_HOST": "unix:///nonexistent.sock"})
    assert r.returncode == 0, r.stderr
