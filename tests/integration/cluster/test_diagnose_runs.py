"""``agentrl diagnose`` end to end: runs made on purpose to show each symptom, on real parts (Ray, vLLM on
CPU with the tiny model, the FSDP2 trainer, the SQLite replay store), and ``agentrl diagnose``
names the right cause for each and not the others.

Two cheap runs of ``agentrl-test/Symptoms-v0`` (``diagnose_envs.py``: one turn per episode,
the task id picks the judge's fault):

1. an asynchronous training run, 2 iterations, ``max_staleness=1`` and a large learning rate:
   iteration 2 trains samples of the version before its update (a stale buffer), and its
   tasks are a judge that always gives 0.5, a reward that pays for length, a fair judge and
   an unreachable reference. Sampled at temperature 1 the random policy's answers disagree,
   so the wrong-reference task is "unsolved", not "likely wrong reference".
2. ``agentrl eval``'s path with SmolLM2-135M (inference only) on held-out capital-city
   questions whose references name another city, at temperature 0.01: the samples agree, the
   judge rejects them all: a likely wrong reference, and nothing else.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow
ENV_MODULE = "tests.integration.cluster.diagnose_envs"
CAUSES = {"constant_judge", "wrong_reference", "reward_pays_length", "stale_async"}


def test_diagnose_names_the_cause_of_each_symptom(ray_session, tmp_path, tiny_model_path, smollm2_path):
    import json

    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.driver.controller import train
    from agentrl.commands.evaluate import evaluate
    from agentrl.config import load_config
    from agentrl.replay import ReplayStore
    from agentrl.replay.diagnose import diagnose
    from tests.integration.cluster.diagnose_envs import ENV_ID

    run_dir = tmp_path / "async"
    summary = train(load_config(None, [
        f"run.dir={run_dir}", "run.iterations=2", "run.seed=0", f"model.path={tiny_model_path}",
        f"env.id={ENV_ID}", f"env.import_modules=[{ENV_MODULE}]", "env.tasks_per_iteration=4", "env.group_size=4",
        "rollout.max_turns=1", "rollout.max_new_tokens=16", "rollout.max_context_tokens=256", "rollout.num_engines=1",
        "trainer.lr=1e-2", "trainer.micro_batch_size=4", "controller.mode=async", "controller.max_staleness=1",
        "eval.before_training=false", "eval.after_training=false"]))  # the default's evals: not this run's subject
    assert summary.iterations_done == 2
    with ReplayStore(f"sqlite:///{run_dir / 'replay.db'}", read_only=True) as store:
        d = diagnose(store, summary.run_id)
    fired = set(d.fired())
    detail = {f.check: f.summary for f in d.findings}
    assert fired & CAUSES == {"constant_judge", "reward_pays_length", "stale_async"}, detail
    assert d.finding("constant_judge").tasks == ["constant"], detail
    assert d.finding("reward_pays_length").tasks == ["length"], detail
    stale = d.finding("stale_async").numbers
    assert stale["buckets"]["1"]["episodes"] >= 4 and stale["stale_gap_abs_mean"] >= 2 * stale["buckets"]["0"]["gap_abs_mean"]
    assert {t.task_id: t.verdict for t in d.tasks}["wrong"] == "unsolved"  # disagreeing answers: not a wrong reference

    # the CLI on the run directory: the same findings as JSON, exit 1 because checks fire
    res = CliRunner().invoke(app, ["diagnose", str(run_dir), "--json"])
    assert res.exit_code == 1, res.output
    assert set(json.loads(res.stdout)["fired"]) == fired

    eval_url = f"sqlite:///{tmp_path / 'eval.db'}"
    # a model that knows the answers (the random tiny one has near-tied first tokens even at a
    # temperature of 1e-6), sampled nearly greedily; inference only
    ev = evaluate(smollm2_path, ["eval.samples=4", "eval.temperature=0.01", "eval.max_turns=1",
                                 "eval.max_new_tokens=8", "eval.max_context_tokens=256",
                                    f"env.import_modules=[{ENV_MODULE}]"], env_id=ENV_ID, replay_url=eval_url)
    with ReplayStore(eval_url, read_only=True) as store:
        d = diagnose(store, ev.run_id)
    detail = {f.check: f.summary for f in d.findings}
    assert set(d.fired()) & CAUSES == {"wrong_reference"}, detail
    assert sorted(d.finding("wrong_reference").tasks) == [f"wrong-{i}" for i in range(4)], detail
    assert all(t.agree_frac == 1.0 for t in d.tasks)
