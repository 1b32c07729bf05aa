"""Evaluation during asynchronous training: the scheduling bookkeeping (``EvalSchedule``,
``resumed_evals``), the start-up checks of ``eval.engine`` and the eval engine's placement
and threads (no Ray; the integration test is
tests/integration/cluster/test_async_train.py::test_async_eval_measures_one_version_off_the_critical_path)."""

from __future__ import annotations

import pytest

from agentrl.cluster.engines.eval_engine import eval_engine_config
from agentrl.driver.dedicated_eval import BEFORE, EvalJob, EvalSchedule, resumed_evals
from agentrl.errors import ConfigError, ContractError

GUESS = "agentrl/GuessNumber-v0"


def _job(v: int) -> EvalJob:
    return EvalJob(iteration=v - 1, policy_version=v, payload=f"weights-v{v}")


def test_an_eval_runs_alone_and_a_newer_one_replaces_the_waiting_one():
    s = EvalSchedule()
    s.add(_job(1))
    first = s.next_to_launch()
    assert first.policy_version == 1 and s.next_to_launch() is None  # one at a time
    s.add(_job(2))
    s.add(_job(3))  # v2 never started: skipped, v3 waits (at most two snapshots held)
    assert s.waiting["eval"].policy_version == 3 and s.skipped == 1
    done = s.finish(["ep"], engine_s=1.5, now_s=10.0)
    assert done is first and done.payload is None and done.episodes == ["ep"] and done.finished_s == 10.0
    assert s.next_to_launch().policy_version == 3 and not s.idle()
    assert [j.state() for j in s.pending()] == [{"iteration": 0, "policy_version": 1, "name": "eval"},
                                                {"iteration": 2, "policy_version": 3, "name": "eval"}]
    assert s.counters() == {"async/eval_skipped": 1.0, "async/eval_dropped": 0.0, "async/eval_failed": 0.0}
    assert s.counters()["async/eval_skipped"] == 0.0  # since the last line only


def test_results_land_one_per_line_oldest_first_and_the_last_line_takes_the_newest():
    s = EvalSchedule()
    for v in (1, 2):
        s.add(_job(v))
        s.next_to_launch()
        s.finish([], 1.0, float(v))
    assert [j.policy_version for j in s.take_landing()] == [1]  # one eval per line: v2 waits for the next line
    assert [j.policy_version for j in s.take_landing()] == [2] and s.take_landing() == []
    for v in (3, 4):
        s.add(_job(v))
        s.next_to_launch()
        s.finish([], 1.0, float(v))
    assert [j.policy_version for j in s.take_landing(final=True)] == [4] and s.skipped == 1  # v3 can no longer land
    assert s.pending() == [] and s.idle()


def test_the_eval_before_training_goes_first_and_never_replaces_or_is_replaced():
    s = EvalSchedule()
    s.add(_job(1))  # due before the engine took the starting policy's eval
    s.add(EvalJob(0, 0, "weights-v0", name=BEFORE))
    assert s.skipped == 0 and s.next_to_launch().name == BEFORE  # the oldest version first
    s.add(_job(2))  # replaces v1 (same name), not the running eval_before
    assert s.skipped == 1 and s.waiting["eval"].policy_version == 2
    s.finish([], 1.0, 1.0)
    s.next_to_launch()
    s.finish([], 1.0, 2.0)
    assert sorted(j.name for j in s.take_landing()) == ["eval", BEFORE]  # different keys: one line holds both


def test_a_lost_eval_is_counted_and_frees_the_engine():
    s = EvalSchedule()
    with pytest.raises(ContractError, match="no eval is running"):
        s.finish([], 0.0, 0.0)
    s.add(_job(1))
    s.next_to_launch()
    s.add(_job(2))
    assert s.fail().policy_version == 1 and s.failed == 1
    assert s.next_to_launch().policy_version == 2


