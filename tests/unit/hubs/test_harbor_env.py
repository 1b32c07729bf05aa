"""``hub/Harbor-v0``'s episodes (agentrl/hubs/harbor.py) over the task folders of
tests/helpers/harbor_tasks, with the Docker side replaced by a scripted container: the commands
the env runs there, in what order, with which timeouts (the task's, times timeout_multiplier),
what the verifier's result becomes (a reward, or an infrastructure error), the oracle, the
agent's time budget, and the agent-command env's hand-over of the task's container. The same
episodes against real containers: tests/integration/hubs/test_harbor_docker.py."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

import gymnasium
import pytest

import agentrl.hubs.harbor as harbor
import agentrl.hubs.harbor_runtime as runtime
from agentrl.errors import ConfigError, EnvError, InfraError
from agentrl.hubs.harbor import ENV_ID, ORACLE_ACTION, HarborEnv, register_harbor_env
from agentrl.hubs.harbor_agent import HarborAgentEnv, register_harbor_agent
from agentrl.hubs.harbor_task import PATH_ENV, HarborError
from agentrl.types import ExecResult
from environments.checker import check_env

TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"
OK = ("", "")


class FakeContainer:
    """A task container that understands the commands the env sends it: mkdir, staging a tar,
    ending the agent's processes, remaking /logs/verifier, reading a file, bash scripts and
    agent commands."""

    def __init__(self, spec: Any, box: "Boxes") -> None:
        self.spec, self.box = spec, box
        self.files: dict[str, str] = {"/app/name.txt": "harbor\n"}
        self.staged: dict[str, list[str]] = {}
        self.execs: list[tuple[list[str], float | None, dict | None]] = []
        self.closed = False

    def _result(self, argv: list[str], code: int = 0, out: tuple[str, str] = OK, duration_s: float = 0.01,
                timed_out: bool = False) -> ExecResult:
        return ExecResult(command=tuple(argv), exit_code=code, stdout=out[0], stderr=out[1], duration_s=duration_s,
                          timed_out=timed_out)

    def exec(self, command, *, timeout_s=None, stdin=None, env=None, cwd=None) -> ExecResult:
        assert not self.closed, "exec on a closed container"
        argv = list(command)
        self.execs.append((argv, timeout_s, env))
        if argv[:2] == ["mkdir", "-p"]:
            return self._result(argv)
        if argv[0] == "sh" and "tar -xf" in argv[2]:
            with tarfile.open(fileobj=io.BytesIO(stdin)) as tar:
                self.staged[argv[4]] = sorted(tar.getnames())
            return self._result(argv)
        if argv[:3] == ["bash", "-c", runtime.STOP_AGENT_SCRIPT]:
            return self._result(argv)
        if argv[0] == "sh" and "rm -rf" in argv[2]:
            self.files = {k: v for k, v in self.files.items() if not k.startswith(argv[4] + "/")}
            return self._result(argv)
        if argv[0] == "sh" and "-mindepth 1 -delete" in argv[2]:
            self.files = {k: v for k, v in self.files.items() if not k.startswith(argv[4] + "/")}
            return self._result(argv)
        if argv[0] == "sh" and "exit 3" in argv[2]:
            path = argv[4]
            return self._result(argv, 0, (self.files[path], "")) if path in self.files else self._result(argv, 3)
        if argv == ["bash", "/tests/test.sh"]:
            return self.box.test_sh(self, argv, timeout_s, env)
        if argv == ["bash", "/solution/solve.sh"]:
            self.files["/app/greeting.txt"] = "hello harbor\n"
            return self._result(argv)
        if argv[:2] == ["bash", "-c"]:
            if "greeting" in argv[2]:
                self.files["/app/greeting.txt"] = "hello harbor\n"
            return self._result(argv, 0, (f"ran {argv[2]}\n", ""), duration_s=self.box.command_s,
                                timed_out=self.box.command_s >= timeout_s)
        raise AssertionError(f"unexpected exec {argv}")

    def close(self) -> None:
        self.closed = True


class Boxes:
    """What the env's Docker side made: its containers, in order."""

    def __init__(self) -> None:
        self.made: list[FakeContainer] = []
        self.command_s = 0.01
        self.test_sh = default_test_sh

    @property
    def last(self) -> FakeContainer:
        return self.made[-1]


def default_test_sh(c: FakeContainer, argv, timeout_s, env) -> ExecResult:
    right = c.files.get("/app/greeting.txt") == f"{(env or {}).get('GREETING', 'hello')} harbor\n"
    c.files["/logs/verifier/reward.txt"] = "1\n" if right else "0\n"
    return c._result(argv, 0, ("tests ran\n", ""))


