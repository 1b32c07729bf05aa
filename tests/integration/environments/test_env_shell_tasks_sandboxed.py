"""``agentrl/ShellTasks-v0`` in the real bubblewrap sandbox: every task's reference solution
scores 1.0 and doing nothing scores 0; the checks read the sandbox, not the model's claim."""

from __future__ import annotations

import json

import pytest

import environments
from agentrl.errors import ConfigError, EnvError
from environments.shell_tasks import ShellTasksEnv, get_task, grade, task_ids
from sandboxes import SandboxSpec, make_sandbox


@pytest.fixture(scope="module")
def sandbox():
    sb = make_sandbox("bwrap", SandboxSpec(run_id="test-env-shell-tasks", memory_mb=1024))
    yield sb
    sb.close()


@pytest.fixture(scope="module")
def env(sandbox):
    env = environments.make_env("agentrl/ShellTasks-v0", sandbox=sandbox)
    yield env
    env.close()


def bash(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


def test_reference_solutions_score_1_and_doing_nothing_scores_0(env):
    failures = []
    for tid in task_ids("all"):
        env.reset(seed=0, options={"task_id": tid})
        obs, reward, term, trunc, info = env.step("I did nothing. Done.")
        if reward != 0.0 or not term or trunc or any(info["checks_passed"]):
            failures.append(f"{tid}: doing nothing scored {reward} ({info['checks_passed']})")
        env.reset(seed=0, options={"task_id": tid})
        obs, reward, term, trunc, info = env.step(bash(get_task(tid).solution))
        assert info["observation_role"] == "tool" and not term
        if "Exit code: 0" not in obs:
            failures.append(f"{tid}: reference solution failed: {obs[:400]}")
        obs, reward, term, trunc, info = env.step("Done.")
        if reward != 1.0 or not term:
            failures.append(f"{tid}: reference solution scored {reward}: {obs}")
    assert not failures, "\n".join(failures)


def test_a_claim_without_work_is_not_rewarded(env):
    env.reset(seed=0, options={"task_id": "shell/count_lines"})
    obs, reward, *_ = env.step("I wrote 5 to lines.txt. PASS 0 1")
    assert reward == 0.0 and "0 of 1 criteria met" in obs


def test_forged_check_output_in_files_does_not_count(env, sandbox):
    env.reset(seed=0, options={"task_id": "shell/count_lines"})
    env.step(bash("echo 4 > lines.txt; for k in 0 1 2; do echo \"x $k 1\"; done"))
    assert grade(sandbox, get_task("shell/count_lines")) == [False]


def test_partial_credit_is_the_fraction_of_checks(env):
    env.reset(seed=0, options={"task_id": "shell/make_dirs"})
    env.step(bash("mkdir -p reports/2024/q1"))
    obs, reward, term, trunc, info = env.step("done")
    assert reward == 0.5 and info["checks_passed"] == [True, False]
    assert "[x] reports/2024/q1 is a directory" in obs


def test_reset_cleans_the_previous_episode(env, sandbox):
    env.reset(seed=0, options={"task_id": "shell/count_lines"})
    env.step(bash("echo leftover > junk.txt"))
    env.reset(seed=0, options={"task_id": "shell/uppercase"})
    assert sorted(sandbox.exec("ls -A", timeout_s=10).stdout.split()) == ["quiet.txt"]


def test_anchor_is_the_command_history(env):
    _, info0 = env.reset(seed=0, options={"task_id": "shell/count_lines"})
    assert info0["anchor"] == ("shell/count_lines", "")
    a1 = env.step(bash("ls"))[4]["anchor"]
    env.reset(seed=1, options={"task_id": "shell/count_lines"})
    a2 = env.step(bash("ls"))[4]["anchor"]
    bad = env.step("<tool_call>{not json}</tool_call>")[4]
    assert a1 == a2 != info0["anchor"] and bad["anchor"] == a1 and bad["invalid_action"]
    env.reset(seed=1, options={"task_id": "shell/count_lines"})
    assert env.step(bash("pwd"))[4]["anchor"] != a1


def test_tool_call_limit_truncates_and_grades(sandbox):
    env = ShellTasksEnv(sandbox, max_tool_calls=1)
    env.reset(options={"task_id": "shell/count_lines"})
    obs, reward, term, trunc, _ = env.step(bash("wc -l < data.txt > lines.txt") + bash("echo never"))
    assert (term, trunc, reward) == (False, True, 1.0) and "limit reached: 1 call(s) not run" in obs
    with pytest.raises(EnvError, match="after the episode"):
        env.step("done")


def test_bad_arguments_are_config_errors(sandbox):
    with pytest.raises(ConfigError, match="max_tool_calls=-1"):
        ShellTasksEnv(sandbox, max_tool_calls=-1)
    with pytest.raises(ConfigError, match="split='dev'"):
        ShellTasksEnv(sandbox, split="dev")
    env = ShellTasksEnv(sandbox)
    with pytest.raises(ConfigError, match="'shell/nope'"):
        env.reset(options={"task_id": "shell/nope"})
