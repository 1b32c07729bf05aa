"""Made ``replay_rev7.db`` with the replay store of revision 0007 (commit c110554, when the
store numbered iterations from 0): a training run with two iterations (the first marked
complete) and an ``agentrl eval`` run (its rows at iteration 0), for the test of revision
0008, which numbers iterations from 1.

    git archive c110554 agentrl | tar -x -C /tmp/rev7   # the store of revision 0007
    PYTHONPATH=/tmp/rev7 python tests/integration/replay/data/make_rev7_db.py OUT.db

Kept for the record: run with today's store it would make a database at the head revision.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.append(str(Path(__file__).resolve().parents[4]))  # for `tests`; agentrl from PYTHONPATH first

from tests.integration.replay.episode_factory import build_episode  # noqa: E402

RUN, EVAL_RUN = "run-rev7", "eval-rev7"


def expected_rev7_episodes() -> dict[int, list]:
    """``{0-based iteration: [episodes]}`` of ``RUN`` as written into the file."""
    return {it: [build_episode(2 * it + i, episode_id=f"{RUN}/it{it}/g{it}/{i}/a0") for i in range(2)]
            for it in range(2)}


EVAL_EPISODES = [build_episode(7, episode_id=f"{EVAL_RUN}/it0/e0/0/a0")]
METRICS = {0: {"iteration": 1.0, "rollout/reward_mean": 0.5}, 1: {"iteration": 2.0, "rollout/reward_mean": 0.75}}


def main(out: str) -> None:
    from agentrl.replay import ReplayStore

    with ReplayStore(f"sqlite:///{out}") as store:
        store.start_run(RUN, {"env": {"id": "agentrl/Bash-v0"}, "run": {"iterations": 2}})
        for it, eps in expected_rev7_episodes().items():
            store.add_episodes(RUN, it, eps, kind="train")
            store.add_metrics(RUN, it, METRICS[it])
        store.add_episodes(RUN, 0, [build_episode(9, episode_id=f"{RUN}/eval/it0/x/0/a0")], kind="eval")
        store.mark_complete(RUN, 1)
        store.start_run(EVAL_RUN, {"kind": "eval", "target": "m", "config": {"env": {"id": "agentrl/Bash-v0"}}})
        store.add_episodes(EVAL_RUN, 0, EVAL_EPISODES, kind="eval")
        store.add_metrics(EVAL_RUN, 0, {"eval/pass@1": 1.0})
        store.mark_complete(EVAL_RUN, 1)


if __name__ == "__main__":
    main(sys.argv[1])