class FakeClient:
    closed = 0

    def close(self) -> None:
        FakeClient.closed += 1


@pytest.fixture(autouse=True)
def _unregister():
    yield
    for env_id in ("tests/HarborHello-v0", "tests/HarborAgentFn-v0", "tests/HarborAgentCmd-v0"):
        gymnasium.registry.pop(env_id, None)


@pytest.fixture
def boxes(monkeypatch) -> Boxes:
    made = Boxes()

    class Images:
        def ensure(self, task, client, docker_host, timeout_multiplier=1.0):
            assert isinstance(client, FakeClient)
            return runtime.image_name(task)

    def start(spec, client):
        box = FakeContainer(spec, made)
        made.made.append(box)
        return box

    monkeypatch.setattr(harbor, "IMAGES", Images())
    monkeypatch.setattr(harbor, "open_client", lambda docker_host: FakeClient())
    monkeypatch.setattr(harbor, "start_sandbox", start)
    monkeypatch.setattr(runtime, "image_workdir", lambda image, client: "/app")
    return made


def test_task_ids_come_from_the_path():
    assert HarborEnv.task_ids("train", env_kwargs={"path": str(TASKS)}) == \
        ["hanging-verifier", "hello-file", "public-network"]
    with pytest.raises(ConfigError, match=rf"needs path=.*\${PATH_ENV}"):
        HarborEnv.task_ids("train")
    with pytest.raises(ConfigError, match="split='dev'"):
        HarborEnv(path=str(TASKS), split="dev")
    with pytest.raises(ConfigError, match="network='host'"):
        HarborEnv(path=str(TASKS), network="host")
    with pytest.raises(ConfigError, match="timeout_multiplier=0"):
        HarborEnv(path=str(TASKS), timeout_multiplier=0)


def test_the_path_from_the_environment_and_a_registered_id(monkeypatch):
    monkeypatch.setenv(PATH_ENV, str(TASKS / "hello-file"))
    assert HarborEnv.task_ids("test") == ["hello-file"]
    cls = register_harbor_env("tests/HarborHello-v0", str(TASKS), network="none")
    assert cls.task_ids("all") == ["hanging-verifier", "hello-file", "public-network"]
    with pytest.raises(ConfigError, match="registered already"):
        register_harbor_env("tests/HarborHello-v0", str(TASKS))


def test_an_agent_that_does_nothing_scores_0(boxes):
    env = HarborEnv(path=str(TASKS), run_id="unit-harbor")
    obs, info = env.reset(options={"task_id": "hello-file"})
    assert "/app/greeting.txt" in obs and "`/app`" in obs
    assert info["task_id"] == "hello-file" and info["anchor"] == ("hello-file", "")
    assert info["tools"][0]["function"]["name"] == "bash" and "```bash" in info["system_prompt"]
    spec = boxes.last.spec
    assert (spec.network, spec.workdir, spec.writable_root, spec.tmpfs_dirs) == \
        ("none", "/app", True, ("/logs", "/tests", "/solution"))
    assert (spec.memory_mb, spec.cpus, spec.run_id) == (512, 1.0, "unit-harbor")  # task.toml's, then the env's
    assert spec.image.startswith("agentrl-harbor/hello-file:")
    obs, reward, terminated, truncated, info = env.step("I am done.")
    assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
    assert "scored 0" in obs and boxes.last.closed
    assert boxes.last.staged["/tests"] == ["test.sh"]
    test_run = [e for e in boxes.last.execs if e[0] == ["bash", "/tests/test.sh"]]
    # the verifier's timeout, its fixed PATH and the task's env
    assert test_run == [(["bash", "/tests/test.sh"], 30.0, {"PATH": runtime.VERIFIER_PATH, "GREETING": "hello"})]
    # the agent's processes are killed, then /logs/verifier remade and /tests staged, then test.sh runs
    steps = [e[0][2] if e[0][0] in ("sh", "bash") and e[0][1] == "-c" else e[0] for e in boxes.last.execs[-5:-1]]
    assert steps[0] == runtime.STOP_AGENT_SCRIPT and "rm -rf" in steps[1] and "tar -xf" in steps[2]
    assert steps[3] == ["bash", "/tests/test.sh"]
    with pytest.raises(EnvError, match="ended"):
        env.step("more")
    env.close()
    env.close()


