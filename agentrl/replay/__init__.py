"""Replay store: every episode (tokens, log-probs, rewards, sandbox events) and metric of a
training run, in SQLite (embedded default) or PostgreSQL, for the viewer and the CLI.

    store = ReplayStore("sqlite:///runs/replay.db")
    store.start_run("run-1", config)
    store.add_episodes("run-1", iteration, episodes, advantages)
    store.add_metrics("run-1", iteration, {"actor/pg_loss": 0.12})
    store.mark_complete("run-1", iteration + 1)   # once the checkpoint after it is written
    store.count_episodes("run-1", complete_only=True)
    store.finish_run("run-1", "finished")

A resume calls ``store.rewind(run_id, iterations_done)`` first (see ``ReplayStore``). Every
read is a function of ``agentrl.replay.read`` (``read.get_run(store.db, "run-1")``); the
viewer opens a database with ``read.ReadOnlyDB(url)``.
"""

from pathlib import Path

from agentrl.errors import ConfigError
from agentrl.replay.models import SCHEMA_VERSION
from agentrl.replay.read import EpisodeSummary, RerunInfo, RunInfo, RunStatus
from agentrl.replay.store import ReplayStore

__all__ = ["SCHEMA_VERSION", "EpisodeSummary", "ReplayStore", "RerunInfo", "RunInfo", "RunStatus",
           "open_replay_store"]


def open_replay_store(where: str | Path, *, read_only: bool = False) -> ReplayStore:
    """Open a replay store: a SQLAlchemy URL (``sqlite:///runs/x/replay.db``,
    ``postgresql+psycopg://...``) or a run directory (its ``replay.db``). ``agentrl.open_replay_store``
    is this function.

    Args:
        where: the URL, or the run directory (``str`` or ``Path``).
        read_only: open without writing (``ReplayStore``'s ``read_only``: the schema is
            checked, never created or upgraded).

    Returns:
        The ``ReplayStore``.

    Raises:
        ConfigError: ``where`` is neither a URL nor a run directory holding ``replay.db``,
            or the URL cannot be used (see ``ReplayStore``).
        InfraError: the database cannot be reached or opened.
        ContractError: the database's schema is newer than this agentrl (see ``ReplayStore``).
    """
    text = str(where)
    if "://" not in text:
        db = Path(text) / "replay.db"
        if not db.is_file():
            raise ConfigError(f"{text!r} is not a run directory with a replay.db (and not a database URL)")
        text = f"sqlite:///{db.resolve()}"
    return ReplayStore(text, read_only=read_only)
