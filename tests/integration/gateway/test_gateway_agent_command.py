"""An agent that is a command inside the task's sandbox (``register_agent_env(command=...)``):
it reaches the gateway through the forwarder and the read-only socket mount, and no other
address; the network stays off, on both backends.

The agent is a ReAct loop in plain Python (standard library only: the sandbox's own
``python3``), shipped into the sandbox as a file (``AgentCommand.files``). It calls the
model (the package's scripted engine: a ``bash`` tool call each time), runs each call itself
in the sandbox, and then probes the addresses a command must not reach: the gateway's TCP
port on loopback and on every address of the host, and a TCP server the test listens with on
all of them (which the test itself reaches, the positive control). It tries to post its own
reward with the key it was given. It prints what it found as one JSON line and exits 3 if
anything was reached. With ``TURNS=0`` it never stops calling; with ``HANG_WHEN_ENDED`` it
hangs when its episode has ended (a harness that never gives up), writing into the working
directory, and with ``STOP_FORWARDER`` it first stops its forwarder with SIGSTOP.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from pathlib import Path

import gymnasium
import psutil
import pytest

import environments
from agentrl.cluster.actors.env_factory import env_sandbox_mounts
from agentrl.gateway import register_agent_env
from agentrl.gateway.agent_command import AgentCommand
from agentrl.gateway.server import gateway
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from sandboxes import PooledSandbox, SandboxPool, SandboxSpec, make_sandbox
from tests.helpers.sandbox_checks import require_docker
from tests.integration.gateway.conftest import COMMAND, bwrap_env_factory

pytestmark = pytest.mark.slow

AGENT = r'''
import json, os, signal, socket, subprocess, sys, time, urllib.error, urllib.request

base, key = os.environ["OPENAI_BASE_URL"], os.environ["OPENAI_API_KEY"]
task = json.load(open(os.environ["AGENTRL_TASK_FILE"]))
turns = int(os.environ.get("TURNS", "2"))


def forwarder_pid():
    pid = os.getppid()
    while pid > 1:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            if b"forward.py" in f.read():
                return pid
        with open("/proc/%d/stat" % pid) as f:
            pid = int(f.read().rsplit(")", 1)[1].split()[1])
    raise SystemExit("no forwarder above me")


def chat(messages):
    body = {"model": os.environ["AGENTRL_MODEL"], "messages": messages, "tools": task["tools"]}
    req = urllib.request.Request(base + "/chat/completions", json.dumps(body).encode(),
                                 {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(req, timeout=300).read())["choices"][0]["message"]
    except urllib.error.HTTPError as exc:
        if exc.code == 409 and os.environ.get("HANG_WHEN_ENDED"):  # a harness that never gives up
            if os.environ.get("STOP_FORWARDER"):  # ... and stops its forwarder (the same user may)
                os.kill(forwarder_pid(), signal.SIGSTOP)
            while True:
                with open("still-here.txt", "a") as f:
                    f.write(".")
                time.sleep(0.2)
        raise


messages = list(task["messages"])
n = 0
while turns == 0 or n < turns:
    n += 1
    msg = {k: v for k, v in chat(messages).items() if v is not None}
    messages.append(msg)
    for call in msg.get("tool_calls") or []:
        command = json.loads(call["function"]["arguments"])["command"]
        out = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=30)
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": out.stdout + out.stderr})
        print("ran", command, flush=True)

report = {"reached": [], "reward_status": None}
for host, port in json.loads(os.environ["PROBES"]):
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    s.settimeout(2)
    try:
        s.connect((host, port))
        report["reached"].append([host, port])
    except OSError:
        pass
    finally:
        s.close()
req = urllib.request.Request(base.rsplit("/v1", 1)[0] + "/reward", b'{"reward": 1.0}',
                             {"Authorization": "Bearer " + key, "Content-Type": "application/json"})
try:
    report["reward_status"] = urllib.request.urlopen(req, timeout=30).status
except urllib.error.HTTPError as exc:
    report["reward_status"] = exc.code
print("REPORT " + json.dumps(report), flush=True)
sys.exit(3 if report["reached"] or report["reward_status"] != 401 else 0)
'''


def _host_addresses() -> list[str]:
    """Every address of this machine's interfaces (IPv4 and global IPv6)."""
    out = []
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET or (a.family == socket.AF_INET6 and not a.address.startswith("fe80")):
                out.append(a.address)
    return out


