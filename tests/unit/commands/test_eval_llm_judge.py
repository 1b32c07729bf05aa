"""The eval's own LLM judge (``eval.judge``): its config and the section its errors name, its
service by role (agentrl/cluster/actors/judge_service.py), the budgets that reach it
(``RolloutBudget.judge``, ``RolloutWorker.with_budget``), where evaluations take it
(``eval_budget``, ``eval_engine_config``, ``eval_config`` and ``evaluate``), the warning when
it is the training reward's judge, and the label that names it (agentrl/driver/judge.py). The
real path (a training run whose evals a second HTTP judge scores) is
tests/integration/cluster/test_eval_judge.py."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from agentrl.cluster.actors.judge_service import judge_service_name, role_config, run_rubric
from agentrl.cluster.engines.eval_engine import eval_engine_config
from agentrl.commands.evaluate import eval_config, eval_identity, eval_run_id, resolve_target
from agentrl.config import load_config
from agentrl.config.reward_sections import JudgeConfig
from agentrl.driver.difficulty import rollout_budget
from agentrl.driver.evaluation import eval_budget
from agentrl.driver.judge import EvalLLMJudge, eval_llm_judge, judge_label, judge_name, same_judge, warn_same_judge
from agentrl.errors import ConfigError
from agentrl.rollout.budget import RolloutBudget
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import SamplingRecord

MATH = "agentrl/MathAnswer-v0"
REWARD = ["reward.judge.model=train-judge", "reward.judge.base_url=http://127.0.0.1:8000/v1"]
EVAL = ["eval.judge.model=eval-judge", "eval.judge.base_url=http://127.0.0.1:8001/v1"]


def _cfg(*extra: str):
    return load_config(None, [f"env.id={MATH}", *extra])


def test_eval_judge_errors_name_the_eval_section_and_reward_ones_the_reward_section():
    cfg = _cfg(*EVAL, "eval.rubric={name: r, criteria: [{name: a, description: d}]}")
    assert cfg.eval.judge.model == "eval-judge" and cfg.eval.rubric["name"] == "r" and cfg.reward.judge is None
    with pytest.raises(ConfigError, match=r"eval\.judge: base_url=None; kind endpoint needs"):
        _cfg("eval.judge.model=m")
    with pytest.raises(ConfigError, match=r"reward\.judge: base_url=None; kind endpoint needs"):
        _cfg("reward.judge.model=m")
    with pytest.raises(ConfigError) as err:
        _cfg(*EVAL, "eval.judge.api_key=sk-live-0123456789abcdef")
    assert str(err.value).startswith("invalid config: eval.judge: api_key: an API key does not belong")
    assert "0123456789abcdef" not in str(err.value)
    with pytest.raises(ConfigError, match=r"eval\.judge: api_key_env: expected the NAME"):
        _cfg(*EVAL, "eval.judge.api_key_env=sk-live-0123456789abcdef")


def test_each_role_has_its_own_service_and_the_eval_rubric_falls_back_to_the_reward_one():
    assert judge_service_name("r-1") == judge_service_name("r-1", "reward") == "agentrl-judge-r-1"
    assert judge_service_name("r-1", "eval") == "agentrl-judge-eval-r-1"
    with pytest.raises(ConfigError, match="judge role='critic'"):
        judge_service_name("r-1", "critic")
    cfg = _cfg(*REWARD, *EVAL)
    assert run_rubric(cfg, "eval").name == run_rubric(cfg).name == "math-answer-equivalence"  # the env's own
    own = _cfg(*EVAL, "reward.rubric={name: train-r, criteria: [{name: a, description: d}]}")
    assert run_rubric(own, "eval").name == "train-r"  # eval.rubric unset: reward.rubric
    both = _cfg(*EVAL, "reward.rubric={name: train-r, criteria: [{name: a, description: d}]}",
                "eval.rubric={name: eval-r, criteria: [{name: b, description: e}]}")
    assert (run_rubric(both).name, run_rubric(both, "eval").name) == ("train-r", "eval-r")
    seen = role_config(both, "eval")  # what a judge pool of the eval role reads
    assert seen.reward.judge == both.eval.judge and seen.reward.rubric["name"] == "eval-r"
    assert role_config(both, "reward") is both


def test_a_rubric_less_eval_judge_is_refused_naming_the_eval_section():
    cfg = load_config(None, ["env.id=agentrl/GuessNumber-v0", *EVAL])
    with pytest.raises(ConfigError, match=r"eval\.judge is set but no rubric: give eval\.rubric or reward\.rubric"):
        run_rubric(cfg, "eval")


def _worker(eval_judge=None):
    limits = RolloutLimits(max_turns=6, max_new_tokens=64, max_context_tokens=1024)
    factory = SimpleNamespace(with_env_kwargs=lambda kwargs: factory)
    return RolloutWorker(SimpleNamespace(), SimpleNamespace(tokenizer=None), factory, limits,
                         SamplingRecord(temperature=0.7), judge="train scorer", eval_judge=eval_judge)


def test_with_budget_hands_the_eval_judge_to_eval_budgets_only():
    cfg = _cfg(*REWARD, *EVAL)
    worker = _worker(eval_judge="eval scorer")
    budget = eval_budget(cfg)
    assert budget.judge == "eval" and worker.with_budget(budget).judge == "eval scorer"
    assert worker.with_budget(eval_budget(cfg, judge=False)).judge is None  # agentrl tasks profile: the rule
    assert worker.with_budget(rollout_budget(cfg)).judge is None  # a difficulty profile stays unjudged
    assert worker.judge == "train scorer" and worker.eval_judge == "eval scorer"  # the worker is left as it is
    # no eval.judge: an eval budget without a judge, scored by the rule, as before
    plain = eval_budget(_cfg(*REWARD))
    assert plain.judge == "none" and _worker().with_budget(plain).judge is None
    with pytest.raises(ConfigError, match="judge='eval', but this worker has no eval judge"):
        _worker().with_budget(budget)
    with pytest.raises(ConfigError, match=r"RolloutBudget.judge='reward'; expected one of \['none', 'eval'\]"):
        RolloutBudget(1, 1, 2, judge="reward")


def test_the_dedicated_eval_engine_keeps_the_eval_judge_and_drops_the_training_one():
    data = eval_engine_config(_cfg(*REWARD, *EVAL, "controller.mode=async", "eval.every=1"))
    assert data["reward"]["judge"] is None
    assert data["eval"]["judge"]["model"] == "eval-judge"
    assert data["eval"]["judge"]["base_url"] == "http://127.0.0.1:8001/v1"


def _run(tmp_path: Path, config: dict) -> Path:
    run = tmp_path / "run"
    ckpt = run / "checkpoints" / "iter_1"
    (ckpt / "trainer").mkdir(parents=True)
    (ckpt / "trainer" / "COMPLETE").write_text("ok\n")
    (ckpt / "controller.json").write_text(json.dumps({"run_id": "r-1", "iteration": 1, "policy_version": 1}))
    (run / "checkpoints" / "latest").write_text("iter_1")
    (run / "config.yaml").write_text(json.dumps({"run": {"name": "r"}, "env": {"id": MATH, "split": "train"},
                                                 **config}))
    return run


def test_agentrl_eval_takes_the_runs_eval_judge_into_its_config_and_identity(tmp_path):
    judge = {"model": "train-judge", "base_url": "http://127.0.0.1:8000/v1"}
    run = _run(tmp_path, {"reward": {"judge": judge},
                          "eval": {"judge": {"model": "eval-judge", "base_url": "http://127.0.0.1:8001/v1"}}})
    target = resolve_target(str(run))
    cfg, train_cfg = eval_config(target)
    assert cfg.reward.judge is None and cfg.eval.judge.model == "eval-judge"
    assert eval_budget(cfg).judge == "eval"
    assert eval_identity(target, cfg)["judge"]["model"] == "eval-judge"
    other, _ = eval_config(target, ["eval.judge.model=another-judge"])
    assert eval_run_id(target, other) != eval_run_id(target, cfg)  # another judge: another eval
    profile, _ = eval_config(target, judge=False)  # agentrl tasks profile: the training reward's rule alone
    assert profile.eval.judge is None and eval_budget(profile, judge=False).judge == "none"
    assert "judge" not in eval_identity(target, profile)


def test_judges_are_the_same_by_model_and_url_or_pool_model():
    a = JudgeConfig(model="m", base_url="http://h:8000/v1")
    assert same_judge(a, JudgeConfig(model="m", base_url="http://h:8000/v1/"))
    # one model is one judge wherever it is served: its blind spots go with it
    assert same_judge(a, JudgeConfig(model="m", base_url="http://h:8001/v1"))
    assert same_judge(JudgeConfig(model="m", base_url="http://localhost:8000/v1"),
                      JudgeConfig(model="M", base_url="http://127.0.0.1:8000/v1"))
    assert not same_judge(a, JudgeConfig(model="m2", base_url="http://h:8000/v1"))
    assert same_judge(JudgeConfig(kind="pool", model="p"), JudgeConfig(kind="pool", model="p", num_engines=2))
    assert same_judge(JudgeConfig(kind="pool", model="/models/Qwen2.5-7B-Instruct/"),
                      JudgeConfig(model="Qwen/qwen2.5-7b-instruct", base_url="http://h:8000/v1"))
    assert not same_judge(a, None) and not same_judge(None, None)
    assert judge_name(a) == "m at http://h:8000/v1" and judge_name(JudgeConfig(kind="pool", model="p")) == \
        "p at a local pool" and judge_name(None) is None


def test_the_same_judge_for_reward_and_eval_starts_with_a_warning_that_names_it(caplog):
    a = JudgeConfig(model="m", base_url="http://h:8000/v1")
    with caplog.at_level(logging.WARNING, logger="agentrl.driver.judge"):
        assert warn_same_judge(a, JudgeConfig(model="m", base_url="http://h:8000/v1"))
        assert not warn_same_judge(a, JudgeConfig(model="m2", base_url="http://h:8001/v1"))
        assert not warn_same_judge(a, None) and not warn_same_judge(None, a)
    (rec,) = caplog.records
    assert rec.levelno == logging.WARNING
    assert rec.getMessage().startswith("eval.judge is the training reward's judge m at http://h:8000/v1: shared "
                                       "blind spots")


def test_agentrl_train_warns_when_the_eval_judge_is_the_training_one(caplog, monkeypatch, tmp_path):
    """``train`` warns before anything starts (here it stops at the run directory, a stand-in)."""
    import agentrl.driver.controller as controller

    class _Stop(Exception):
        pass

    def stop(*a, **k):
        raise _Stop

    monkeypatch.setattr(controller, "RunDir", stop)
    cfg = _cfg(f"run.dir={tmp_path}", *REWARD, "eval.judge.model=train-judge",
               "eval.judge.base_url=http://127.0.0.1:8000/v1/")
    with caplog.at_level(logging.WARNING, logger="agentrl.driver.judge"), pytest.raises(_Stop):
        controller.train(cfg)
    assert [r.getMessage()[:83] for r in caplog.records if r.name == "agentrl.driver.judge"] == [
        "eval.judge is the training reward's judge train-judge at http://127.0.0.1:8000/v1/:"]


def test_the_label_names_the_eval_judge_its_rubric_how_it_combines_and_the_training_judge():
    ev = EvalLLMJudge("q at http://b/v1", "math-answer-equivalence")
    assert judge_label(MATH, {}, llm_judge="m at http://a/v1", eval_judge=ev) == (
        "judge: q at http://b/v1 (LLM, rubric math-answer-equivalence) over the rule reward of agentrl/MathAnswer-v0 "
        "(the rule decides at >= 1); the training reward's judge: m at http://a/v1")
    assert judge_label(MATH, {}, eval_judge=EvalLLMJudge("q at http://b/v1", "r", "weighted", 0.25)) == (
        "judge: q at http://b/v1 (LLM, rubric r) weighted with the rule reward of agentrl/MathAnswer-v0 (rule "
        "weight 0.25); the training reward: the same rule")
    assert judge_label(MATH, None, eval_judge=EvalLLMJudge("q at a local pool", "r", "judge")) == (
        "judge: q at a local pool (LLM, rubric r; the rule reward of agentrl/MathAnswer-v0 not counted)")
    same = EvalLLMJudge("m at http://a/v1", "r", same=True)
    assert judge_label(MATH, {}, llm_judge="m at http://a/v1", eval_judge=same).endswith(
        "; the training reward's judge: m at http://a/v1 (the same judge)")
    assert judge_label("agentrl/HumanEval-v0", {"reward_tests": "visible"}, eval_judge=ev) == (
        "judge: q at http://b/v1 (LLM, rubric math-answer-equivalence) over the rule reward of agentrl/HumanEval-v0 "
        "with reward_tests='hidden' (the rule decides at >= 1); the training reward: the rule reward of "
        "agentrl/HumanEval-v0 with reward_tests='visible'")
    # from the configs: the rubric resolved, the combine settings, whether it is the training judge
    cfg = _cfg(*REWARD, *EVAL, "reward.combine=weighted", "reward.rule_weight=0.3")
    assert eval_llm_judge(cfg, cfg.reward.judge) == EvalLLMJudge(
        "eval-judge at http://127.0.0.1:8001/v1", "math-answer-equivalence", "weighted", 0.3, 1.0, False)
    assert eval_llm_judge(_cfg(*REWARD)) is None


def test_agentrl_eval_starts_the_eval_judge_before_the_engines_and_stops_it_after(tmp_path, monkeypatch, caplog):
    """``evaluate`` with ``eval.judge`` equal to the training reward's: warned, the eval
    judge's service started (role eval) before the engines and stopped after, the budget
    says ``judge="eval"`` and the settings line names the judge (stand-ins for Ray and the
    engines, as in test_eval_judge.py)."""
    import agentrl.commands.evaluate as evaluate_module

    events: list = []

    class _Done(Exception):
        pass

    class Pool:
        def __init__(self, cfg, cfg_dict, model_path, run_id, sandbox_hosts=()):
            events.append("engines")

        def ready(self):
            pass

        def rollout(self, requests, policy_version, budget=None):
            events.append(("rollout", budget.judge))
            raise _Done

        def kill(self):
            pass

    monkeypatch.setattr(evaluate_module, "EnginePool", Pool)
    monkeypatch.setattr(evaluate_module, "materialize",  # no export: the tiny model stands in for the checkpoint
                        lambda target, progress=None: dataclasses.replace(target, model="tiny-random-smollm2"))
    monkeypatch.setattr(evaluate_module, "connect", lambda cfg: False)
    monkeypatch.setattr(evaluate_module, "start_sandbox_hosts", lambda cfg, run_id: [])
    monkeypatch.setattr(evaluate_module, "stop_sandbox_hosts", lambda hosts: None)
    monkeypatch.setattr(evaluate_module, "reap_orphans", lambda *a, **k: None)
    monkeypatch.setattr(evaluate_module, "start_judge_service",
                        lambda cfg, run_id, url, role="reward": events.append(("start", role, cfg.eval.judge.model))
                        or "handle")
    monkeypatch.setattr(evaluate_module, "stop_judge_service", lambda handle: events.append(("stop", handle)))
    judge = {"model": "train-judge", "base_url": "http://127.0.0.1:8000/v1"}
    run = _run(tmp_path, {"reward": {"judge": judge}, "eval": {"judge": judge}})
    settings: dict = {}
    with caplog.at_level(logging.WARNING, logger="agentrl.driver.judge"), pytest.raises(_Done):
        evaluate_module.evaluate(str(run), ["eval.num_tasks=1", "eval.samples=1"],
                                 replay_url=f"sqlite:///{tmp_path / 'replay.db'}", on_settings=settings.update,
                                 progress=lambda phase: None)
    assert events == [("start", "eval", "train-judge"), "engines", ("rollout", "eval"), ("stop", "handle")]
    assert any(r.getMessage().startswith("eval.judge is the training reward's judge train-judge at "
                                         "http://127.0.0.1:8000/v1") for r in caplog.records)
    assert settings["judge"] == (
        "judge: train-judge at http://127.0.0.1:8000/v1 (LLM, rubric math-answer-equivalence) over the rule reward "
        "of agentrl/MathAnswer-v0 (the rule decides at >= 1); the training reward's judge: train-judge at "
        "http://127.0.0.1:8000/v1 (the same judge)")
