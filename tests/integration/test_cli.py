"""The `agentrl` command line: user mistakes end with one clear line and exit 2, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _agentrl(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, COLUMNS="200", TERM="dumb")  # help text unwrapped, whatever the caller's terminal
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.mark.parametrize("args, needle", [
    (["train", "run.iteratons=3"], "unknown key 'run.iteratons'"),
    (["train", "examples/humaneval.yaml", "trainer.lr=-1"], "trainer.lr=-1"),
    (["train", "no/such/file.yaml"], "does not exist"),
    (["train", "env.id=agentrl/NoSuchEnv-v0", "run.dir=/tmp/agentrl-cli-test-noenv"], "env.id='agentrl/NoSuchEnv-v0'"),
    (["train", "--resume", "/tmp/agentrl-no-such-run"], "not a run directory"),
    (["models", "prepare", "no-such-model"], "no-such-model"),
])
def test_user_mistakes_are_one_clear_line(args, needle):
    r = _agentrl(*args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr
    assert "Traceback" not in r.stderr + r.stdout


def test_help_explains_every_option():
    r = _agentrl("train", "--help")
    assert r.returncode == 0
    for opt in ("--resume", "--address", "--debug", "overrides"):
        assert opt in r.stdout.lower()


def test_envs_list_shows_humaneval():
    r = _agentrl("envs", "list")
    assert r.returncode == 0 and "agentrl/HumanEval-v0" in r.stdout


def test_envs_check_passes_a_builtin_and_names_the_problem_of_a_broken_one():
    ok = _agentrl("envs", "check", "agentrl/Sokoban-v0")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    missing = _agentrl("envs", "check", "agentrl/NoSuchEnv-v0")
    assert missing.returncode != 0 and "NoSuchEnv" in (missing.stdout + missing.stderr)
