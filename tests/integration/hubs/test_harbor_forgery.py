"""``hub/Harbor-v0``: what the policy's own commands do to the verifier, against real containers
(the ``hello-file`` task of tests/helpers/harbor_tasks, whose test.sh writes 0 unless
``/app/greeting.txt`` holds the greeting). None of them forges a reward of 1 for a task that was
not done, and none makes the episode an infrastructure error: the agent's processes are killed
before the verifier (a writer that scrubbed its environment, which the per-exec clean-up cannot
find, included), ``/logs/verifier`` is made again (a symlink or a read-only directory in its
place is removed), and ``/tests`` is emptied whatever its modes. The oracle still scores 1."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.hubs.harbor import ORACLE_ACTION, HarborEnv

pytestmark = pytest.mark.docker

TASKS = Path(__file__).resolve().parents[2] / "helpers" / "harbor_tasks"

ATTACKS = {
    # /logs/verifier a symlink to a folder holding a read-only reward.txt of 1
    "symlinked-verifier-dir": "mkdir -p /tmp/v && echo 1 > /tmp/v/reward.txt && chmod 444 /tmp/v/reward.txt && "
                              "rm -rf /logs/verifier && ln -s /tmp/v /logs/verifier && echo ok",
    # a background writer with a scrubbed environment (no exec marker) writing 1 in a loop
    "env-i-writer": "env -i /bin/bash -c 'while :; do echo 1 > /logs/verifier/reward.txt 2>/dev/null; "
                    "sleep 0.01; done' >/dev/null 2>&1 & echo ok",
    # the same, started in a session of its own, waiting for the verifier to start first
    "setsid-delayed-writer": "setsid env -i /bin/sh -c 'sleep 1; while :; do echo 1 > "
                             "/logs/verifier/reward.txt; done' >/dev/null 2>&1 < /dev/null & echo ok",
    # a read-only reward.txt of 1 in a read-only /logs/verifier, and a read-only /tests
    "read-only-dirs": "echo 1 > /logs/verifier/reward.txt && chmod 444 /logs/verifier/reward.txt && "
                      "chmod 555 /logs/verifier && mkdir /tests/x && chmod 000 /tests/x && chmod 555 /tests && "
                      "echo ok",
}


@pytest.fixture(autouse=True)
def _images(harbor_images):
    """The hubs conftest's image clean-up for this module."""


@pytest.fixture
def run_id(harbor_run_id):
    return harbor_run_id


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_the_policys_commands_do_not_forge_a_reward_of_1(attack, run_id):
    env = HarborEnv(path=str(TASKS), run_id=run_id)
    try:
        env.reset(options={"task_id": "hello-file"})
        obs, *_ = env.step(f"```bash\n{ATTACKS[attack]}\n```")
        assert "stdout:\nok" in obs, obs
        _, reward, terminated, _, info = env.step("Done.")  # the task (greeting.txt) was never done
        assert (reward, terminated, info["success"]) == (0.0, True, False), (reward, info)
    finally:
        env.close()


def test_the_oracle_still_scores_1_in_a_container_where_a_writer_of_0_was_left(run_id):
    env = HarborEnv(path=str(TASKS), run_id=run_id)
    try:
        env.reset(options={"task_id": "hello-file"})
        writer = ATTACKS["env-i-writer"].replace("echo 1", "echo 0")  # scores 0 unless it is killed
        env.step(f"```bash\n{ATTACKS['symlinked-verifier-dir']} && {writer}\n```")
        _, reward, terminated, _, info = env.step(ORACLE_ACTION)
        assert (reward, terminated, info["success"]) == (1.0, True, True)
    finally:
        env.close()
