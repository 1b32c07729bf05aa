"""The read methods of ``ReplayStore``: each delegates to one function of
``agentrl.replay.read`` on the store's database (``ReplayStore.db``) and, where that
function gives ``None`` for an unknown run or episode, raises ``ContractError`` instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from agentrl.errors import ContractError
from agentrl.replay import read
from agentrl.replay.read import EpisodeSummary, ReplayDB, RerunInfo, RunInfo
from agentrl.types import Episode

__all__ = ["StoreReads"]


class StoreReads:
    """Read methods over ``_db`` (the database) that name ``_url_text`` (the URL, password
    hidden) in their errors; ``ReplayStore`` sets both."""

    _db: ReplayDB
    _url_text: str

    def get_run(self, run_id: str) -> RunInfo:
        """The run with its headline numbers (``agentrl.replay.read.get_run``).

        Raises:
            ContractError: unknown ``run_id``.
        """
        found = read.get_run(self._db, run_id)
        if found is None:
            raise ContractError(f"run_id={run_id!r} is not in {self._url_text}; call start_run first")
        return found

    def runs(self) -> list[RunInfo]:
        """Every run, newest first (``agentrl.replay.read.list_runs``)."""
        return read.list_runs(self._db)

    def completed_iterations(self, run_id: str) -> list[int]:
        """The run's iterations marked complete, ascending (``[1, 2, ...]`` for a training
        run; ``agentrl.replay.read.completed_iterations``)."""
        return read.completed_iterations(self._db, run_id)

    def get_episode(self, episode_id: str) -> Episode:
        """The stored episode, equal to what was added (``agentrl.replay.read.get_episode``).

        Raises:
            ContractError: unknown ``episode_id``.
        """
        return self._known(read.get_episode(self._db, episode_id), episode_id)

    def get_advantages(self, episode_id: str) -> list[float | None]:
        """Per-turn advantages as stored (``None`` where none was given), ``[num_turns]``.

        Raises:
            ContractError: unknown ``episode_id``.
        """
        return self._known(read.advantages(self._db, episode_id), episode_id)

    def get_trainer_values(self, episode_id: str) -> list[tuple[list[float] | None, list[float] | None]]:
        """Per turn ``(trainer_log_probs [C] or None, entropies [C] or None)`` as stored
        (``agentrl.replay.read.trainer_values``).

        Raises:
            ContractError: unknown ``episode_id``.
        """
        return self._known(read.trainer_values(self._db, episode_id), episode_id)

    def judge_cache_get(self, keys: Sequence[str]) -> dict[str, str]:
        """``{key: output}``: the judge's cached raw answers for those of ``keys`` (hex sha256,
        ``judge_cache_put``) that the cache holds, in one read transaction
        (``agentrl.replay.read.judge_cache``)."""
        return read.judge_cache(self._db, keys)

    def reruns(self, episode_id: str) -> list[RerunInfo]:
        """The reruns of an episode, newest first (``[]`` for none or an unknown episode;
        ``agentrl.replay.read.reruns``)."""
        return read.reruns(self._db, episode_id)

    def list_episodes(
        self, run_id: str, iteration: int | None = None, limit: int = 100, offset: int = 0,
        *, complete_only: bool = False, kind: str | None = None,
    ) -> list[EpisodeSummary]:
        """Summaries of a run's episodes in insertion order (``agentrl.replay.read.list_episodes``).

        Raises:
            ContractError: ``limit < 0`` or ``offset < 0``, or an unknown ``kind``.
        """
        return read.list_episodes(self._db, run_id, iteration, limit, offset,
                                  complete_only=complete_only, kind=kind)

    def count_episodes(self, run_id: str, iteration: int | None = None, *, complete_only: bool = False,
                       kind: str | None = None) -> int:
        """Number of stored episodes of a run (``agentrl.replay.read.count_episodes``)."""
        return read.count_episodes(self._db, run_id, iteration, complete_only=complete_only, kind=kind)

    def iterations(self, run_id: str, *, complete_only: bool = False) -> list[int]:
        """Sorted iterations with episodes or metrics (``agentrl.replay.read.iterations``)."""
        return read.iterations(self._db, run_id, complete_only=complete_only)

    def metrics(self, run_id: str, *, complete_only: bool = False) -> dict[int, dict[str, float]]:
        """``{iteration: {key: value}}`` of a run, NULL read as ``nan``
        (``agentrl.replay.read.metrics``)."""
        return read.metrics(self._db, run_id, complete_only=complete_only)

    def _known(self, found: Any, episode_id: str) -> Any:
        if found is None:
            raise ContractError(f"episode_id={episode_id!r} is not in {self._url_text}")
        return found