def test_commands_in_fenced_blocks_and_tool_calls_then_the_verifier(boxes):
    env = HarborEnv(path=str(TASKS))
    env.reset(options={"task_id": "hello-file"})
    obs, reward, term, trunc, info = env.step("Let me look.\n```bash\nls -la\n```\nand\n```sh\ncat name.txt\n```")
    assert (reward, term, trunc, info["observation_role"]) == (0.0, False, False, "user")
    assert "Result of command 1 of 2:\nExit code: 0\nstdout:\nran ls -la" in obs
    first_anchor = info["anchor"]
    assert first_anchor[0] == "hello-file" and len(first_anchor[1]) == 16
    call = '<tool_call>{"name": "bash", "arguments": {"command": "echo hello $(cat name.txt) > greeting.txt"}}</tool_call>'
    obs, reward, term, trunc, info = env.step(call)
    assert info["observation_role"] == "tool" and len(info["tool_outputs"]) == 1 and info["anchor"] != first_anchor
    obs, reward, term, trunc, info = env.step("Done: greeting.txt holds the greeting.")
    assert (reward, term, trunc, info["success"], info["rewards"]) == (1.0, True, False, True, {"reward": 1.0})
    agent_cmds = [e for e in boxes.last.execs if e[0][:2] == ["bash", "-c"] and e[0][2] != runtime.STOP_AGENT_SCRIPT]
    # min(tool_timeout_s=120, what is left of the task's 60 s agent timeout): 0.01 s per command
    assert [e[1] for e in agent_cmds] == pytest.approx([60.0, 59.99, 59.98])
    env.close()


def test_timeouts_scale_with_timeout_multiplier_and_the_agent_time_is_a_budget(boxes):
    env = HarborEnv(path=str(TASKS), timeout_multiplier=0.5, tool_timeout_s=20)
    env.reset(options={"task_id": "hello-file"})  # agent 60 s -> 30 s, verifier 30 s -> 15 s
    boxes.command_s = 12.0
    env.step("```bash\nsleep 12\n```")
    env.step("```bash\nsleep 12\n```")
    obs, reward, term, trunc, info = env.step("```bash\nsleep 12\n```\n```bash\necho never\n```")
    assert (term, trunc) == (False, True) and "agent time of this task is spent" in obs
    timeouts = [e[1] for e in boxes.last.execs if e[0][:2] == ["bash", "-c"] and e[0][2] != runtime.STOP_AGENT_SCRIPT]
    assert timeouts == [20.0, 18.0, 6.0]  # capped by what is left of the 30 s; the 4th command never ran
    assert [e[1] for e in boxes.last.execs if e[0] == ["bash", "/tests/test.sh"]] == [15.0]


def test_a_hanging_test_sh_is_an_infrastructure_error_not_a_score(boxes):
    def hangs(c, argv, timeout_s, env):
        return c._result(argv, 137, ("still going", ""), duration_s=timeout_s, timed_out=True)

    boxes.test_sh = hangs
    env = HarborEnv(path=str(TASKS))
    env.reset(options={"task_id": "hanging-verifier"})
    with pytest.raises(HarborError, match=r"ran past the verifier timeout \(2 s\)") as info:
        env.step("done")
    assert isinstance(info.value, InfraError) and boxes.last.closed
    with pytest.raises(EnvError):
        env.step("again")


@pytest.mark.parametrize("written, match", [
    ({}, "wrote neither"),
    ({"/logs/verifier/reward.txt": "passed"}, "reward.txt holds 'passed'"),
    ({"/logs/verifier/reward.json": '{"a": 1, "b": 2}'}, "no 'reward'"),
])
def test_a_missing_or_bad_reward_is_an_infrastructure_error(boxes, written, match):
    def writes(c, argv, timeout_s, env):
        c.files.update(written)
        return c._result(argv, 1, ("", "boom"))

    boxes.test_sh = writes
    env = HarborEnv(path=str(TASKS))
    env.reset(options={"task_id": "hello-file"})
    with pytest.raises(HarborError, match=match) as info:
        env.step("done")
    assert "test.sh exit code 1" in str(info.value)


def test_reward_json_and_the_public_network(boxes):
    def json_reward(c, argv, timeout_s, env):
        c.files["/logs/verifier/reward.json"] = '{"reward": 0.5, "files": 1}'
        return c._result(argv)

    boxes.test_sh = json_reward
    env = HarborEnv(path=str(TASKS))
    env.reset(options={"task_id": "public-network"})
    assert boxes.last.spec.network == "bridge"
    _, reward, _, _, info = env.step("done")
    assert (reward, info["rewards"], info["success"]) == (0.5, {"reward": 0.5, "files": 1.0}, False)
    env = HarborEnv(path=str(TASKS), network="none")
    _, info = env.reset(options={"task_id": "public-network"})
    assert boxes.last.spec.network == "none" and info["network"] == "none"


