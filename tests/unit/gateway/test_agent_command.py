"""An agent command's checks and the argv it runs under (the forwarder); the forwarder
itself against a real gateway over its Unix socket, outside any sandbox."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from agentrl.errors import ConfigError
from agentrl.gateway import register_agent_env
from agentrl.gateway.agent_command import AgentCommand
from agentrl.gateway.server import FORWARDER_NAME, SOCKET_NAME, GatewayServer
from agentrl.gateway.session import AgentReply


@pytest.mark.parametrize("kwargs, message", [
    ({"command": " "}, "command='' is empty"),
    ({"command": []}, "expected a shell string or a non-empty list of str"),
    ({"command": "x", "env": {"OPENAI_API_KEY": "k"}}, "env['OPENAI_API_KEY'] is set by the gateway"),
    ({"command": "x", "files": {"../a.py": ""}}, "files['../a.py']"),
    ({"command": "x", "files": {"/a.py": ""}}, "files['/a.py']"),
    ({"command": "x", "files": {".": ""}}, "files['.']: expected a normalised relative name"),
    ({"command": "x", "files": {"a/./b": ""}}, "files['a/./b']"),
    ({"command": "x", "files": {"task.json": "{}"}}, "that name holds the task"),
    ({"command": "x", "files": {"a": "", "a/b": ""}}, "files['a'] is a file and the directory of another"),
    ({"command": "x", "files": {"a.py": "\ud800"}}, "expected text that is valid UTF-8"),
    ({"command": "x", "files": {"a.py": b"bytes"}}, "expected text that is valid UTF-8"),
])
def test_bad_agent_commands_are_refused_by_name(kwargs, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        AgentCommand(**kwargs)


def test_the_command_runs_under_the_forwarder_with_its_session():
    argv = AgentCommand("my-agent --fast").argv("abc-123")
    assert argv[:2] == ["python3", "/run/agentrl-gateway/forward.py"]
    assert argv[argv.index("--session") + 1] == "abc-123"
    assert argv[argv.index("--") + 1:] == ["/bin/sh", "-c", "my-agent --fast"]
    assert AgentCommand(["a", "b"]).argv("s")[-2:] == ["a", "b"]


def test_register_agent_env_takes_a_function_or_a_command_not_both():
    with pytest.raises(ConfigError, match="not both or neither"):
        register_agent_env("tests/Both-v0", agent=lambda task, client: None, command="x",
                           task_env="agentrl/ShellLookup-v1")
    with pytest.raises(ConfigError, match="not both or neither"):
        register_agent_env("tests/Neither-v0", task_env="agentrl/ShellLookup-v1")
    with pytest.raises(ConfigError, match="uses none"):
        register_agent_env("tests/NoSandbox-v0", command="x", task_env="agentrl/Sokoban-v0")
    cls = register_agent_env("tests/CmdMounts-v0", command="x", task_env="agentrl/ShellLookup-v1")
    (host, inside), = cls.sandbox_mounts()
    assert inside == "/run/agentrl-gateway" and os.path.exists(os.path.join(host, SOCKET_NAME))
    fn = register_agent_env("tests/FnMounts-v0", agent=lambda task, client: None, task_env="agentrl/ShellLookup-v1")
    assert fn.sandbox_mounts() == ()


@pytest.fixture
def server():
    srv = GatewayServer()
    yield srv
    srv.shutdown()


def _forward(srv, session, command, payload=None):
    return subprocess.Popen(
        [sys.executable, os.path.join(srv.socket_dir, FORWARDER_NAME), "--socket",
         os.path.join(srv.socket_dir, SOCKET_NAME), "--session", session.session_id, "--", *command],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=dict(os.environ, OPENAI_API_KEY=session.key))


def test_the_forwarder_serves_the_session_on_loopback_and_exits_with_the_command(server):
    session = server.open_session(separate_reward_key=True)
    script = ("import json,os,urllib.request as u;t=json.load(open(os.environ['AGENTRL_TASK_FILE']));"
              "print(open(os.path.join(os.environ['AGENTRL_AGENT_DIR'],'x.txt')).read());"
              "r=u.Request(os.environ['OPENAI_BASE_URL']+'/chat/completions',json.dumps({'messages':t['messages']})"
              ".encode(),{'Authorization':'Bearer '+os.environ['OPENAI_API_KEY']});"
              "print(json.loads(u.urlopen(r).read())['choices'][0]['message']['content']);raise SystemExit(5)")

    def env_side():
        ev = session.next_event(30)
        assert ev.call.request.messages == [{"role": "user", "content": "hi"}]
        ev.call.answer(AgentReply(content="hello", tool_calls=[], finish_reason="stop", prompt_ids=[1],
                                  completion_ids=[2], log_probs=[-0.5], tokens=["x"]))

    t = threading.Thread(target=env_side)
    t.start()
    proc = _forward(server, session, [sys.executable, "-c", script])
    out, err = proc.communicate(json.dumps({"task": {"messages": [{"role": "user", "content": "hi"}]},
                                            "files": {"x.txt": "shipped"}}), timeout=60)
    t.join()
    assert proc.returncode == 5, err  # the command's own exit status
    assert out.split() == ["shipped", "hello"]
    assert server.base_url(session).split("/sessions/")[0] not in out  # it never saw the TCP address


def test_the_forwarder_refuses_a_wrong_key_and_stops_its_command_when_the_session_ends(server):
    session = server.open_session()
    proc = _forward(server, session, ["sleep", "1000"])
    proc.stdin.close()
    threading.Timer(1.0, server.close_session, args=(session,)).start()
    assert proc.wait(timeout=30) == 143
    assert "the session ended" in proc.stderr.read()

    other = server.open_session()
    bad = subprocess.run([sys.executable, os.path.join(server.socket_dir, FORWARDER_NAME), "--socket",
                          os.path.join(server.socket_dir, SOCKET_NAME), "--session", other.session_id, "--", "true"],
                         input="", capture_output=True, text=True, env=dict(os.environ, OPENAI_API_KEY="wrong"),
                         timeout=30)
    assert bad.returncode == 2 and "refused (HTTP 401)" in bad.stderr


def test_the_engine_pool_starts_a_router_only_for_an_agent_behind_the_gateway(tmp_path):
    from agentrl.cluster.engines.gateway_router import serves_gateway
    from agentrl.config import load_config

    register_agent_env("tests/RouterAgent-v0", agent=lambda task, client: None, task_env="agentrl/ShellLookup-v1")
    assert serves_gateway(load_config(None, [f"run.dir={tmp_path}", "env.id=tests/RouterAgent-v0"]))
    assert not serves_gateway(load_config(None, [f"run.dir={tmp_path}", "env.id=agentrl/GuessNumber-v0"]))


def test_a_long_temporary_directory_does_not_stop_the_gateway(monkeypatch, tmp_path):
    long_dir = tmp_path / ("x" * 120)
    long_dir.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(long_dir))
    srv = GatewayServer()
    try:
        assert len(os.path.join(srv.socket_dir, SOCKET_NAME)) < 108
        assert os.path.exists(os.path.join(srv.socket_dir, SOCKET_NAME))
    finally:
        srv.shutdown()


def test_a_command_given_per_instance_without_the_gateway_mount_is_refused():
    from agentrl.gateway import AgentEnv
    from sandboxes import SandboxSpec, make_sandbox

    sb = make_sandbox("bwrap", SandboxSpec(run_id="test-no-mount", memory_mb=256))
    try:
        with pytest.raises(ConfigError, match="needs the gateway's socket mounted"):
            AgentEnv(sb, agent=AgentCommand("x"), task_env="agentrl/ShellLookup-v1")
    finally:
        sb.close()