@pytest.fixture(scope="module")
def listener():
    """A TCP server on every address of the host, accepting (the positive control)."""
    srv = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
    srv.listen(64)
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
                conn.close()
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    yield srv.getsockname()[1]
    stop.set()
    t.join()
    srv.close()


def _probes(listen_port: int) -> list[list]:
    gw = gateway().port
    return [[addr, port] for addr in _host_addresses() for port in (gw, listen_port)]


def _register(env_id: str, **env: str) -> None:
    register_agent_env(env_id, agent=AgentCommand("python3 \"$AGENTRL_AGENT_DIR/agent.py\"", env=env,
                                                  files={"agent.py": AGENT}),
                       task_env="agentrl/ShellLookup-v1")


def _worker(scripted, backend: str, execs: list, max_turns: int = 4) -> RolloutWorker:
    engine, chat = scripted
    factory = bwrap_env_factory(f"test-gw-cmd-{uuid.uuid4().hex[:8]}", backend=backend, execs=execs)
    return RolloutWorker(engine, chat, factory,
                         RolloutLimits(max_turns=max_turns, max_new_tokens=96, max_context_tokens=4096),
                         SamplingRecord(temperature=1.0), env_timeout_s=120)


def _agent_execs(execs: list) -> list:
    return [r for r in execs if "forward.py" in " ".join(r.command if isinstance(r.command, tuple) else [r.command])]


