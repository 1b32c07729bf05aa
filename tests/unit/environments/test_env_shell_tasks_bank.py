"""The task bank of ``agentrl/ShellTasks-v0``: size, ids, fixed splits (no sandbox here;
the solutions and checks run in tests/integration/environments)."""

from __future__ import annotations

import zlib

import pytest

from agentrl.errors import ConfigError
from environments.shell_task_bank import TASKS, same
from environments.shell_tasks import ShellTasksEnv, bash_tool_schema, get_task, task_ids


def test_at_least_40_tasks_with_unique_ids_checks_and_solutions():
    assert len(TASKS) >= 40
    assert len({t.task_id for t in TASKS}) == len(TASKS)
    for t in TASKS:
        assert t.task_id.startswith("shell/") and t.prompt and t.checks and t.solution.strip()
        assert t.category in {"files", "text", "programs"}
    assert {t.category for t in TASKS} == {"files", "text", "programs"}


def test_splits_are_fixed_by_task_id_and_partition_all():
    train, test, every = task_ids("train"), task_ids("test"), task_ids("all")
    assert sorted(train + test) == sorted(every) and not set(train) & set(test)
    assert test == [t for t in every if zlib.crc32(t.encode()) % 5 == 0]
    assert 5 <= len(test) <= 15
    assert ShellTasksEnv.task_ids("test") == test
    with pytest.raises(ConfigError, match="split='val'"):
        task_ids("val")
    with pytest.raises(ConfigError, match="'shell/missing'"):
        get_task("shell/missing")


def test_same_quotes_paths_and_contents():
    cmd = same("a b.txt", "it's $HOME\n")
    assert "'a b.txt'" in cmd and "$HOME" not in cmd


def test_bash_tool_schema_requires_a_command():
    fn = bash_tool_schema()["function"]
    assert fn["name"] == "bash" and fn["parameters"]["required"] == ["command"]
