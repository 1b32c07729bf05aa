"""``hub/OpenEnv-v0`` (agentrl/hubs/openenv.py) against a fake OpenEnv server in this process
(tests/helpers/openenv_fake.py: openenv 0.10's /schema, /health and /ws, no openenv): episodes,
per-step rewards, invalid actions counted, sessions closed with their episode, and every server
failure an infrastructure error."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from agentrl.config import load_config
from agentrl.errors import ConfigError, EnvError, InfraError
from agentrl.hubs.openenv import INVALID_ACTIONS_COUNTER, TASKS, OpenEnvEnv
from agentrl.hubs.openenv_servers import ServerSpec
from agentrl.hubs.openenv_wire import CapacityError, OpenEnvError
from agentrl.types import StepInfo
from tests.helpers.openenv_fake import INT_ACTION, FakeOpenEnv


@pytest.fixture
def fake():
    server = FakeOpenEnv(steps=3)
    yield server
    server.shutdown()


def _wait(check, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_making_the_env_reaches_nothing_and_starts_nothing():
    # a dead address and a program that does not exist: neither is touched until reset
    OpenEnvEnv(server="http://127.0.0.1:9").close()
    env = OpenEnvEnv(server={"command": ["/nonexistent/openenv-server", "{port}"]})
    with pytest.raises(InfraError, match="could not start the OpenEnv server"):
        env.reset(options={"task_id": "openenv/0"})
    env.close()


def test_an_episode_gives_per_step_rewards_and_closes_its_session_when_done(fake):
    env = OpenEnvEnv(server=fake.base_url, anchor_fields=["n"])
    obs, info = env.reset(options={"task_id": "openenv/7"})
    assert obs == '{"text": "count 7", "n": 0}' and fake.resets == [{"seed": 7}]
    reset_info = StepInfo.from_info(info, env_id="t", where="reset")
    assert "'message' field" in reset_info.system_prompt and info["split"] == "train" and info["server"] == fake.base_url
    assert fake.open_sessions == 1
    rewards, anchors = [], [reset_info.anchor]
    for i in range(3):
        obs, reward, terminated, truncated, info = env.step(f"hello {i}")
        rewards.append(reward)
        anchors.append(StepInfo.from_info(info, env_id="t").anchor)
        assert info["metadata"] == {"n": i + 1} and not info["invalid_action"]
        assert terminated == (i == 2) and not truncated
    assert rewards == [0.5, 0.5, 1.0]
    assert anchors == [("openenv/7", '{"n": 0}'), ("openenv/7", '{"n": 1}'), ("openenv/7", '{"n": 2}'),
                       ("openenv/7", '{"n": 3}')]
    assert [a["message"] for a in fake.actions] == ["hello 0", "hello 1", "hello 2"]
    _wait(lambda: fake.open_sessions == 0)  # closed with the episode, before close()
    with pytest.raises(EnvError, match="ended"):
        env.step("again")
    env.reset(options={"task_id": "openenv/8"})  # a new episode: a new session
    assert fake.sessions_made == 2
    env.close()
    _wait(lambda: fake.open_sessions == 0)


def test_invalid_actions_are_counted_not_sent_and_can_end_the_episode():
    fake = FakeOpenEnv(action_schema=INT_ACTION, steps=5)
    try:
        env = OpenEnvEnv(server=fake.base_url, max_invalid_actions=2, invalid_action_reward=-0.1)
        _, info0 = env.reset(options={"task_id": "openenv/1"})
        assert "JSON schema" in info0["system_prompt"] and '"x"' in info0["system_prompt"]
        obs, reward, terminated, truncated, info = env.step("I move up")
        assert reward == -0.1 and not terminated and not truncated
        assert info["invalid_action"] and info["counters"] == {INVALID_ACTIONS_COUNTER: 1.0}
        assert info["anchor"] == info0["anchor"]  # the server's state did not change
        assert "not a valid action: no JSON object" in obs and fake.actions == []
        obs, reward, terminated, truncated, info = env.step('{"x": -3, "y": 0}')
        assert truncated and not terminated and "the episode ends" in obs and fake.actions == []
        _wait(lambda: fake.open_sessions == 0)
    finally:
        fake.shutdown()


def test_an_action_the_server_refuses_is_an_invalid_action(fake):
    env = OpenEnvEnv(server=fake.base_url)
    env.reset(options={"task_id": "openenv/1"})
    obs, reward, terminated, truncated, info = env.step("refuse")
    assert info["invalid_action"] and reward == 0.0 and not (terminated or truncated)
    assert "the environment refused it: message: String should have at most 3 characters" in obs
    assert env.step("fine")[1] == 0.5  # the session goes on
    env.close()


@pytest.mark.parametrize("word, match", [("boom", "EXECUTION_ERROR"), ("hang", "did not answer"),
                                         ("drop", "ended during 'step'")])
def test_a_server_failure_is_an_infrastructure_error_and_closes_the_session(fake, word, match):
    env = OpenEnvEnv(server=fake.base_url, timeout_s=0.5)
    env.reset(options={"task_id": "openenv/1"})
    with pytest.raises(OpenEnvError, match=match) as err:
        env.step(word)
    assert isinstance(err.value, InfraError) and err.value.base_url == fake.base_url
    _wait(lambda: fake.open_sessions == 0)
    with pytest.raises(EnvError):
        env.step("next")  # the episode is over; no score was given
    env.close()


def test_reset_failures_are_infrastructure_errors_and_leave_nothing_open():
    broken = FakeOpenEnv(schema_status=500)
    try:
        env = OpenEnvEnv(server=broken.base_url)
        with pytest.raises(OpenEnvError, match="schema answered 500"):
            env.reset(options={"task_id": "openenv/1"})
        assert broken.open_sessions == 0
    finally:
        broken.shutdown()
    env = OpenEnvEnv(server="http://127.0.0.1:9", timeout_s=1.0)
    with pytest.raises(InfraError):
        env.reset(options={"task_id": "openenv/1"})
    env.close()


def test_a_server_at_capacity_is_waited_for_then_an_infrastructure_error():
    single = FakeOpenEnv(max_sessions=1)
    try:
        first, second = OpenEnvEnv(server=single.base_url), OpenEnvEnv(server=single.base_url, session_wait_s=0.5)
        first.reset(options={"task_id": "openenv/1"})
        with pytest.raises(CapacityError, match="CAPACITY_REACHED.*session_wait_s"):
            second.reset(options={"task_id": "openenv/2"})
        # a wait that outlasts the first episode gets the session
        second.session_wait_s = 10.0
        threading.Timer(0.5, first.close).start()
        second.reset(options={"task_id": "openenv/2"})
        assert single.sessions_made == 2
        second.close()
    finally:
        single.shutdown()


def test_close_mid_episode_closes_the_session(fake):
    env = OpenEnvEnv(server=fake.base_url)
    env.reset(options={"task_id": "openenv/1"})
    env.step("one")
    env.close()
    env.close()
    _wait(lambda: fake.open_sessions == 0)
    with pytest.raises(EnvError):
        env.reset()


def test_tasks_and_arguments():
    assert OpenEnvEnv.task_ids("test")[:2] == ["openenv/1000000", "openenv/1000001"] and TASKS.prefix == "openenv"
    with pytest.raises(ConfigError, match="needs server"):
        OpenEnvEnv()
    for bad in ({"base_url": "ftp://x"}, {"command": "python serve.py"}, {"base_url": "http://a", "image": "i"},
                {"image": "i", "concurrent_sessions": "maybe"}, {"command": ["x"], "port": 1}, 5):
        with pytest.raises(ConfigError):
            OpenEnvEnv(server=bad)
    with pytest.raises(ConfigError, match="action_format"):
        OpenEnvEnv(server="http://a", action_format="xml")
    with pytest.raises(ConfigError, match="max_invalid_actions"):
        OpenEnvEnv(server="http://a", max_invalid_actions=0)
    spec = ServerSpec.parse({"image": "my-env:1", "memory_mb": 512})
    assert spec.kind == "docker" and spec.command[0] == "sh" and spec.memory_mb == 512
    assert ServerSpec.parse("http://h:1/").base_url == "http://h:1" and ServerSpec.parse("http://h:1").kind == "url"


def test_the_example_config_makes_an_env_without_starting_anything():
    cfg = load_config(Path(__file__).resolve().parents[3] / "examples" / "openenv_guess.yaml")
    env = OpenEnvEnv(**cfg.env.kwargs)
    assert env.server.kind == "process" and env.server.command[-1] == "16" and env.anchor_fields == ("low", "high")
    env.close()