@pytest.mark.parametrize("backend", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_an_agent_command_in_the_sandbox_reaches_the_gateway_and_no_other_address(scripted, listener, backend):
    if backend == "docker":
        require_docker()
    probes = _probes(listener)
    for host, port in probes:  # the positive control: from the host, each is reachable
        if port == listener:
            socket.create_connection((host, port), timeout=2).close()
    env_id = f"tests/CommandAgent-{backend}-v0"
    _register(env_id, PROBES=json.dumps(probes), TURNS="2")
    execs: list = []
    worker = _worker(scripted, backend, execs)
    [ep] = worker.run([EpisodeRequest(env_id=env_id, task_id="lookup/0", seed=0, group_id="g0", sample_seed=0)],
                      policy_version=0)
    assert ep.error is None, ep.error
    assert ep.total_reward is not None  # ShellLookup's checks scored the sandbox
    assert [t.tool_calls for t in ep.turns] == [1, 1]
    assert all(len(t.behavior_log_probs) == len(t.completion_ids) > 0 for t in ep.turns)
    [run] = _agent_execs(execs)
    assert run.exit_code == 0, run.stderr
    assert run.stdout.count(f"ran {COMMAND}") == 2  # the agent ran its tools in the sandbox
    report = json.loads(run.stdout.split("REPORT ", 1)[1])
    assert report == {"reached": [], "reward_status": 401}, report


def test_the_end_of_an_episode_stops_an_agent_command_still_running(scripted, listener):
    _register("tests/CommandAgentForever-v0", PROBES="[]", TURNS="0", HANG_WHEN_ENDED="1")
    execs: list = []
    worker = _worker(scripted, "bwrap", execs, max_turns=2)
    t0 = time.monotonic()
    [ep] = worker.run([EpisodeRequest(env_id="tests/CommandAgentForever-v0", task_id="lookup/1", seed=1,
                                      group_id="g1", sample_seed=1)], policy_version=0)
    assert ep.error is None, ep.error
    assert len(ep.turns) == 2 and ep.truncated
    [run] = _agent_execs(execs)
    # its waiting call got a 409 and it hung: the forwarder's lifeline ended, which killed it
    assert run.exit_code == 143 and "the session ended" in run.stderr, run
    assert "HTTP Error 409" not in run.stderr  # killed while it hung, not by its own error
    assert time.monotonic() - t0 < 60


def test_an_agent_command_that_fails_is_an_infrastructure_error_not_a_score(scripted):
    register_agent_env("tests/CommandAgentFails-v0", command="echo 'no model for me' >&2; exit 4",
                       task_env="agentrl/ShellLookup-v1")
    worker = _worker(scripted, "bwrap", [])
    [ep] = worker.run([EpisodeRequest(env_id="tests/CommandAgentFails-v0", task_id="lookup/2", seed=2,
                                      group_id="g2", sample_seed=2)], policy_version=0)
    assert ep.error is not None and ep.total_reward is None
    assert "exited 4" in ep.error["message"] and "no model for me" in ep.error["message"], ep.error


def test_the_example_command_agent_runs_shell_lookup_in_its_sandbox(scripted, monkeypatch):
    monkeypatch.syspath_prepend(str(Path(__file__).parents[3] / "examples" / "openai_agent"))
    import command_agent

    execs: list = []
    worker = _worker(scripted, "bwrap", execs, max_turns=3)
    [ep] = worker.run([EpisodeRequest(env_id=command_agent.ENV_ID, task_id="lookup/3", seed=3, group_id="g3",
                                      sample_seed=3)], policy_version=0)
    assert ep.error is None, ep.error
    assert ep.total_reward is not None and [t.tool_calls for t in ep.turns] == [1, 1, 1]
    # what the agent sent back after each call: its tool's output, as a tool message
    for turn in ep.turns[:2]:
        assert [role for role, _ in json.loads(turn.observation_text)] == ["tool"], turn.observation_text


def test_a_command_cut_by_the_token_budget_is_stopped_before_the_verifier_scores(scripted, listener):
    _register("tests/CommandAgentCut-v0", PROBES="[]", TURNS="0", HANG_WHEN_ENDED="1")
    engine, chat = scripted
    execs: list = []
    factory = bwrap_env_factory(f"test-gw-cmd-{uuid.uuid4().hex[:8]}", execs=execs)
    worker = RolloutWorker(engine, chat, factory, RolloutLimits(max_turns=4, max_new_tokens=8, max_context_tokens=4096),
                           SamplingRecord(temperature=1.0), env_timeout_s=120)
    [ep] = worker.run([EpisodeRequest(env_id="tests/CommandAgentCut-v0", task_id="lookup/4", seed=4, group_id="g4",
                                      sample_seed=4)], policy_version=0)
    assert ep.error is None, ep.error
    assert len(ep.turns) == 1 and ep.turns[0].finish_reason == "length" and ep.total_reward is not None
    # the command had ended when the step that scored returned: its exec is the turn's own
    [run] = _agent_execs(ep.turns[-1].exec_results)
    assert run.exit_code == 143 and "the session ended" in run.stderr, run


def test_a_command_that_stops_its_forwarder_loses_its_pooled_sandbox(scripted, monkeypatch):
    from agentrl.gateway import agent_env
    from tests.helpers.sandbox_checks import procs_with_label, wait_until

    monkeypatch.setattr(agent_env, "COMMAND_STOP_TIMEOUT_S", 2.0)
    env_id = "tests/CommandAgentStopsForwarder-v0"
    _register(env_id, PROBES="[]", TURNS="0", HANG_WHEN_ENDED="1", STOP_FORWARDER="1")
    run_id = f"test-gw-cmd-{uuid.uuid4().hex[:8]}"
    spec = SandboxSpec(run_id=run_id, memory_mb=512, ro_mounts=env_sandbox_mounts(environments.env_class(env_id)))
    pool = SandboxPool(lambda: make_sandbox("bwrap", spec), size=1, max_sandboxes=2)
    engine, chat = scripted
    try:
        def factory(req):
            sb = PooledSandbox(pool, pool.acquire(timeout_s=60))
            return gymnasium.make(req.env_id, sandbox=sb, disable_env_checker=True), sb

        worker = RolloutWorker(engine, chat, factory,
                               RolloutLimits(max_turns=2, max_new_tokens=96, max_context_tokens=4096),
                               SamplingRecord(temperature=1.0), env_timeout_s=120)
        [ep] = worker.run([EpisodeRequest(env_id=env_id, task_id="lookup/5", seed=5, group_id="g5", sample_seed=5)],
                          policy_version=0)
        assert ep.error is None and len(ep.turns) == 2, ep.error
        # the hung command's sandbox was replaced, not reset for the next episode: nothing of
        # it runs on, and a fresh sandbox's working directory has none of its writes
        assert wait_until(lambda: procs_with_label(run_id) == [], timeout_s=30)
        assert wait_until(lambda: pool.stats().replaced >= 1, timeout_s=30)
        with pool.lease(timeout_s=60) as fresh:
            assert fresh.exec("ls").stdout == ""
    finally:
        pool.close()
