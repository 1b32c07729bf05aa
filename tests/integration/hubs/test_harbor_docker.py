"""``hub/Harbor-v0`` against real containers: the task folders of tests/helpers/harbor_tasks,
their Dockerfiles built by the Docker sandbox backend from the local folder (``FROM
agentrl-base:latest``, which scripts/test.sh builds; nothing is pulled), run by the env. The
oracle scores 1 through the env checker (what ``agentrl envs check`` runs), an agent that does
nothing scores 0, a bash agent that does the task scores 1, a test.sh that hangs is an
infrastructure error within its verifier timeout, the task's network policy is the
container's, and a ``FROM`` image the daemon lacks is an infrastructure error naming it.
Nothing is left running after an episode."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from agentrl.errors import InfraError
from agentrl.hubs.harbor import ENV_ID, ORACLE_ACTION, HarborEnv
from agentrl.hubs.harbor_task import HarborError
from environments.checker import check_env
from tests.helpers.sandbox_checks import containers_with_label, procs_with_cmdline

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"


@pytest.fixture(autouse=True)
def _images(harbor_images):
    """The hubs conftest's image clean-up for this module."""


@pytest.fixture
def run_id(harbor_run_id):
    return harbor_run_id


def _env(run_id: str, **kwargs) -> HarborEnv:
    return HarborEnv(path=str(TASKS), run_id=run_id, **kwargs)


def test_the_oracle_scores_1_through_the_env_checker(run_id):
    report = check_env(ENV_ID, env_kwargs={"path": str(TASKS), "run_id": run_id}, task_id="hello-file")
    report.raise_if_failed()
    assert report.checks_passed == ["task_ids", "make", "reset", "step", "done", "determinism", "independence",
                                    "close"]


def test_an_empty_agent_scores_0_and_a_bash_agent_that_does_the_task_1(run_id):
    env = _env(run_id)
    try:
        obs, info = env.reset(options={"task_id": "hello-file"})
        assert info["workdir"] == "/app" and info["network"] == "none"
        _, reward, terminated, truncated, info = env.step("Nothing to do.")
        assert (reward, terminated, truncated, info["success"]) == (0.0, True, False, False)
        assert env.task_sandbox is None and containers_with_label(run_id) == []  # gone with its verifier

        env.reset(options={"task_id": "hello-file"})
        obs, *_ = env.step("```bash\ncat name.txt && pwd && touch /etc/nope\n```")  # the image's files, kept
        assert "stdout:\nharbor\n/app" in obs and "Permission denied" in obs
        obs, reward, *_ = env.step('<tool_call>{"name": "bash", "arguments": {"command": '
                                   '"echo \\"hello $(cat name.txt)\\" > greeting.txt && cat greeting.txt"}}</tool_call>')
        assert "hello harbor" in obs and reward == 0.0
        _, reward, terminated, _, info = env.step("Done.")
        assert (reward, terminated, info["success"], info["rewards"]) == (1.0, True, True, {"reward": 1.0})
    finally:
        env.close()


def test_a_hanging_test_sh_is_an_infrastructure_error_within_the_verifier_timeout(run_id):
    env = _env(run_id)
    try:
        env.reset(options={"task_id": "hanging-verifier"})
        t0 = time.monotonic()
        with pytest.raises(HarborError, match=r"ran past the verifier timeout \(2 s\)") as info:
            env.step("I am done.")
        assert time.monotonic() - t0 < 20 and isinstance(info.value, InfraError)
        assert procs_with_cmdline("sleep 600") == [] and env.task_sandbox is None
    finally:
        env.close()


def test_the_tasks_network_policy_is_the_containers(run_id):
    env = _env(run_id)
    try:
        env.reset(options={"task_id": "hello-file"})  # network_mode = "no-network"
        assert env.task_sandbox.spec.network == "none"
        assert env.task_sandbox.exec("ls /sys/class/net").stdout.split() == ["lo"]
        env.reset(options={"task_id": "public-network"})  # network_mode = "public": Docker's bridge
        assert env.task_sandbox.spec.network == "bridge"
        assert "eth0" in env.task_sandbox.exec("ls /sys/class/net").stdout.split()
        _, reward, *_ = env.step(ORACLE_ACTION)  # reward.json
        assert reward == 1.0
    finally:
        env.close()
    env = _env(run_id, network="none")
    try:
        env.reset(options={"task_id": "public-network"})
        assert env.task_sandbox.exec("ls /sys/class/net").stdout.split() == ["lo"]
    finally:
        env.close()


def test_a_from_image_the_daemon_lacks_is_an_infrastructure_error(tmp_path, run_id):
    task = tmp_path / "no-base"
    shutil.copytree(TASKS / "hello-file", task)
    (task / "environment" / "Dockerfile").write_text("FROM agentrl-no-such-base:v0\nWORKDIR /app\n")
    env = HarborEnv(path=str(task), run_id=run_id)
    try:
        with pytest.raises(HarborError, match="agentrl-no-such-base:v0.*not a local image"):
            env.reset(options={"task_id": "no-base"})
    finally:
        env.close()
