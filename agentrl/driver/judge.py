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
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any, Sequence

import environments
from agentrl.errors import ContractError

__all__ = ["JUDGE_ATTRIBUTE", "declared_judge_kwargs", "judge_env_kwargs", "judge_label"]

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


def judge_label(env_id: str, train_kwargs: Mapping[str, Any] | None, import_modules: Sequence[str] = (),
                llm_judge: str | None = None) -> str:
    """One phrase for reports and summaries: which judge scores the eval, and whether it is
    the training reward. ``train_kwargs`` is the training run's ``env.kwargs`` (a key it does
    not set counts as the constructor's default); ``None`` (a bare model, not trained here):
    the judge alone. ``llm_judge``: the LLM judge the training reward came from
    (``reward.judge``, e.g. ``"Qwen2.5-7B at http://..."``): evals are never scored by it,
    and the phrase says so.

    Examples: ``"judge reward_tests='hidden' (training reward: reward_tests='visible')"``,
    ``"judge reward_tests='hidden' (the training reward too)"``, ``"judge: the training
    reward (agentrl/Sokoban-v0 declares no separate judge)"``.
    """
    judge = declared_judge_kwargs(env_id, import_modules)
    if llm_judge is not None:
        rule = f"the rule reward of {env_id}" + (" with " + ", ".join(f"{k}={v!r}" for k, v in judge.items())
                                                  if judge else "")
        return f"judge: {rule} (training reward: the LLM judge {llm_judge}, never used for evals)"
    if not judge:
        return f"judge: the training reward ({env_id} declares no separate judge)"
    what = ", ".join(f"{k}={v!r}" for k, v in judge.items())
    if train_kwargs is None:
        return f"judge {what}"
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
    if not differs:
        return f"judge {what} (the training reward too)"
    return f"judge {what} (training reward: " + ", ".join(f"{k}={trained(k)!r}" for k in differs) + ")"