def test_the_oracle_must_score_1(boxes):
    env = HarborEnv(path=str(TASKS))
    env.reset(options={"task_id": "hello-file"})
    obs, reward, term, trunc, info = env.step(ORACLE_ACTION)
    assert (reward, term, info["success"]) == (1.0, True, True) and "oracle solution ran" in obs
    assert boxes.last.staged["/solution"] == ["solve.sh"]
    solve = [e for e in boxes.last.execs if e[0] == ["bash", "/solution/solve.sh"]]
    assert solve == [(["bash", "/solution/solve.sh"], 60.0, {})]  # the agent timeout, [solution] env
    boxes.test_sh = lambda c, argv, t, e: (c.files.update({"/logs/verifier/reward.txt": "0"}), c._result(argv))[1]
    env.reset(options={"task_id": "hello-file"})
    with pytest.raises(HarborError, match="its oracle .* scores 0; expected 1"):
        env.step(ORACLE_ACTION)
    assert HarborEnv.checker_actions() == [ORACLE_ACTION] and ORACLE_ACTION not in HarborEnv(path=str(TASKS)).system_prompt


def test_invalid_tool_calls_and_max_turns(boxes):
    env = HarborEnv(path=str(TASKS), max_invalid_actions=1, max_turns=2)
    env.reset(options={"task_id": "hello-file"})
    obs, reward, term, trunc, info = env.step('<tool_call>{"name": "bash", "arguments": {}}</tool_call>')
    assert info["invalid_action"] and not (term or trunc) and "Invalid replies left before the task ends: 0" in obs
    obs, reward, term, trunc, info = env.step('<tool_call>{"name": "python"}</tool_call>')
    assert info["invalid_action"] and (term, trunc) == (False, True) and "Too many invalid replies" in obs
    env.reset(options={"task_id": "hello-file"})
    env.step("```bash\nls\n```")
    obs, reward, term, trunc, info = env.step("```bash\necho hello harbor > greeting.txt\n```")
    assert (reward, term, trunc) == (1.0, False, True) and "last of 2 turns" in obs


def test_the_env_checker_passes_with_the_oracle(boxes):
    report = check_env(ENV_ID, env_kwargs={"path": str(TASKS)}, task_id="hello-file")
    report.raise_if_failed()
    assert all(b.closed for b in boxes.made)


def test_a_failed_start_leaves_nothing_running(boxes, monkeypatch):
    def broken(spec, client):
        raise HarborError("no image")

    monkeypatch.setattr(harbor, "start_sandbox", broken)
    env = HarborEnv(path=str(TASKS))
    with pytest.raises(HarborError, match="no image"):
        env.reset(options={"task_id": "hello-file"})
    with pytest.raises(EnvError):
        env.step("x")
    env.close()


def test_an_agent_command_runs_in_the_tasks_container(boxes):
    cls = register_harbor_agent("tests/HarborAgentFn-v0", path=str(TASKS), agent="tests.unit.hubs.test_harbor_env:_agent",
                                task_env_kwargs={"timeout_multiplier": 2.0})
    assert issubclass(cls, HarborAgentEnv) and not cls.uses_sandbox  # a function needs no run sandbox
    assert cls.task_ids("train") == ["hanging-verifier", "hello-file", "public-network"]
    cmd = register_harbor_agent("tests/HarborAgentCmd-v0", path=str(TASKS), command="my-agent --go")
    assert cmd.uses_sandbox and cmd.agent.command == "my-agent --go"
    with pytest.raises(ConfigError, match="not both or neither"):
        register_harbor_agent("tests/HarborAgentNone-v0", path=str(TASKS))
    env = cls(timeout_s=99.0)
    assert env.sandbox is None and env.timeout_s == 99.0
    env.inner.reset(options={"task_id": "hello-file"})
    assert env.sandbox is boxes.last and env.timeout_s == 120.0  # the task's 60 s agent timeout, times 2
    env.close()
    assert boxes.last.closed and env.sandbox is None


def _agent(task, client):  # an agent function for the registration above (never run here)
    return None


def test_the_oracle_action_is_a_secret_of_this_process():
    assert ORACLE_ACTION.startswith("<harbor-oracle ") and len(ORACLE_ACTION) > 40
    assert harbor.fenced_commands("```python\nprint(1)\n```\n```bash\n\n```") == []


def test_the_example_config_reaches_the_verifier_before_the_rollout_cuts():
    from agentrl.config import load_config

    repo = Path(__file__).resolve().parents[3]
    cfg = load_config(repo / "examples" / "harbor_hello.yaml")
    kw = cfg.env.kwargs
    assert cfg.env.id == ENV_ID
    assert cfg.rollout.max_turns >= kw["max_turns"] + kw["max_invalid_actions"] + 1
    assert HarborEnv.task_ids(cfg.env.split, env_kwargs={**kw, "path": str(repo / kw["path"])}) == ["hello-file"]
