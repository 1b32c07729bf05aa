"""``agentrl/ShellLookup-v1`` in the real bubblewrap sandbox: each family's reference
solution scores 1.0, doing nothing and a wrong answer score 0 (the checks are exact and read
the sandbox), and a look-up followed by acting on its output solves a task over three turns."""

from __future__ import annotations

import json
import re

import pytest

import environments
from environments.shell_lookup import lookup_task
from sandboxes import SandboxSpec, make_sandbox


@pytest.fixture(scope="module")
def env():
    sb = make_sandbox("bwrap", SandboxSpec(run_id="test-env-shell-lookup", memory_mb=1024))
    env = environments.make_env("agentrl/ShellLookup-v1", sandbox=sb)
    yield env
    env.close()
    sb.close()


def bash(command: str) -> str:
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


@pytest.mark.parametrize("seed", [0, 1, 2, 1003, 1004, 1005])  # every family (seed % 6), both splits
def test_solution_scores_1_nothing_and_a_wrong_answer_score_0(env, seed):
    tid = f"lookup/{seed}"
    env.reset(seed=0, options={"task_id": tid})
    assert env.step("Done.")[1] == 0.0
    env.reset(seed=0, options={"task_id": tid})
    env.step(bash("echo wrong > answer.txt; mkdir wrong; mv data.txt wrong.txt 2>/dev/null; true"))
    assert env.step("Done.")[1] == 0.0
    env.reset(seed=0, options={"task_id": tid})
    obs, reward, term, *_ = env.step(bash(lookup_task(tid).solution))
    assert "Exit code: 0" in obs and not term
    obs, reward, term, trunc, info = env.step("Done.")
    assert reward == 1.0 and term and not trunc and info["success"], obs


def test_reading_then_acting_solves_a_value_task(env):
    _, info = env.reset(seed=0, options={"task_id": "lookup/5"})  # family value: settings.ini
    assert info["split"] == "train"
    # the worked example: read, act, say done, as chat turns rendered like an episode's
    examples = info["example_messages"]
    assert [m["role"] for m in examples] == ["user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert examples[2]["content"].startswith("Result (bash):\nExit code: 0\nstdout:\ntouch ready.txt")
    obs, _, _, _, step_info = env.step(bash("cat settings.ini"))
    # what a full-history prompt shows (the tool messages) is the observation, calls left included
    assert "\n\n".join(step_info["tool_outputs"]) == obs and obs.endswith("(Tool calls left: 3.)")
    key = re.search(r"the value of `(\w+)`", lookup_task("lookup/5").prompt).group(1)
    value = next(line.split("=")[1] for line in obs.splitlines() if line.startswith(f"{key}="))
    obs, reward, term, *_ = env.step(bash(f"echo {value} > answer.txt"))
    assert reward == 0.0 and not term
    assert env.step(f"Done: answer.txt holds the {key}.")[1] == 1.0
