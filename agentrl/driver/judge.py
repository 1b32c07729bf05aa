"""The eval judge, kept apart from the training reward so a policy is never judged by the
signal it was trained on.

An environment may declare the constructor kwargs that make it score as its evaluation
judge, as a class attribute::
    class HumanEvalEnv(TextEnv):
        judge_kwargs: ClassVar[Mapping[str, Any]] = {"reward_tests": "hidden"}

Training uses ``env.kwargs`` as configured (e.g. ``reward_tests: visible``: the examples
the prompt shows); every eval episode, ``agentrl eval`` and ``eval.every`` alike, is made
with ``env.kwargs`` updated by the declared ``judge_kwargs`` (``judge_env_kwargs``), so a
policy is judged on what it was not paid for. ``agentrl eval`` puts them into its config's
``env.kwargs`` (so they enter its ``eval_identity``: two evals under different judges never
share a run id); ``eval.every`` passes them with the eval budget to the run's engines,
which make that call's envs with them (``RolloutActor.rollout``). An environment that
declares nothing is judged by its training reward, and its evals are unchanged.

This is a general mechanism, not a HumanEval case: any registered env (ours or a user's,
found through the Gymnasium registry and ``env.import_modules``) can declare a judge.

An eval may also be scored by an LLM judge of its own (``eval.judge``, with ``eval.rubric``),
combined with that rule as ``reward.combine`` says (``agentrl.cluster.actors.judge_service``,
role ``eval``). The training reward's LLM judge (``reward.judge``) never scores an eval by
itself; naming it as ``eval.judge`` too is allowed, with a start-up warning
(``warn_same_judge``): a policy trained to please a judge is then measured by it.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Sequence

import environments
from agentrl.config import Config
from agentrl.config.reward_sections import JudgeConfig
from agentrl.errors import ContractError

__all__ = ["JUDGE_ATTRIBUTE", "EvalLLMJudge", "declared_judge_kwargs", "eval_llm_judge", "judge_env_kwargs",
           "judge_label", "judge_name", "same_judge", "warn_same_judge"]

log = logging.getLogger(__name__)

JUDGE_ATTRIBUTE = "judge_kwargs"
"""The env class attribute that declares the judge's kwargs (a mapping of str keys)."""


def _env_class(env_id: str, import_modules: Sequence[str]) -> Any:
    environments.import_env_modules(list(import_modules))
    return environments.env_class(env_id)


def declared_judge_kwargs(env_id: str, import_modules: Sequence[str] = ()) -> dict[str, Any]:
    """The ``judge_kwargs`` the env class registered as ``env_id`` declares; ``{}`` when it
    declares none (its training reward is its judge).

    Raises:
        ConfigError: ``env_id`` is not registered, or a module of ``import_modules`` fails.
        ContractError: the declaration is not a mapping with str keys.
    """
    cls = _env_class(env_id, import_modules)
    declared = getattr(cls, JUDGE_ATTRIBUTE, None)
    if declared is None:
        return {}
    if not isinstance(declared, Mapping) or not all(isinstance(k, str) for k in declared):
        raise ContractError(f"{env_id}: {getattr(cls, '__name__', cls)}.{JUDGE_ATTRIBUTE}={declared!r} must be a "
                            "mapping of constructor keyword names to values")
    return dict(declared)


def judge_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any], import_modules: Sequence[str] = ()) -> dict[str, Any]:
    """The kwargs eval episodes of ``env_id`` are made with: ``env_kwargs`` (the run's
    ``env.kwargs``) updated by the env's declared judge kwargs.

    Raises:
        ConfigError, ContractError: as ``declared_judge_kwargs``.
    """
    return {**dict(env_kwargs), **declared_judge_kwargs(env_id, import_modules)}


def judge_name(judge: JudgeConfig | None) -> str | None:
    """An LLM judge as reports name it: ``"<model> at <base_url>"`` (endpoint) or ``"<model>
    at a local pool"``; None for None."""
    if judge is None:
        return None
    return f"{judge.model} at {judge.base_url if judge.kind == 'endpoint' else 'a local pool'}"


def same_judge(a: JudgeConfig | None, b: JudgeConfig | None) -> bool:
    """Whether ``a`` and ``b`` are one judge for the purpose of blind spots: the same model,
    wherever it is served (an endpoint or a local pool, any server: ``localhost`` and
    ``127.0.0.1``, or two providers of one model, share its blind spots all the same). Models
    are compared by their last path part, case-insensitively (``Qwen/Qwen2.5-7B-Instruct``,
    ``/models/qwen2.5-7b-instruct/`` and a server's ``Qwen2.5-7B-Instruct`` are one model)."""
    if a is None or b is None:
        return False
    return _model_key(a.model) == _model_key(b.model)


def _model_key(model: str) -> str:
    return model.strip().rstrip("/").rsplit("/", 1)[-1].lower()


def warn_same_judge(train_judge: JudgeConfig | None, eval_judge: JudgeConfig | None) -> bool:
    """Log a WARNING naming the judge when ``eval_judge`` (``eval.judge``) is the training
    reward's (``reward.judge``, ``same_judge``): allowed, but the eval then shares the
    judge's blind spots with the reward the policy was trained on. Returns whether it
    warned."""
    if not same_judge(train_judge, eval_judge):
        return False
    log.warning("eval.judge is the training reward's judge %s: shared blind spots (an answer the policy learned to "
                "pass it with passes the eval too, so the eval cannot show that reward hacking); give eval.judge "
                "another model or server, or leave it unset to score evals by the rule", judge_name(eval_judge))
    return True


