"""The eval judge kept apart from the training reward (agentrl/driver/judge.py): an env's
declared ``judge_kwargs`` reach every eval episode (``agentrl eval``'s config and identity,
``eval.every``'s budget, the engine's env factory) and the report names the judge. The
sandboxed grading under both judges is
tests/integration/environments/test_env_humaneval_sandboxed.py
(test_visible_tests_pay_the_training_reward_and_the_judge_grades_the_hidden_check)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import gymnasium
import pytest

from agentrl.cluster.actors.env_factory import EnvFactory
from agentrl.driver.evaluation import eval_budget
from agentrl.commands.evaluate import eval_config, eval_identity, eval_run_id, resolve_target
from agentrl.driver.judge import declared_judge_kwargs, judge_env_kwargs, judge_label
from agentrl.config import config_from_dict
from agentrl.errors import ContractError
from agentrl.eval.report import format_settings
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord
from environments.guess_number import GuessNumberEnv

HUMANEVAL = "agentrl/HumanEval-v0"
JUDGED = "agentrl-test/JudgedGuess-v0"


class JudgedGuess(GuessNumberEnv):
    """GuessNumber whose eval judge allows 2 guesses (a stand-in for a user's env)."""

    judge_kwargs = {"max_guesses": 2}


@pytest.fixture
def judged_env():
    gymnasium.register(JUDGED, entry_point=JudgedGuess)
    yield JUDGED
    del gymnasium.registry[JUDGED]


def _run(tmp_path: Path, env_id: str, kwargs: dict) -> Path:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "iter_1"
    (ckpt / "trainer").mkdir(parents=True)
    (ckpt / "trainer" / "COMPLETE").write_text("ok\n")
    (ckpt / "controller.json").write_text(json.dumps({"run_id": "r-1", "iteration": 1, "policy_version": 1}))
    (run / "checkpoints" / "latest").write_text("iter_1")
    (run / "config.yaml").write_text(json.dumps({"run": {"name": "r"}, "env": {"id": env_id, "split": "train",
                                                                                "kwargs": kwargs}}))
    return run


def test_declarations_are_read_from_the_env_class(judged_env):
    assert declared_judge_kwargs(HUMANEVAL) == {"reward_tests": "hidden"}
    assert declared_judge_kwargs("agentrl/GuessNumber-v0") == {}  # no separate judge: the training reward
    assert declared_judge_kwargs(judged_env) == {"max_guesses": 2}
    assert judge_env_kwargs(HUMANEVAL, {"reward_tests": "visible", "max_tool_calls": 2}) == \
        {"reward_tests": "hidden", "max_tool_calls": 2}


def test_a_malformed_declaration_is_a_contract_error(judged_env, monkeypatch):
    monkeypatch.setattr(JudgedGuess, "judge_kwargs", ["max_guesses"])
    with pytest.raises(ContractError, match=r"JudgedGuess.judge_kwargs=\['max_guesses'\] must be a mapping"):
        declared_judge_kwargs(judged_env)


def test_labels_say_which_judge_and_whether_it_is_the_training_reward():
    assert judge_label(HUMANEVAL, {"reward_tests": "visible"}) == \
        "judge reward_tests='hidden' (training reward: reward_tests='visible')"
    assert judge_label(HUMANEVAL, {}) == "judge reward_tests='hidden' (the training reward too)"  # the default
    assert judge_label(HUMANEVAL, None) == "judge reward_tests='hidden'"  # a bare model: not trained here
    # a training reward from an LLM judge: the eval is scored by the rule, and the phrase says so
    assert judge_label("agentrl/MathAnswer-v0", {}, llm_judge="m at http://x/v1") == (
        "judge: the rule reward of agentrl/MathAnswer-v0 (training reward: the LLM judge m at http://x/v1, never "
        "used for evals)")
    assert "with reward_tests='hidden'" in judge_label(HUMANEVAL, {}, llm_judge="m at http://x/v1")
    assert judge_label("agentrl/GuessNumber-v0", {}) == \
        "judge: the training reward (agentrl/GuessNumber-v0 declares no separate judge)"
    settings = {"env": HUMANEVAL, "split": "test", "tasks": 33, "samples": 4, "seed": 0, "temperature": 1.0,
                "top_p": 1.0, "top_k": -1, "max_turns": 4, "max_new_tokens": 256, "max_context_tokens": 2048,
                "confidence": 0.95, "num_resamples": 1000, "judge": judge_label(HUMANEVAL, {"reward_tests": "visible"})}
    assert format_settings(settings, 3).endswith("(1000 resamples); judge reward_tests='hidden' "
                                                 "(training reward: reward_tests='visible')")


def test_agentrl_eval_of_a_run_trained_on_visible_tests_is_judged_on_the_hidden_check(tmp_path):
    run = _run(tmp_path, HUMANEVAL, {"reward_tests": "visible", "max_tool_calls": 2})
    target = resolve_target(str(run))
    cfg, train_cfg = eval_config(target)
    assert train_cfg.env.kwargs == {"reward_tests": "visible", "max_tool_calls": 2}
    assert cfg.env.kwargs == {"reward_tests": "hidden", "max_tool_calls": 2}  # the engines make envs with these
    assert eval_identity(target, cfg)["env_kwargs"] == {"reward_tests": "hidden", "max_tool_calls": 2}
    # eval.every: the training config's budget carries the judge's kwargs to the engines
    assert eval_budget(train_cfg).env_kwargs == {"reward_tests": "hidden", "max_tool_calls": 2}


def test_two_evals_under_different_judges_never_share_a_run_id(tmp_path, judged_env, monkeypatch):
    target = resolve_target(str(_run(tmp_path, judged_env, {"max_guesses": 5})))
    cfg_a, _ = eval_config(target)
    monkeypatch.setattr(JudgedGuess, "judge_kwargs", {"max_guesses": 3})
    cfg_b, _ = eval_config(target)
    assert (cfg_a.env.kwargs, cfg_b.env.kwargs) == ({"max_guesses": 2}, {"max_guesses": 3})
    assert eval_run_id(target, cfg_a) != eval_run_id(target, cfg_b)


def test_the_engines_env_factory_makes_eval_envs_with_the_judges_kwargs(judged_env):
    cfg = config_from_dict({"env": {"id": judged_env, "kwargs": {"max_guesses": 5}}})
    factory = EnvFactory(cfg, "test-judge")  # GuessNumber needs no sandbox
    limits = RolloutLimits(max_turns=6, max_new_tokens=64, max_context_tokens=1024)
    sampling = SamplingRecord(temperature=0.7)
    worker = RolloutWorker(SimpleNamespace(), SimpleNamespace(tokenizer=None), factory, limits, sampling)
    req = EpisodeRequest(env_id=judged_env, task_id=GuessNumberEnv.task_ids("test")[0], seed=0, group_id="g", sample_seed=0)

    def guesses(make) -> int:
        env, sandbox = make(req)
        assert sandbox is None
        n = env.unwrapped.max_guesses
        env.close()
        return n

    budget = eval_budget(cfg)
    assert guesses(factory) == 5  # training episodes
    evaluating = worker.with_budget(budget)  # what RolloutWorker.run rolls out a budgeted call with
    assert guesses(evaluating.env_factory) == 2  # eval episodes: the judge's kwargs
    assert (evaluating.limits.max_turns, evaluating.limits.max_new_tokens, evaluating.sampling) == \
        (cfg.eval.max_turns, cfg.eval.max_new_tokens, SamplingRecord(temperature=cfg.eval.temperature))
    # the worker and its factory are never changed by a budgeted call
    assert guesses(factory) == 5 and worker.limits is limits and worker.sampling is sampling
    assert worker.env_factory is factory and factory.env_kwargs == {"max_guesses": 5}


def test_a_rerun_finds_which_stored_episodes_are_a_training_runs_evals(tmp_path):
    """``agentrl replay rerun`` makes an eval episode's env with the judge's kwargs: it tells
    the run's eval episodes from its training ones by their stored kind (paged)."""
    from agentrl.commands.rerun import _is_eval_episode
    from agentrl.replay import ReplayStore
    from tests.helpers.episodes import make_episode

    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 0, [make_episode("full_history", episode_id=f"r/it0/t{i}") for i in range(3)])
        store.add_episodes("r", 0, [make_episode("full_history", episode_id=f"r/eval/it0/e{i}") for i in range(3)],
                           kind="eval")
        assert [_is_eval_episode(store, "r", f"r/eval/it0/e{i}", page=2) for i in range(3)] == [True] * 3
        assert not any(_is_eval_episode(store, "r", f"r/it0/t{i}", page=2) for i in range(3))