def test_a_resume_reruns_the_checkpoints_own_version_and_drops_older_ones():
    pending = [{"iteration": 1, "policy_version": 2}, {"iteration": 3, "policy_version": 4}]
    rerun, dropped = resumed_evals(pending, policy_version=4)
    assert [(j.iteration, j.policy_version, j.name) for j in rerun] == [(3, 4, "eval")] and dropped == 1
    rerun, dropped = resumed_evals([{"iteration": 0, "policy_version": 0, "name": BEFORE}], policy_version=1)
    assert rerun == [] and dropped == 1  # the starting weights are gone after the first update
    assert resumed_evals([], 4) == ([], 0)
    with pytest.raises(ContractError, match="version 5"):
        resumed_evals([{"iteration": 4, "policy_version": 5}], 4)


def test_eval_engine_settings_are_checked_at_start():
    from agentrl.cluster.actors.placement import check_placement, dedicated_eval_engines
    from agentrl.config import load_config

    with pytest.raises(ConfigError, match="eval.engine='rollout' with controller.mode='async'"):
        load_config(None, ["eval.every=1", "controller.mode=async", "eval.engine=rollout"])
    with pytest.raises(ConfigError, match="eval.engine='dedicated' with controller.mode='sync'"):
        load_config(None, ["eval.every=1", "eval.engine=dedicated"])
    # the message names what asked for evaluation during training, not eval.every=0
    with pytest.raises(ConfigError, match=r"controller.mode='sync' \(eval.before_training=true\)"):
        load_config(None, ["eval.before_training=true", "eval.engine=dedicated"])
    with pytest.raises(ConfigError, match=r"controller.mode='async' \(eval.every=2, eval.after_training=true\)"):
        load_config(None, ["eval.every=2", "eval.after_training=true", "controller.mode=async", "eval.engine=rollout"])
    cfg = load_config(None, [f"env.id={GUESS}", "eval.every=1", "controller.mode=async",
                             "eval.max_context_tokens=4096", "rollout.max_context_tokens=1024"])
    assert cfg.eval_engine == "dedicated" and dedicated_eval_engines(cfg) == 1
    # its own engine: the eval's context, not the rollout's, is its vLLM max_model_len
    assert eval_engine_config(cfg)["rollout"]["max_context_tokens"] == 4096
    assert dedicated_eval_engines(load_config(None, ["controller.mode=async"])) == 0
    before = load_config(None, ["controller.mode=async", "eval.before_training=true"])
    assert before.eval_engine == "dedicated" and dedicated_eval_engines(before) == 1
    bad = load_config(None, [f"env.id={GUESS}", "eval.every=1", "controller.mode=async", "eval.max_new_tokens=600",
                             "eval.max_context_tokens=512"])
    with pytest.raises(ConfigError, match="max_new_tokens=600 must be smaller than rollout.max_context_tokens=512"):
        eval_engine_config(bad)
    node = [{"Alive": True, "NodeID": "n1", "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 2.0}}]
    with pytest.raises(ConfigError, match="cluster.placement.eval"):  # trainer 1 + engine 1 + eval engine 1 > 2 CPUs
        check_placement(cfg, node)
    check_placement(load_config(None, [f"env.id={GUESS}", "controller.mode=async"]), node)


def test_the_eval_engine_gets_a_thread_share_without_shrinking_the_others():
    from agentrl.cluster.actors.cpu_threads import actor_env_vars, role_threads
    from agentrl.config import load_config

    base = ["controller.mode=async", "eval.every=1", "cluster.placement.trainer.num_cpus=2"]
    cfg = load_config(None, base)
    # 8 cores; engine 1 + rank 2 shares of 3 without the eval engine; the eval engine 1 of 4
    assert [role_threads(cfg, r, cores=8) for r in ("rollout", "trainer", "eval")] == [2, 5, 2]
    assert role_threads(cfg, "eval", cores=2) == 1  # never 0
    assert actor_env_vars(cfg, "eval", cores=list(range(8))) == {"OMP_NUM_THREADS": "2"}  # not bound to cores
