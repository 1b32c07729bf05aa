"""Difficulty-aware task sampling on real parts (Ray, vLLM on CPU with the tiny model, the
FSDP2 trainer, the SQLite store), in one cheap run: a one-iteration sync run of
``agentrl-test/Symptoms-v0`` (``diagnose_envs.py``: one turn per episode; ``constant``,
``length`` and ``wrong`` are never solved by the random policy, ``fair`` about half the time;
``length`` pays a partial reward that differs between samples) with ``env.difficulty_filter``
on profiles its 4 tasks x 4 samples at version 0 before iteration 1, skips the tasks whose pass rate is 0 or 1
with equal rewards (``constant``, ``wrong``), trains only on the others, stores the profile (file,
``kind='profile'`` episodes, checkpoint) and pays for its tokens; then ``agentrl tasks
profile`` of the same model with the same seed and settings (a fresh engine, the CLI)
measures the same pass rates.

The async case (``controller.mode: async``, two iterations, ``env.profile_every=1``) profiles
on the stream before each iteration: every profile episode is sampled at the one version the
update then starts from, every training request drawn after a profile skips its set (a
request's episode id names the iteration it was drawn in), and a resume from the first
checkpoint restores its skip set and makes the second profile again with the same ids,
version and skip set."""

from __future__ import annotations

import json
import re
import shutil

import pytest

pytestmark = pytest.mark.slow
ENV_MODULE = "tests.integration.cluster.diagnose_envs"


def test_the_filter_skips_tasks_at_0_or_1_pays_for_the_profile_and_agentrl_tasks_profile_agrees(
        ray_session, tmp_path, tiny_model_path):
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.driver.controller import train
    from agentrl.driver.difficulty import profile_seed
    from agentrl.config import load_default_config
    from agentrl.eval.difficulty import read_profile
    from agentrl.replay import ReplayStore
    from tests.integration.cluster.diagnose_envs import ENV_ID, SPLITS

    # one base for the run and the CLI (the packaged default plus these), so both sample alike
    shared = [f"env.import_modules=[{ENV_MODULE}]", "env.kwargs={}", "rollout.max_turns=1", "rollout.max_new_tokens=16",
              "rollout.max_context_tokens=256", "rollout.num_engines=1", "rollout.max_num_seqs=16", "run.seed=0"]
    run_dir = tmp_path / "run"
    cfg = load_default_config([
        *shared, f"env.id={ENV_ID}", f"run.dir={run_dir}", "run.iterations=1", f"model.path={tiny_model_path}",
        "env.task_ids=null", "env.tasks_per_iteration=2", "env.group_size=2", "env.difficulty_filter=skip_solved_and_unsolved",
        "env.profile_samples=4", "trainer.micro_batch_size=2", "eval.every=0", "eval.before_training=false",
        "eval.after_training=false"])
    summary = train(cfg)
    m = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    prof = read_profile(run_dir / "profiles" / "iter_1.json")
    assert prof.policy_version == 0 and prof.seed == profile_seed(0, 1) and prof.samples == 4
    assert [t.task_id for t in prof.tasks] == SPLITS["train"] and all(t.n + t.errored == 4 for t in prof.tasks)

    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}", read_only=True) as store:
        rows = store.list_episodes(summary.run_id, 1)
        profiled = [r for r in rows if r.kind == "profile"]
        trained = [r for r in rows if r.kind == "train"]
        # the skip rule, recomputed from the stored profile episodes: success and reward all alike
        by_task: dict[str, list[tuple[bool, float]]] = {}
        for r in profiled:
            ep = store.get_episode(r.episode_id)
            if not ep.is_error:
                success = bool(ep.success) if ep.success is not None else (ep.total_reward or 0.0) >= 1.0
                by_task.setdefault(r.task_id, []).append((success, float(ep.total_reward or 0.0)))
    assert len(profiled) == 16 and {r.policy_version_min for r in profiled} == {0}
    assert all(r.episode_id.startswith(f"{summary.run_id}/profile/it1/") for r in profiled)
    skipped = sorted(t for t, s in by_task.items() if len(set(s)) == 1)
    assert sorted(prof.skip_task_ids()) == skipped and {"constant", "wrong"} <= set(skipped)
    assert "length" not in skipped  # never solved, but its partial rewards differ: a group has a gradient
    assert "fair" not in skipped, "this seed's profile sampled fair 4 times alike: pick another run.seed"
    assert m["profile/skipped_tasks"] == len(skipped) and m["profile/fallback_all"] == 0
    assert len(trained) == 4 and {r.task_id for r in trained} == set(SPLITS["train"]) - set(skipped)

    # tokens: the profile's are paid (in generated and discarded), the identity still holds
    profile_tokens = sum(r.num_generated_tokens for r in profiled)
    assert m["tokens/profile_generated"] == profile_tokens == prof.tokens_generated > 0
    assert m["tokens/generated"] == sum(r.num_generated_tokens for r in trained) + profile_tokens
    assert m["tokens/generated"] == m["tokens/trained"] + m["tokens/discarded"]
    state = json.loads((run_dir / "checkpoints" / "iter_1" / "controller.json").read_text())
    assert state["tasks"]["skip"] == {"skip_task_ids": skipped, "policy_version": 0, "iteration": 1}

    # agentrl tasks profile: the same model (version 0), seed and settings, on a fresh engine
    out = tmp_path / "cli_profile.json"
    res = CliRunner().invoke(app, ["tasks", "profile", tiny_model_path, *shared, "--env", ENV_ID, "--split", "train",
                                   "--samples", "4", "--seed", str(profile_seed(0, 1)), "--out", str(out),
                                   "--replay-url", f"sqlite:///{tmp_path / 'eval.db'}"])
    assert res.exit_code == 0, res.output
    assert "skip (never solved)" in res.stdout and "keep" in res.stdout and str(out) in res.stdout
    cli = read_profile(out)
    assert [(t.task_id, t.n, t.c, t.errored) for t in cli.tasks] == [(t.task_id, t.n, t.c, t.errored) for t in prof.tasks]
    assert cli.tokens_generated == prof.tokens_generated and cli.budget == prof.budget


