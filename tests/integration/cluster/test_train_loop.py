"""The whole loop on real parts: Ray actors, vLLM (CPU), FSDP2 trainer over gloo, bubblewrap
sandboxes, HumanEval, SQLite replay store. Uses the tiny random SmolLM2-vocab model so an
iteration takes seconds; the embedded default run uses the real SmolLM2-135M-Instruct."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.slow


def _cfg(tmp_path, tiny_model_path, name, *extra):
    return make_cfg(tmp_path, tiny_model_path, name, *extra)


def make_cfg(tmp_path, tiny_model_path, name, *extra):
    from agentrl.config import load_config

    return load_config(None, [
        f"run.dir={tmp_path / name}", "run.iterations=1", "run.seed=0",
        f"model.path={tiny_model_path}", "env.tasks_per_iteration=2", "env.group_size=2",
        "rollout.max_turns=2", "rollout.max_new_tokens=24", "rollout.max_context_tokens=1024",
        "rollout.check_template=true", "sandbox.backend=bwrap", "trainer.lr=1e-4", "trainer.micro_batch_size=2",
        "rollout.kv_cache_gb=0.125",  # 262k tokens of the tiny model's cache; 1 GiB zeroed per start was 8x that
        *extra,
    ])


def test_end_to_end(trained_run):
    """The shared two-iteration run (conftest ``trained_run``): metrics, token accounting,
    the replay store and the checkpoints."""
    from agentrl.replay import ReplayStore

    run_dir, summary = trained_run
    assert summary.iterations_done == 2 and summary.policy_version == 2
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        for key in ("rollout/reward_mean", "rollout/success_rate", "tokens/generated", "tokens/trained",
                    "tokens/discarded", "time/rollout_s", "time/credit_s", "time/update_s", "time/sync_s",
                    "rollout/response_length_mean", "rollout/finish_reason/stop", "rollout/finish_reason/length",
                    "actor/entropy", "rollout_corr/gap_abs_mean", "rollout_corr/gap_abs_p99", "actor/pg_loss",
                    "actor/pg_clipfrac_dual", "perf/peak_memory_mb", "perf/padding_frac"):
            assert key in m, key
        assert not [k for k in m if k.startswith(("losses/", "train/"))]  # the old policy names are gone
        # the default path has no KL term: no reference model, no kl_to_reference call
        assert m["kl/coef"] == 0.0 and m["actor/kl_loss"] == 0.0 and "kl/ref_k3" not in m
        # the random model earns 0: every advantage 0, so the update takes no optimizer step
        assert m["actor/grad_norm"] == 0.0 and m["actor/no_signal_steps"] == 1.0
        assert m["rollout/episodes"] == 4
        assert m["tokens/generated"] == m["tokens/trained"] + m["tokens/discarded"]
        # engine and trainer scored the sampled tokens with the same weights (iteration 2:
        # after the first weight sync): the gap is tiny (fp32)
        assert m["rollout_corr/gap_abs_mean"] < 1e-3
    store = ReplayStore(f"sqlite:///{run_dir / 'replay.db'}")
    assert store.count_episodes(summary.run_id) == 8
    # per sampled token the update's own log-prob and entropy (the viewer's trainer-side
    # columns), next to the engine's: their gap is the rollout_corr/gap metric's
    gaps = []
    for s in store.list_episodes(summary.run_id):
        ep = store.get_episode(s.episode_id)
        for t, (lp, ent) in zip(ep.turns, store.get_trainer_values(s.episode_id)):
            if lp is not None:
                assert len(lp) == len(ent) == len(t.completion_ids)
                assert all(math.isfinite(x) for x in lp + ent) and all(x >= 0 for x in ent)
                gaps += [abs(a - b) for a, b in zip(lp, t.behavior_log_probs)]
    assert gaps and sum(gaps) / len(gaps) < 1e-3
    # the replay store's metrics rows carry the same names and values as metrics.jsonl
    for it, m in enumerate(lines, start=1):  # iterations are numbered from 1
        assert store.metrics(summary.run_id)[it] == {k: v for k, v in m.items() if v is not None}
    ep = store.get_episode(store.list_episodes(summary.run_id)[0].episode_id)
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs()) > 0
    assert (run_dir / "checkpoints" / "latest").read_text() == "iter_2"
    assert (run_dir / "config.yaml").is_file()


def _losses(run_dir):
    return [(round(x["iteration"]), x.get("actor/pg_loss"), x["tokens/generated"])
            for x in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())]


def test_C11_resume_continues_the_same_run(ray_session, tmp_path, tiny_model_path):
    """One run stopped twice and resumed, against the same run without stops: with two tasks
    and one task per iteration an epoch is two iterations, so the first resume (after 2) is
    on an epoch boundary and the second (after 3) mid-epoch; the last start runs through the
    next boundary. (Two chains of three starts each, one per resume point, cost two more
    starts and sixteen more iterations in CI.)"""
    from agentrl.driver.controller import load_run_config, train

    extra = ["env.tasks_per_iteration=1", f"env.task_ids={json.dumps(['HumanEval/1', 'HumanEval/2'])}"]
    straight = _cfg(tmp_path, tiny_model_path, "straight", "run.iterations=4", *extra)
    train(straight)
    first = _cfg(tmp_path, tiny_model_path, "resumed", "run.iterations=2", "logging.tensorboard=true", *extra)
    assert train(first).iterations_done == 2
    for n in (3, 4):  # resumed on an epoch boundary, then mid-epoch
        summary = train(load_run_config(tmp_path / "resumed", [f"run.iterations={n}"]), resume=True)
        assert summary.iterations_done == n
    a, b = _losses(tmp_path / "straight"), _losses(tmp_path / "resumed")
    assert [x[0] for x in b] == [1, 2, 3, 4]  # nothing repeated or skipped
    assert a == b  # same tasks, same samples, same losses (CPU, fp32)
    # TensorBoard (logging.tensorboard, agentrl/driver/metric_sinks.py) across both resumes:
    # metrics.jsonl's names and values, each iteration once
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lines = [json.loads(x) for x in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    acc = EventAccumulator(str(tmp_path / "resumed" / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    assert set(acc.Tags()["scalars"]) == {k for m in lines for k, v in m.items() if v is not None and k != "iteration"}
    for tag in acc.Tags()["scalars"]:
        want = [(round(m["iteration"]), m[tag]) for m in lines if m.get(tag) is not None]
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in want], tag
        assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6, abs=1e-6), tag
    # the replay store holds each iteration once, all complete (a SIGKILL mid-run is in
    # test_resume_no_duplicates.py)
    from agentrl.replay import ReplayStore

    with ReplayStore(f"sqlite:///{tmp_path / 'resumed' / 'replay.db'}") as store:
        assert store.completed_iterations(summary.run_id) == [1, 2, 3, 4]
        assert [store.count_episodes(summary.run_id, it) for it in (1, 2, 3, 4)] == [2] * 4
        assert sorted(store.metrics(summary.run_id)) == [1, 2, 3, 4]
        assert store.get_run(summary.run_id).resume_count == 2
        # the tasks of each iteration, as the task order says: both tasks in each epoch
        tasks = [{e.task_id for e in store.list_episodes(summary.run_id, it)} for it in (1, 2, 3, 4)]
    assert all(len(t) == 1 for t in tasks)
    for epoch in range(2):  # iterations 1-2 and 3-4 (tasks[0..3])
        assert tasks[2 * epoch] | tasks[2 * epoch + 1] == {"HumanEval/1", "HumanEval/2"}


def test_turn_critic_trains_policy_and_critic(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train

    # with the KL penalty in the reward (verl's use_kl_in_reward): the reference (the
    # initial policy) scores each iteration's rows before credit, and the per-turn penalties
    # reach the turn-level critic's returns
    cfg = _cfg(tmp_path, tiny_model_path, "critic", "algorithm.advantage=turn_critic", "algorithm.gamma=0.9",
               "algorithm.lam=0.95", "critic.lr=1e-3", "run.iterations=2", "trainer.kl.coef=0.01",
               "trainer.kl.mode=reward", "trainer.kl.estimator=k1")
    summary = train(cfg)
    lines = [json.loads(x) for x in (tmp_path / "critic" / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert m["critic/value_loss"] is not None and m["critic/value_loss"] >= 0
        assert m["tokens/trained"] > 0
        assert m["kl/coef"] == 0.01 and m["actor/kl_loss"] == 0.0  # in the reward, not the loss
        assert m["kl/ref_k2"] >= 0 and m["kl/ref_k3"] >= 0
    # KL(engine || reference): iteration 1 samples from the reference's weights (up to the
    # engine/trainer gap); iteration 2 from the updated policy
    assert abs(lines[0]["kl/ref_k1"]) < 1e-3
    assert lines[1]["kl/ref_k3"] > lines[0]["kl/ref_k3"]
    # the critic is checkpointed with the policy (its resume, through the same critic trainer,
    # is test_gae_trains_policy_and_token_critic_and_resumes': one resume of a critic run in CI)
    assert (tmp_path / "critic" / "checkpoints" / "iter_2" / "trainer_critic").is_dir()
    assert summary.iterations_done == 2


CRITIC_KEYS = ("critic/value_loss", "critic/value_clipfrac", "critic/values_mean", "critic/returns_mean",
               "critic/explained_variance", "critic/grad_norm", "critic/num_value_positions", "critic/global_step",
               "critic/values_mean_rollout")


def _metrics(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _check_critic_metrics(m):
    for key in CRITIC_KEYS:
        assert m.get(key) is not None and math.isfinite(m[key]), key  # None in metrics.jsonl = not finite
    assert m["critic/value_loss"] >= 0
    # one value position per trained (sampled) token: the critic is token-level
    assert m["critic/num_value_positions"] == m["tokens/trained"] > 0


def test_gae_trains_policy_and_token_critic_and_resumes(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import load_run_config, train
    from agentrl.replay import ReplayStore

    # head_init_std > 0: the critic's values (and so the advantages) are not all zero from the start;
    # the KL term to the initial policy in the loss (k3, as GRPO), which a resume reloads
    cfg = _cfg(tmp_path, tiny_model_path, "gae", "algorithm.advantage=gae", "algorithm.token_lam=0.95",
               "critic.lr=1e-3", "critic.head_init_std=0.05", "critic.value_clip=0.5", "run.iterations=2",
               "trainer.kl.coef=0.01")
    summary = train(cfg)
    lines = _metrics(tmp_path / "gae")
    assert len(lines) == 2 and summary.policy_version == 2
    for it, m in enumerate(lines, start=1):
        _check_critic_metrics(m)
        assert m["critic/global_step"] == it
        assert m["advantages/abs_max"] > 0 and math.isfinite(m["advantages/mean"])
        assert m["kl/coef"] == 0.01
    # the reference is the initial policy: KL(current || reference) is 0 before the first update
    assert lines[0]["kl/ref_k3"] == lines[0]["actor/kl_loss"] == 0.0
    assert lines[1]["kl/ref_k3"] > 0 and lines[1]["actor/kl_loss"] == pytest.approx(0.01 * lines[1]["kl/ref_k3"])
    ckpt = tmp_path / "gae" / "checkpoints" / "iter_2"
    assert (ckpt / "trainer").is_dir() and (ckpt / "trainer_critic").is_dir()
    # the replay store holds one advantage per turn (the mean over its sampled tokens)
    store = ReplayStore(f"sqlite:///{tmp_path / 'gae' / 'replay.db'}")
    listed = store.list_episodes(summary.run_id)
    assert len(listed) == 8
    stored = [a for e in listed if not e.is_error for a in store.get_advantages(e.episode_id)]
    assert stored and all(a is not None and math.isfinite(a) for a in stored) and any(a != 0 for a in stored)

    # resume: the critic continues from its checkpoint (its step counter too)
    resumed = train(load_run_config(tmp_path / "gae", ["run.iterations=3"]), resume=True)
    assert resumed.iterations_done == 3 and resumed.run_id == summary.run_id and resumed.policy_version == 3
    last = _metrics(tmp_path / "gae")[-1]
    assert last["iteration"] == 3
    _check_critic_metrics(last)
    assert last["kl/ref_k3"] > 0  # the resumed trainer loaded the reference again (not the checkpoint)
    assert last["critic/global_step"] == 3
    assert (tmp_path / "gae" / "checkpoints" / "iter_3" / "trainer_critic").is_dir()


def test_dynamic_sampling_refills_then_skips_an_update_with_no_signal(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train

    # The tiny random model never solves HumanEval: every group has equal (zero) rewards,
    # so every group is dropped, refilled twice, and no update happens (nothing to learn).
    cfg = _cfg(tmp_path, tiny_model_path, "ds", "algorithm.dynamic_sampling=true", "algorithm.max_refill_rounds=2",
               "env.tasks_per_iteration=1", "rollout.max_turns=1")
    summary = train(cfg)
    m = json.loads((tmp_path / "ds" / "metrics.jsonl").read_text())
    assert m["filter/refill_rounds"] == 2 and m["rollout/episodes"] == 6  # 1 group + 2 refills, 2 rollouts each
    assert m["tokens/trained"] == 0 and m["tokens/discarded"] == m["tokens/generated"] > 0
    assert summary.policy_version == 0  # no update without signal, and no weight sync


@pytest.mark.docker
def test_humaneval_end_to_end_on_docker_sandboxes(ray_session, tmp_path, tiny_model_path):
    """HumanEval runs on the Docker backend end to end (real containers)."""
    import os

    from agentrl.driver.controller import train
    from sandboxes.docker.daemon import docker_daemon_answers

    if not docker_daemon_answers():
        if os.environ.get("AGENTRL_REQUIRE_DOCKER") == "1":
            pytest.fail("AGENTRL_REQUIRE_DOCKER=1 but no Docker daemon answers")
        pytest.skip("no Docker daemon answers (scripts/test.sh starts one)")
    import docker

    client = docker.from_env()
    cfg = _cfg(tmp_path, tiny_model_path, "docker", "sandbox.backend=docker", "run.name=dockere2e")
    summary = train(cfg)
    m = json.loads((tmp_path / "docker" / "metrics.jsonl").read_text())
    assert m["rollout/episodes"] == 4 and m["filter/infra_errors"] == 0 and m["tokens/trained"] > 0
    left = client.api.containers(all=True, filters={"label": f"agentrl.run_id={summary.run_id}"})  # one call, no inspect race
    assert left == []  # no container outlives its run


def test_warm_sandbox_pool_serves_episodes(trained_run):
    # the shared run: 4 episodes per iteration, 4 warm sandboxes: every acquire finds a warm one
    run_dir, _ = trained_run
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["filter/infra_errors"] == 0 for r in rows)
    last = rows[-1]
    assert last["sandbox/started"] == 4  # reused across 8 episodes: reset, not restarted
    assert last["sandbox/acquire_p50_ms"] < 50  # warm acquire (measured ~0.01 ms in the benchmark)
