"""``agentrl replay rerun`` on episodes a real training run wrote (conftest ``trained_run``:
the tiny model's own HumanEval actions, run in pooled bubblewrap sandboxes): each reruns in a
fresh sandbox with no difference, and the result is stored for the viewer."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_episodes_of_a_real_run_rerun_the_same(trained_run):
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.replay import ReplayStore

    run_dir, summary = trained_run
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        # iteration 2's episodes ran in sandboxes the pool had already handed out in iteration 1
        ids = [s.episode_id for s in store.list_episodes(summary.run_id, 2)]
    assert len(ids) == 4
    for episode_id in ids:
        res = CliRunner().invoke(app, ["replay", "rerun", episode_id, "--db", str(run_dir)], catch_exceptions=False)
        assert res.exit_code == 0, res.output
        assert "same: all" in res.output, res.output
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}") as store:
        stored = [store.reruns(e) for e in ids]
    assert all(len(r) == 1 and r[0].same is True and r[0].report["outcome"] == "same"
               and r[0].report["backend"] == "bwrap" for r in stored)