ASYNC_ITERATIONS = 2


def test_async_profile_sees_one_version_and_a_resume_reproduces_it(ray_session, tmp_path, tiny_model_path):
    from agentrl.config import load_default_config
    from agentrl.driver.controller import train
    from agentrl.driver.difficulty import profile_seed
    from agentrl.eval.difficulty import read_profile
    from agentrl.replay import ReplayStore
    from tests.integration.cluster.diagnose_envs import ENV_ID, SPLITS

    run_dir = tmp_path / "run"
    cfg = load_default_config([
        f"env.import_modules=[{ENV_MODULE}]", "env.kwargs={}", f"env.id={ENV_ID}", "env.task_ids=null",
        "rollout.max_turns=1", "rollout.max_new_tokens=16", "rollout.max_context_tokens=256", "rollout.num_engines=1",
        "rollout.max_num_seqs=16", "run.seed=0", f"run.dir={run_dir}", f"run.iterations={ASYNC_ITERATIONS}",
        "run.checkpoint_every=1", f"model.path={tiny_model_path}", "env.tasks_per_iteration=2", "env.group_size=2",
        "env.difficulty_filter=skip_solved_and_unsolved", "env.profile_samples=4", "env.profile_every=1",
        "controller.mode=async", "controller.max_staleness=1", "trainer.micro_batch_size=2", "eval.every=0",
        "eval.before_training=false", "eval.after_training=false"])

    def observe(summary) -> dict:
        """What the run left: per iteration its profile (file, stored rows, checkpoint skip set),
        its trained episodes and metrics line."""
        out: dict = {"lines": [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]}
        with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}", read_only=True) as store:
            for it in range(1, ASYNC_ITERATIONS + 1):
                rows = store.list_episodes(summary.run_id, it, limit=10_000)
                state = json.loads((run_dir / "checkpoints" / f"iter_{it}" / "controller.json").read_text())
                out[it] = {"profile": read_profile(run_dir / "profiles" / f"iter_{it}.json"),
                           "profiled": [r for r in rows if r.kind == "profile"],
                           "trained": [r for r in rows if r.kind == "train" and r.advantage_mean is not None],
                           "skip": state["tasks"]["skip"]}
        return out

    def check(summary, seen: dict) -> None:
        assert [round(m["iteration"]) for m in seen["lines"]] == list(range(1, ASYNC_ITERATIONS + 1))
        for it in range(1, ASYNC_ITERATIONS + 1):
            v = it - 1  # the version the update of iteration it starts from: the profile's
            s, prof, m = seen[it], seen[it]["profile"], seen["lines"][it - 1]
            assert prof.policy_version == v and prof.seed == profile_seed(0, it) and prof.iteration == it
            assert len(s["profiled"]) == 4 * len(SPLITS["train"])  # no engine lost: one attempt each
            assert {(r.policy_version_min, r.policy_version_max) for r in s["profiled"]} == {(v, v)}  # one version
            assert all(r.episode_id.startswith(f"{summary.run_id}/profile/it{it}/") for r in s["profiled"])
            assert s["skip"]["policy_version"] == v and s["skip"]["iteration"] == it
            assert m["profile/policy_version"] == v and m["profile/skipped_tasks"] == len(s["skip"]["skip_task_ids"])
            assert m["tokens/profile_generated"] == sum(r.num_generated_tokens for r in s["profiled"]) > 0
            assert m["tokens/generated"] == m["tokens/trained"] + m["tokens/discarded"]
            assert s["trained"], f"iteration {it} trained nothing"
        # a training request drawn in iteration i (its id says so) was drawn after profile i: it skips that set
        for it in range(1, ASYNC_ITERATIONS + 1):
            for r in seen[it]["trained"]:
                drawn = int(re.search(r"/it(\d+)/", r.episode_id).group(1))
                assert r.task_id not in seen[drawn]["skip"]["skip_task_ids"], (r.episode_id, seen[drawn]["skip"])

    summary = train(cfg)
    first = observe(summary)
    check(summary, first)

    # resume from the first checkpoint: its skip set is restored and profile 2 is made again
    shutil.rmtree(run_dir / "checkpoints" / f"iter_{ASYNC_ITERATIONS}")
    (run_dir / "checkpoints" / "latest").write_text("iter_1")
    resumed = train(cfg, resume=True)
    assert resumed.run_id == summary.run_id
    again = observe(resumed)
    check(resumed, again)
    assert again[1]["skip"] == first[1]["skip"]  # the checkpoint's, restored
    assert ({r.episode_id for r in again[2]["profiled"]} == {r.episode_id for r in first[2]["profiled"]})  # rewound, redone
    a, b = first[2]["profile"], again[2]["profile"]
    assert [(t.task_id, t.n, t.c, t.errored) for t in b.tasks] == [(t.task_id, t.n, t.c, t.errored) for t in a.tasks]
    assert again[2]["skip"] == first[2]["skip"] and b.tokens_generated == a.tokens_generated
