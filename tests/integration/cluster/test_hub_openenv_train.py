"""One real training iteration through the OpenEnv adapter (real Ray, vLLM with the tiny model,
the FSDP2 trainer): ``hub/OpenEnv-v0`` on the guess game of
tests/helpers/openenv_guess_server.py, served by openenv 0.10.0 (the hub venv of
scripts/hub_venvs.sh) as a local process the rollout actor starts, spoken to over /ws. GiGPO
groups the steps by the server's observation (the interval still possible), and each step's
reward is the server's own. The server outlives no run: what the actor did not stop, the
reaper removes, as the next run's start does."""

from __future__ import annotations

import json

import pytest
import yaml

from agentrl.hubs.openenv import ENV_ID
from tests.helpers.openenv_hub import guess_command

pytestmark = pytest.mark.slow
RUN_LABEL = "openenv-train-test"


def test_one_iteration_through_the_adapter_over_ws(ray_session, tmp_path, tiny_model_path):
    from agentrl.config import load_config
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore
    from sandboxes import reap_orphans
    from sandboxes.reaper import labelled_processes

    config = tmp_path / "openenv.yaml"
    config.write_text(yaml.safe_dump({"env": {
        "id": ENV_ID,
        "tasks_per_iteration": 2, "group_size": 2,
        "kwargs": {"server": {"command": guess_command(max_sessions=4), "run_id": RUN_LABEL, "idle_s": 0},
                   "anchor_fields": ["low", "high"]}}}))
    cfg = load_config(config, [
        f"run.dir={tmp_path / 'run'}", "run.iterations=1", f"model.path={tiny_model_path}", "rollout.max_turns=2",
        "rollout.max_new_tokens=8", "rollout.max_context_tokens=1024", "trainer.micro_batch_size=2",
        "algorithm.advantage=gigpo"])
    try:
        summary = train(cfg)
    finally:
        reap_orphans(RUN_LABEL)  # the rollout actor is gone: anything of its left is an orphan now
    assert summary.policy_version == 1
    m = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])
    assert m["rollout/episodes"] == 4 and m["tokens/trained"] > 0
    with ReplayStore(f"sqlite:///{tmp_path / 'run' / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id)]
    assert len(eps) == 4
    for ep in eps:  # every episode reached the server: no infrastructure error
        assert ep.termination_reason not in ("infra_error", "reward_error", "aborted"), ep.error
        assert ep.turns and all(t.reward in (0.0, 0.1, 1.0) for t in ep.turns)  # the server's per-step rewards
        # each turn's anchor is the state before it: the task and the interval the server reported
        assert all(t.anchor[0] == ep.task_id and set(json.loads(t.anchor[1])) == {"low", "high"} for t in ep.turns)
    assert not labelled_processes(RUN_LABEL)  # no server outlived the run