def test_judge_false_keeps_the_training_reward(tmp_path):
    """``agentrl tasks profile`` measures the reward training sees: ``judge=False``."""
    target = resolve_target(str(_run(tmp_path, HUMANEVAL, {"reward_tests": "visible"})))
    cfg, _ = eval_config(target, judge=False)
    assert cfg.env.kwargs == {"reward_tests": "visible"}


def test_the_train_summary_names_the_judge():
    from agentrl.eval.report import training_eval_lines

    row = {"iteration": 1.0, "eval/policy_version": 1.0, "eval/pass@1": 0.5, "eval/pass@1_low": 0.25,
           "eval/pass@1_high": 0.75, "eval/tasks": 2.0, "eval/samples_scored": 4.0, "eval/samples_errored": 0.0}
    judge = judge_label(HUMANEVAL, {"reward_tests": "visible"})
    (line,) = training_eval_lines([row], judge=judge)
    assert line.startswith("held-out eval after training (policy version 1): pass@1 0.500 [0.250, 0.750]")
    assert line.endswith("(4 scored, 0 errored); judge reward_tests='hidden' (training reward: reward_tests='visible')")
    assert training_eval_lines([row]) == [line.split("; judge")[0]]


class _Recorded(Exception):
    """Raised by the stand-in pool once it has recorded what the engines would get."""


