"""The generated tasks of ``agentrl/ShellLookup-v1``: ids, disjoint fixed splits, one task per
seed (the same every time), every family in both splits, answers that differ by seed (no
sandbox here; the solutions and checks run in tests/integration/environments)."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError
from environments.shell_lookup import FAMILIES, LOOKUP, ShellLookupEnv, lookup_task

CATEGORIES = {"note", "todo", "request", "memo", "readme", "value"}


def test_splits_are_disjoint_ranges_of_seeds():
    train, test = ShellLookupEnv.task_ids("train"), ShellLookupEnv.task_ids("test")
    assert len(train) == 1000 and len(test) == 48 and not set(train) & set(test)
    assert train[0] == "lookup/0" and test[0] == "lookup/1000"
    assert ShellLookupEnv.split_of("lookup/5") == "train" and ShellLookupEnv.split_of("lookup/1001") == "test"
    with pytest.raises(ConfigError, match="'lookup/x'"):
        lookup_task("lookup/x")
    with pytest.raises(ConfigError, match="split='dev'"):
        ShellLookupEnv.task_ids("dev")


def test_a_seed_is_always_the_same_task_and_families_rotate():
    assert lookup_task("lookup/7") == lookup_task("lookup/7")
    for split in ("train", "test"):
        ids = LOOKUP.task_ids(split)[: 2 * len(FAMILIES)]
        assert {lookup_task(t).category for t in ids} == CATEGORIES
    for t in LOOKUP.task_ids("test"):
        task = lookup_task(t)
        assert task.task_id == t and task.prompt and task.files and len(task.checks) == 1 and task.solution.strip()
        (path,) = [f for f in task.files if f != "data.txt"]  # the one file to read, named with its command
        assert task.prompt.startswith(f"Read `{path}` with `cat {path}`, then ")


def test_answers_depend_on_the_seed():
    """Tasks of one family differ in what they ask or hold: the answer must be looked up."""
    for k in range(len(FAMILIES)):
        seen = {(lookup_task(f"lookup/{k + len(FAMILIES) * j}").checks,
                 tuple(sorted(lookup_task(f"lookup/{k + len(FAMILIES) * j}").files.items()))) for j in range(8)}
        assert len(seen) >= 6, f"family {k}: only {len(seen)} different tasks in 8 seeds"