@dataclass(frozen=True)
class EvalLLMJudge:
    """The eval's LLM judge (``eval.judge``) as the eval's label names it (``judge_label``).

    Attributes:
        name: ``judge_name`` of it, e.g. ``"Qwen2.5-7B at http://127.0.0.1:8000/v1"``.
        rubric: the name of the rubric it scores by (``eval.rubric``, ``reward.rubric`` or
            the env class's ``judge_rubric``).
        combine, rule_weight, rule_pass: how its score combines with the rule reward
            (``reward.combine``, ``reward.rule_weight``, ``reward.rule_pass``).
        same: whether it is the training reward's judge too (``same_judge``).
    """

    name: str
    rubric: str
    combine: str = "rule_first"
    rule_weight: float = 0.5
    rule_pass: float = 1.0
    same: bool = False


def eval_llm_judge(cfg: Config, train_judge: JudgeConfig | None = None) -> EvalLLMJudge | None:
    """``cfg``'s eval LLM judge for ``judge_label``, or None when ``eval.judge`` is unset;
    ``train_judge``: the training run's ``reward.judge`` (``same``).

    Raises:
        ConfigError: no rubric for it, or an invalid one (``run_rubric``).
    """
    from agentrl.cluster.actors.judge_service import run_rubric  # heavy: ray

    j = cfg.eval.judge
    if j is None:
        return None
    r = cfg.reward
    return EvalLLMJudge(judge_name(j) or "", run_rubric(cfg, "eval").name, r.combine, r.rule_weight, r.rule_pass,
                        same_judge(train_judge, j))


def _what(kwargs: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items())


def _llm_label(env_id: str, judge: Mapping[str, Any], trained: Mapping[str, Any] | None, llm_judge: str | None,
               ev: EvalLLMJudge) -> str:
    rule = f"the rule reward of {env_id}" + (f" with {_what(judge)}" if judge else "")
    head = f"judge: {ev.name} (LLM, rubric {ev.rubric}"
    if ev.combine == "judge":
        text = f"{head}; {rule} not counted)"
    elif ev.combine == "weighted":
        text = f"{head}) weighted with {rule} (rule weight {ev.rule_weight:g})"
    else:
        text = f"{head}) over {rule} (the rule decides at >= {ev.rule_pass:g})"
    if llm_judge is not None:
        return f"{text}; the training reward's judge: {llm_judge}" + (" (the same judge)" if ev.same else "")
    if trained is None:
        return text
    if not trained:
        return f"{text}; the training reward: the same rule"
    return f"{text}; the training reward: the rule reward of {env_id} with {_what(trained)}"


def judge_label(env_id: str, train_kwargs: Mapping[str, Any] | None, import_modules: Sequence[str] = (),
                llm_judge: str | None = None, eval_judge: EvalLLMJudge | None = None) -> str:
    """One phrase for reports and summaries: which judge scores the eval, and whether it is
    the training reward. ``train_kwargs`` is the training run's ``env.kwargs`` (a key it does
    not set counts as the constructor's default); ``None`` (a bare model, not trained here):
    the judge alone. ``llm_judge``: the LLM judge the training reward came from
    (``reward.judge``, ``judge_name``, e.g. ``"Qwen2.5-7B at http://..."``): evals are never
    scored by it alone, and the phrase says so. ``eval_judge``: the eval's own LLM judge
    (``eval.judge``, ``eval_llm_judge``), named first, with its rubric, how it combines
    with the rule, and the training reward's judge.

    Examples: ``"judge reward_tests='hidden' (training reward: reward_tests='visible')"``,
    ``"judge reward_tests='hidden' (the training reward too)"``, ``"judge: the training
    reward (agentrl/Sokoban-v0 declares no separate judge)"``, ``"judge: Qwen at
    http://127.0.0.1:8001/v1 (LLM, rubric math-answer-equivalence) over the rule reward of
    agentrl/MathAnswer-v0 (the rule decides at >= 1); the training reward's judge: m at
    http://127.0.0.1:8000/v1"``.
    """
    judge = declared_judge_kwargs(env_id, import_modules)
    if llm_judge is not None and eval_judge is None:
        rule = f"the rule reward of {env_id}" + (f" with {_what(judge)}" if judge else "")
        return f"judge: {rule} (training reward: the LLM judge {llm_judge}, never used for evals)"
    if not judge and eval_judge is None:
        return f"judge: the training reward ({env_id} declares no separate judge)"
    what = _what(judge)
    if train_kwargs is None:
        return f"judge {what}" if eval_judge is None else _llm_label(env_id, judge, None, llm_judge, eval_judge)
    try:
        params = inspect.signature(_env_class(env_id, import_modules)).parameters
    except (TypeError, ValueError):
        params = {}

    def trained(key: str) -> Any:
        if key in train_kwargs:
            return train_kwargs[key]
        p = params.get(key)
        return p.default if p is not None and p.default is not inspect.Parameter.empty else None

    differs = [k for k, v in judge.items() if trained(k) != v]
    if eval_judge is not None:
        return _llm_label(env_id, judge, {k: trained(k) for k in differs}, llm_judge, eval_judge)
    if not differs:
        return f"judge {what} (the training reward too)"
    return f"judge {what} (training reward: " + ", ".join(f"{k}={trained(k)!r}" for k in differs) + ")"