def _record_rollout_budget(monkeypatch) -> dict:
    """Stand-ins for Ray, the sandbox hosts and the engines (the real path is the integration
    test tests/integration/cluster/test_profile_train.py): the budget ``evaluate`` hands the
    engines' rollout is recorded, then the rollout raises ``_Recorded``."""
    import agentrl.commands.evaluate as evaluate_module

    seen: dict = {}

    class Pool:
        def __init__(self, cfg, cfg_dict, model_path, run_id, sandbox_hosts=()):
            seen["cfg_kwargs"] = cfg.env.kwargs

        def ready(self):
            pass

        def rollout(self, requests, policy_version, budget=None):
            seen["budget"] = budget
            raise _Recorded

        def kill(self):
            pass

    # the names as agentrl.commands.evaluate imported them
    monkeypatch.setattr(evaluate_module, "EnginePool", Pool)
    monkeypatch.setattr(evaluate_module, "connect", lambda cfg: False)
    monkeypatch.setattr(evaluate_module, "start_sandbox_hosts", lambda cfg, run_id: [])
    monkeypatch.setattr(evaluate_module, "stop_sandbox_hosts", lambda hosts: None)
    monkeypatch.setattr(evaluate_module, "reap_orphans", lambda *a, **k: None)
    return seen


@pytest.mark.parametrize("judge, graded", [(False, "visible"), (True, "hidden")])
def test_the_engines_grade_with_the_training_reward_exactly_when_judge_is_false(tmp_path, monkeypatch, judge, graded):
    """``agentrl tasks profile`` (``evaluate(judge=False)``) must score the training reward
    on the engines too, not only in its stored config: the rollout budget's ``env_kwargs``
    are the kwargs every eval env is made with (``RolloutWorker.with_budget``)."""
    from agentrl.commands.evaluate import evaluate

    seen = _record_rollout_budget(monkeypatch)
    with pytest.raises(_Recorded):
        evaluate("tiny-random-smollm2", [f"env.id={HUMANEVAL}", "env.kwargs={reward_tests: visible}",
                                         "eval.split=train", "eval.num_tasks=1", "eval.samples=1"],
                 allow_overlap=True, replay_url=f"sqlite:///{tmp_path / 'replay.db'}", judge=judge)
    assert seen["cfg_kwargs"] == {"reward_tests": graded}
    assert seen["budget"].env_kwargs == {"reward_tests": graded}


def test_a_rerun_of_an_eval_runs_episode_uses_the_config_that_eval_rolled_out_with(tmp_path, judged_env, monkeypatch):
    """An ``agentrl eval`` / ``agentrl tasks profile`` run stores the config its envs were
    made with (judge kwargs in it, or, for a profile's ``judge=False``, the training reward's):
    a rerun of its episodes makes the env with exactly those, never the judge's over them.
    A training run's eval episodes still get the judge's (``test_a_rerun_finds_...``)."""
    import dataclasses

    import agentrl.cluster.actors.env_factory as env_factory
    from agentrl.commands.rerun import rerun_stored_episode
    from agentrl.replay import ReplayStore
    from tests.helpers.episodes import make_episode

    made: list[dict] = []

    def factory(cfg, *a, **k):
        made.append(dict(cfg.env.kwargs))
        raise _Recorded

    monkeypatch.setattr(env_factory, "EnvFactory", factory)
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    profile_cfg = config_from_dict({"env": {"id": judged_env, "kwargs": {"max_guesses": 5}}}).model_dump(mode="json")
    train_cfg = profile_cfg  # a training run's stored config: its env.kwargs are the training reward's
    with ReplayStore(url) as store:
        store.start_run("profile-run", {"kind": "eval", "config": profile_cfg})
        store.start_run("train-run", train_cfg)
        for run_id in ("profile-run", "train-run"):
            ep = dataclasses.replace(make_episode("full_history", episode_id=f"{run_id}/eval/e0"), env_id=judged_env)
            store.add_episodes(run_id, 0, [ep], kind="eval")
    for run_id in ("profile-run", "train-run"):
        with pytest.raises(_Recorded):
            rerun_stored_episode(url, f"{run_id}/eval/e0", record=False)
    assert made == [{"max_guesses": 5}, {"max_guesses": 2}]
