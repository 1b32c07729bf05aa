"""What the procedurally generated environments share: tasks named ``<prefix>/<seed>`` with
train / test seed ranges, and actions read from the last ``<tag>...</tag>`` of a reply.

Used by ``agentrl/Sokoban-v0`` (``sokoban/<seed>``), ``agentrl/TextWorld-v0``
(``textworld/<seed>``) and ``agentrl/GuessNumber-v0`` (``guess/<seed>``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from agentrl.errors import ConfigError

__all__ = ["SPLITS", "SeededTasks", "last_tag_content"]

SPLITS = ("train", "test", "all")


@dataclass(frozen=True)
class SeededTasks:
    """Task ids ``<prefix>/<seed>`` over a train and a disjoint test range of seeds.

    A seed is written in canonical ASCII decimal (``0`` or no leading zero), so each game
    has exactly one task id: ``sokoban/03`` or ``sokoban/٣`` is not a task.

    Attributes:
        prefix: e.g. ``"sokoban"``.
        env_name: for messages, e.g. ``"Sokoban"``.
        train, test: the seed ranges of the splits (``all`` is both).
    """

    prefix: str
    env_name: str
    train: range
    test: range

    def seeds(self, split: str) -> list[int]:
        """The seeds of ``split``. Raises ConfigError for an unknown split."""
        if split == "train":
            return list(self.train)
        if split == "test":
            return list(self.test)
        if split == "all":
            return list(self.train) + list(self.test)
        raise ConfigError(f"split={split!r} is not one of {SPLITS}")

    def task_ids(self, split: str = "train") -> list[str]:
        """``<prefix>/<seed>`` for the seeds of ``split``. Raises ConfigError for an unknown split."""
        return [f"{self.prefix}/{s}" for s in self.seeds(split)]

    def seed_of(self, task_id: object) -> int:
        """The seed of ``task_id`` (any non-negative seed, not only the splits' ranges).

        Raises:
            ConfigError: not ``<prefix>/<seed>`` with a canonical ASCII decimal seed.
        """
        m = re.fullmatch(rf"{re.escape(self.prefix)}/(0|[1-9][0-9]*)", task_id, re.ASCII) if isinstance(task_id, str) else None
        if m is None:
            raise ConfigError(f"task_id={task_id!r} is not a {self.env_name} task; expected "
                              f"'{self.prefix}/<seed>' with a decimal seed, e.g. '{self.prefix}/0'")
        return int(m.group(1))

    def task_for_reset(self, task_id: object, rng: Any, seeds: Sequence[int]) -> str:
        """The task of a ``reset``: ``task_id`` (what ``TextEnv._start_reset`` parsed from
        the options; validated here), else, when it is None, one drawn with ``rng`` (the
        env's ``np_random``) from ``seeds``.

        Raises:
            ConfigError: a malformed task id.
        """
        if task_id is None:
            return f"{self.prefix}/{seeds[int(rng.integers(len(seeds)))]}"
        self.seed_of(task_id)
        return task_id

    def split_of(self, task_id: str) -> str | None:
        """``"train"``, ``"test"`` or None (a seed outside both ranges)."""
        s = self.seed_of(task_id)
        return "train" if s in self.train else "test" if s in self.test else None


def last_tag_content(text: str, tag: str) -> str | None:
    """The text inside the last ``<tag>...</tag>`` of ``text`` (tag names case-insensitive),
    or None when there is no complete pair. Linear in ``len(text)``: a reply of 100,000
    opening tags costs no more than one of 100,000 other characters.
    """
    low = text.lower()
    close = f"</{tag.lower()}>"
    opening = f"<{tag.lower()}>"
    end = low.rfind(close)
    if end < 0:
        return None
    start = low.rfind(opening, 0, end)
    if start < 0:
        return None
    return text[start + len(opening):end]
