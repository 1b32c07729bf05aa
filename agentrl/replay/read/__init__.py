"""The read side of the replay database: every query of the store, the viewer, ``agentrl
diagnose`` and ``agentrl replay rerun``, once, as functions of a ``ReplayDB``.

    db = ReadOnlyDB("sqlite:///runs/x/replay.db")      # or a postgresql+psycopg:// URL
    run = get_run(db, "run-1")                           # RunInfo | None
    completed_iterations(db, "run-1")                    # sorted list[int]
    episode = get_episode(db, episode_id)                # Episode | None
    page = episode_page(db, "run-1", EpisodeFilter(success=False), Sort("reward", desc=True))

A ``ReplayStore`` reads through the same functions on its own engine (``ReplayStore.db``); its
read methods raise ``ContractError`` for an unknown id where the functions here give ``None``.

Modules: ``db`` (engines, ``ReplayDB``, ``ReadOnlyDB``), ``runs`` (``RunInfo``, metrics),
``episodes`` (``Episode``, ``EpisodeSummary``, trainer values, ``RerunInfo``), ``judge`` (an
episode's judgement row, a run's judge score against its rule reward per iteration, the judge
cache), ``listing`` (the viewer's filtered keyset pages),
``query_plans`` (which index a filtered page reads), ``search`` (full-text search of the
turns' actions and observations), ``views`` (the viewer's episode, token, group and diff pages).

Every function is one read transaction (one snapshot) on its own connection, so reading works
while a training run writes the same database (SQLite WAL; PostgreSQL MVCC).
"""

from agentrl.replay.read.db import MIN_SCHEMA_VERSION, ReadOnlyDB, ReplayDB, open_engine
from agentrl.replay.read.episodes import (
    EpisodeSummary,
    RerunInfo,
    advantages,
    count_episodes,
    get_episode,
    get_episode_summary,
    list_episodes,
    reruns,
    trainer_values,
)
from agentrl.replay.read.judge import JudgeIteration, judge_cache, judge_iterations, judgement_of
from agentrl.replay.read.listing import SORTS, EpisodeFilter, Page, Sort, episode_page
from agentrl.replay.read.runs import (
    RunInfo,
    RunStatus,
    completed_iterations,
    get_run,
    iterations,
    list_runs,
    metric_series,
    metrics,
    model_path,
    model_paths,
)
from agentrl.replay.read.views import (
    TOKEN_FIELDS,
    TOKEN_PAGE_SIZE,
    EpisodeView,
    GroupView,
    TokenPage,
    TurnView,
    align_turns,
    common_tasks,
    episode_view,
    first_episode,
    get_group,
    token_page,
)

__all__ = [
    "MIN_SCHEMA_VERSION", "SORTS", "TOKEN_FIELDS", "TOKEN_PAGE_SIZE", "EpisodeFilter", "EpisodeSummary",
    "EpisodeView", "GroupView", "JudgeIteration", "Page", "ReadOnlyDB", "ReplayDB", "RerunInfo", "RunInfo", "RunStatus", "Sort",
    "TokenPage", "TurnView", "advantages", "align_turns", "common_tasks", "completed_iterations",
    "count_episodes", "episode_page", "episode_view", "first_episode", "get_episode", "get_episode_summary", "get_group", "get_run",
    "iterations", "judge_cache", "judge_iterations", "judgement_of", "list_episodes", "list_runs", "metric_series", "metrics", "model_path", "model_paths",
    "open_engine", "reruns", "token_page", "trainer_values",
]
