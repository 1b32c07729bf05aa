"""Made ``replay_schema5.db`` with the replay store of schema_version 5 (commit 39f755d,
before Alembic): a run with two iterations (the first marked complete), metrics, and
episodes with several turns, sandbox events and a turn that spans a weight update.

    git archive 39f755d agentrl | tar -x -C /tmp/schema5   # the store of schema 5
    PYTHONPATH=/tmp/schema5 python tests/integration/replay/data/make_schema5_db.py OUT.db

Kept for the record: run with today's store it would make a database at Alembic's head, not a
schema-5 one. ``test_replay_migrations.py`` opens the committed file and compares it with
``expected_schema5_episodes()``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[4]))  # for `tests`; agentrl from PYTHONPATH first

from tests.integration.replay.episode_factory import build_episode  # noqa: E402


def expected_schema5_episodes() -> dict[int, list]:
    """``{iteration: [episodes]}`` as written into the file."""
    eps0 = [build_episode(i, episode_id=f"run-schema5/it0/g{i // 2}/{i % 2}/a0") for i in range(4)]
    spanning = build_episode(4, episode_id="spans-update")
    t = spanning.turns[1]
    t.policy_versions = [t.policy_version] * 5 + [t.policy_version + 1] * (len(t.completion_ids) - 5)
    return {0: eps0, 1: [spanning, build_episode(5, num_turns=1, events_per_turn=0, episode_id="one-turn")]}


ADVANTAGES = {0: {"0": [0.5, -0.25, 1.0]}}  # iteration 0, episode index 0's per-turn advantages
METRICS = {0: {"reward/mean": 0.5, "actor/pg_loss": -0.125}, 1: {"reward/mean": 0.25}}


def main(out: str) -> None:
    from agentrl.replay import ReplayStore

    with ReplayStore(f"sqlite:///{out}") as store:
        store.start_run("run-schema5", {"env": "agentrl/Bash-v0", "iterations": 2})
        for it, eps in expected_schema5_episodes().items():
            adv = {eps[int(k)].episode_id: v for k, v in ADVANTAGES.get(it, {}).items()}
            store.add_episodes("run-schema5", it, eps, adv)
            store.add_metrics("run-schema5", it, METRICS[it])
        store.mark_complete("run-schema5", 1)


if __name__ == "__main__":
    main(sys.argv[1])
