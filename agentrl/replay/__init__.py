"""Replay store: every episode (tokens, log-probs, rewards, sandbox events) and metric of a
training run, in SQLite (embedded default) or PostgreSQL, for the viewer and the CLI.

    store = ReplayStore("sqlite:///runs/replay.db")
    store.start_run("run-1", config)
    store.add_episodes("run-1", iteration, episodes, advantages)
    store.add_metrics("run-1", iteration, {"actor/pg_loss": 0.12})
    store.mark_complete("run-1", iteration + 1)   # once the checkpoint after it is written
    store.count_episodes("run-1", complete_only=True)
    store.finish_run("run-1", "finished")

A resume calls ``store.rewind(run_id, iterations_done)`` first (see ``ReplayStore``).
"""

from agentrl.replay.models import SCHEMA_VERSION
from agentrl.replay.store import EpisodeSummary, ReplayStore, RerunInfo, RunInfo, RunStatus

__all__ = ["SCHEMA_VERSION", "EpisodeSummary", "ReplayStore", "RerunInfo", "RunInfo", "RunStatus"]
