"""Replay store: every episode (tokens, log-probs, rewards, sandbox events) and metric of a
training run, in SQLite (embedded default) or PostgreSQL, for the viewer and the CLI.

    store = ReplayStore("sqlite:///runs/replay.db")
    store.start_run("run-1", config)
    store.add_episodes("run-1", iteration, episodes, advantages)
    store.add_metrics("run-1", iteration, {"losses/policy": 0.12})
    store.finish_run("run-1", "finished")
"""

from agentrl.replay.models import SCHEMA_VERSION
from agentrl.replay.store import EpisodeSummary, ReplayStore, RunInfo, RunStatus

__all__ = ["SCHEMA_VERSION", "EpisodeSummary", "ReplayStore", "RunInfo", "RunStatus"]
