"""The run's judges, each as one service every rollout engine calls: ``JudgeService`` (a
threaded Ray actor on the driver's node) holds the judge client of one role's judge and the
judge cache in the run's replay store, so the cache is one for all engines and the store is
opened on the machine that holds it (its key includes the model, so two judges share it).

A run has up to two judges, by role: ``reward`` (``reward.judge``, the training reward) and
``eval`` (``eval.judge``, the eval's episodes; its rubric ``eval.rubric``, else
``reward.rubric``, else the environment class's ``judge_rubric``). Both combine with the rule
as ``reward.combine``, ``reward.rule_weight`` and ``reward.rule_pass`` say.

* ``start_judge_service(cfg, run_id, replay_url, role)`` (driver): starts the role's service
  under the name ``judge_service_name(run_id, role)`` and runs its judge's health check
  before any engine starts: a judge that is down, too slow or answers garbage stops the run
  at start-up with a ``JudgeError`` naming it.
* ``rollout_scorer(cfg, run_id, role)`` (each rollout engine): the ``EpisodeScorer`` the
  engine's rollout worker judges its episodes with (``agentrl.rollout.judging``): the role's
  rubric (``role_rubric``), the combine settings, and the service's ``complete`` /
  ``cache_get`` / ``cache_put`` behind plain callables.
* ``stop_judge_service(handle)`` (driver, in its ``finally``): ends the service and, for a
  pool, its engines.

``reward.judge.kind: endpoint`` serves any OpenAI-compatible server; ``kind: pool`` is a local
pool of vLLM engines of the judge model (``agentrl.cluster.actors.judge_pool``). The pool's
settings and model are checked in the driver (a ``ConfigError`` before any actor starts); the
service starts the engines in its own constructor (``make_judge``), so they are its children
in Ray: ``stop_judge_service`` stops them, and they end with the service whatever kills it.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Literal

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

import environments
from agentrl.cluster.actors.judge_pool import (
    ENGINE_START_TIMEOUT_S,
    PoolJudge,
    pool_model_path,
    start_judge_pool,
    stop_judge_pool,
)
from agentrl.config import Config
from agentrl.config.reward_sections import JudgeConfig
from agentrl.errors import ConfigError, JudgeError
from agentrl.replay import ReplayStore
from agentrl.rewards.endpoint import EndpointJudge, worst_case_s
from agentrl.rewards.rubric import Rubric
from agentrl.rewards.scorer import EpisodeScorer
from agentrl.rewards.types import JudgeItem, JudgeReply, JudgeRequest

log = logging.getLogger(__name__)

RUBRIC_ATTRIBUTE = "judge_rubric"
"""The env class attribute that declares its rubric (a ``Rubric`` or a dict for
``Rubric.from_dict``), used when the config names none (``reward.rubric``)."""
_CALL_MARGIN_S = 30.0
JudgeRole = Literal["reward", "eval"]
"""Which judge of a run: ``reward`` (``reward.judge``) or ``eval`` (``eval.judge``)."""
ROLES: tuple[str, ...] = ("reward", "eval")


def _check_role(role: str) -> None:
    if role not in ROLES:
        raise ConfigError(f"judge role={role!r}; expected one of {list(ROLES)}")


def judge_field(role: JudgeRole) -> str:
    """The config field of ``role``'s judge: ``reward.judge`` or ``eval.judge``."""
    _check_role(role)
    return f"{role}.judge"


def role_judge(cfg: Config, role: JudgeRole) -> JudgeConfig | None:
    """``role``'s judge: ``cfg.reward.judge`` or ``cfg.eval.judge`` (None: not set)."""
    _check_role(role)
    return cfg.reward.judge if role == "reward" else cfg.eval.judge


def role_config(cfg: Config, role: JudgeRole) -> Config:
    """``cfg`` as ``role``'s judge reads it: for ``eval``, ``eval.judge`` in ``reward.judge``
    and the eval's rubric (``eval.rubric``, else ``reward.rubric``) in ``reward.rubric``, so
    the judge pool (``agentrl.cluster.actors.judge_pool``, which reads ``reward.judge``)
    serves either; ``reward``: ``cfg`` itself."""
    if role == "reward":
        return cfg
    _check_role(role)
    rubric = cfg.eval.rubric if cfg.eval.rubric is not None else cfg.reward.rubric
    return cfg.model_copy(update={"reward": cfg.reward.model_copy(update={"judge": cfg.eval.judge,
                                                                          "rubric": rubric})})


def judge_service_name(run_id: str, role: JudgeRole = "reward") -> str:
    """The Ray actor name of ``role``'s service: ``agentrl-judge-<run_id>`` (reward) or
    ``agentrl-judge-eval-<run_id>`` (eval)."""
    _check_role(role)
    return f"agentrl-judge-{run_id}" if role == "reward" else f"agentrl-judge-eval-{run_id}"


def judges_groups(cfg: Config) -> bool:
    """Whether a judge of the run (``reward.judge`` or ``eval.judge``) scores whole groups in
    one call (a group-mode rubric): the engine pool then keeps each group on one engine."""
    return any(role_judge(cfg, role) is not None and run_rubric(cfg, role).mode == "group" for role in ROLES)


def make_judge(cfg: Config, role: JudgeRole = "reward") -> EndpointJudge | PoolJudge:
    """The judge client of ``role``'s judge (``reward.judge`` or ``eval.judge``): an
    ``EndpointJudge`` (``kind: endpoint``), or for ``kind: pool`` a ``PoolJudge`` whose
    engines this call starts (``start_judge_pool``; Ray must be up; the JudgeService calls
    it, the driver checks a pool with ``check_judge_config``).

    Raises:
        ConfigError: no judge configured for ``role``, or a bad setting.
    """
    j = role_judge(cfg, role)
    if j is None:
        raise ConfigError(f"{judge_field(role)} is not set; there is no judge to make")
    if j.kind == "pool":
        return start_judge_pool(role_config(cfg, role))
    return EndpointJudge(j.base_url or "", j.model, api_key_env=j.api_key_env, max_concurrency=j.max_concurrency,
                         max_retries=j.max_retries, backoff_s=j.backoff_s, timeout_s=j.timeout_s,
                         temperature=j.temperature, max_tokens=j.max_tokens, structured=j.structured)


def check_judge_config(cfg: Config, role: JudgeRole = "reward") -> None:
    """Check ``role``'s judge without starting anything (driver side): the endpoint client's
    settings, or the pool's settings and its model (``pool_model_path``).

    Raises:
        ConfigError: naming the bad value.
    """
    j = role_judge(cfg, role)
    if j is not None and j.kind == "pool":
        pool_model_path(role_config(cfg, role))
    else:
        make_judge(cfg, role)


def run_rubric(cfg: Config, role: JudgeRole = "reward") -> Rubric:
    """The rubric ``role``'s judge scores by: ``reward``: ``reward.rubric``; ``eval``:
    ``eval.rubric``, else ``reward.rubric``; else the env class's ``judge_rubric``.

    Raises:
        ConfigError: none gives one, or the one given is invalid.
    """
    _check_role(role)
    given = cfg.eval.rubric if role == "eval" and cfg.eval.rubric is not None else cfg.reward.rubric
    if given is not None:
        return Rubric.from_dict(given)
    environments.import_env_modules(list(cfg.env.import_modules))
    declared = getattr(environments.env_class(cfg.env.id), RUBRIC_ATTRIBUTE, None)
    if declared is None:
        where = "eval.rubric or reward.rubric" if role == "eval" else "reward.rubric"
        raise ConfigError(f"{judge_field(role)} is set but no rubric: give {where}, or declare {RUBRIC_ATTRIBUTE} on "
                          f"the class of {cfg.env.id!r}")
    return declared if isinstance(declared, Rubric) else Rubric.from_dict(declared)


@ray.remote
class JudgeService:
    """The judge client and the judge cache of a run (module docstring). Threaded: calls run
    side by side up to ``max_concurrency``; the client limits its own calls in flight.
    ``role``: which judge of the config it serves (``reward`` or ``eval``)."""

    def __init__(self, cfg_dict: dict, replay_url: str | None, role: JudgeRole = "reward") -> None:
        cfg = Config.model_validate(cfg_dict)
        self.judge = make_judge(cfg, role)
        self.store = ReplayStore(replay_url) if replay_url else None

    def model(self) -> str:
        return self.judge.model

    def check(self) -> None:
        self.judge.check()

    def complete(self, request: JudgeRequest) -> JudgeReply:
        return self.judge.complete(request)

    def cache_get(self, key: str) -> str | None:
        return None if self.store is None else self.store.judge_cache_get([key]).get(key)

    def cache_put(self, key: str, model: str, rubric_digest: str, output: str) -> None:
        if self.store is not None:
            self.store.judge_cache_put([(key, model, rubric_digest, output)])

    def stats(self) -> dict[str, int]:
        return {"calls": self.judge.calls, "retries": self.judge.retries, "failures": self.judge.failures}

    def stop(self) -> None:
        """End a pool's engines (nothing for an endpoint)."""
        if isinstance(self.judge, PoolJudge):
            stop_judge_pool(self.judge)


def start_judge_service(cfg: Config, run_id: str, replay_url: str | None, role: JudgeRole = "reward") -> Any:
    """Start ``role``'s judge service (``judge_service_name(run_id, role)``) and check its
    judge (driver side; Ray must be up).

    Returns:
        The actor handle, or None when the run has no judge of that role (``reward.judge`` or
        ``eval.judge`` unset).

    Raises:
        ConfigError: a bad setting (a pool's model that does not resolve included), no rubric.
        JudgeError: the health check failed (the judge is down, slow or answers garbage; a
            pool engine that failed to start); the service (and a pool's engines) is
            stopped first.
    """
    j = role_judge(cfg, role)
    if j is None:
        return None
    check_judge_config(cfg, role)  # a bad setting is a ConfigError here, in the driver, not in an actor
    check_rubric(cfg, run_rubric(cfg, role), role)
    # on the driver's node: the key's environment variable and the replay store's file are there
    here = NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(), soft=False)
    handle = JudgeService.options(name=judge_service_name(run_id, role), num_cpus=0, scheduling_strategy=here,
                                  max_concurrency=j.max_concurrency + 4).remote(cfg.model_dump(mode="json"),
                                                                                replay_url, role)
    wait_s = j.timeout_s + _CALL_MARGIN_S + (ENGINE_START_TIMEOUT_S if j.kind == "pool" else 0.0)
    try:
        ray.get(handle.check.remote(), timeout=wait_s)
    except Exception as exc:
        stop_judge_service(handle)
        cause = exc.cause if isinstance(getattr(exc, "cause", None), JudgeError) else exc
        raise JudgeError(f"the judge ({judge_field(role)}) did not pass its start-up check: {cause}") from None
    where = j.base_url if j.kind == "endpoint" else f"a local pool of {j.num_engines} engine(s)"
    log.info("%s: %s at %s (reward.combine=%s)", judge_field(role), j.model, where, cfg.reward.combine)
    return handle


def judge_settings(j: JudgeConfig) -> dict[str, Any]:
    """What of a judge's settings, besides its model, changes its answers and so enters every
    cache key (``EpisodeScorer(judge_settings=...)``): where it is (the endpoint's base URL,
    or a local pool and its dtype), its temperature, its answer cap and structured output. Two
    judges that differ in any of them (a training and an eval judge serving the same model name
    on two servers, say) never share a cached answer."""
    where = (j.base_url or "").rstrip("/") if j.kind == "endpoint" else f"pool:{j.dtype}"
    return {"where": where, "temperature": float(j.temperature), "max_tokens": int(j.max_tokens),
            "structured": bool(j.structured or j.kind == "pool")}


def check_rubric(cfg: Config, rubric: Rubric, role: JudgeRole = "reward") -> None:
    """Render ``rubric`` once with a sample episode (every template variable given), so a
    template that names a variable that does not exist stops the run at start-up, not every
    episode; and for a local pool judging groups, check that the judge's ``max_tokens`` can
    hold the shortest answer for a whole group.

    Raises:
        ConfigError: naming the rubric and what failed.
    """
    j = role_judge(cfg, role)
    sample = JudgeItem(task="sample task", reference="sample reference", answer="sample answer",
                       transcript="[turn 0 action]\nsample", tool_outputs=("sample output",), rule_reward=0.0)
    # a group is a task's rollouts: env.group_size in training, eval.samples in an eval
    size, size_key = (cfg.eval.samples, "eval.samples") if role == "eval" else (cfg.env.group_size, "env.group_size")
    n = max(1, int(size)) if rubric.mode == "group" else None
    req = rubric.request([sample] * n if n else sample, j.model if j is not None else "")
    if j is not None and j.kind == "pool" and n:
        answer = {"answers": [{"id": i, "scores": {c.name: 0.5 for c in rubric.criteria}, "reason": ""}
                              for i in range(n)]}
        # about 1 token per 2.5 characters of this JSON (digits, keys, braces), then room for reasons
        need = int(len(json.dumps(answer)) / 2.5) + 16 * n
        if j.max_tokens < need:
            raise ConfigError(f"{judge_field(role)}.max_tokens={j.max_tokens}: a group of {size_key}={n} answers under "
                              f"rubric {rubric.name!r} needs about {need} tokens at the least (every id and criterion "
                              "written out), so every group answer would be cut; raise it")
    del req


def stop_judge_service(handle: Any) -> None:
    """Stop the service: a pool's engines first (waited for up to 30 s), then its actor."""
    if handle is not None:
        try:
            ray.get(handle.stop.remote(), timeout=_CALL_MARGIN_S)
        except Exception:  # noqa: BLE001 - gone or stuck: the kill below ends its children too
            pass
        try:
            ray.kill(handle)
        except Exception:  # noqa: BLE001 - already gone
            pass


def rollout_scorer(cfg: Config, run_id: str, role: JudgeRole = "reward") -> EpisodeScorer | None:
    """The ``EpisodeScorer`` of a rollout engine over ``role``'s judge service, or None when
    the run has no judge of that role.

    Raises:
        ConfigError: no rubric, or the service is not running (the driver starts it before
            the engines; ``agentrl eval`` before its rollout).
    """
    j = role_judge(cfg, role)
    if j is None:
        return None
    name = judge_service_name(run_id, role)
    try:
        service = ray.get_actor(name)
    except ValueError:
        raise ConfigError(f"{judge_field(role)} is set but the run's judge service {name!r} is not running; it is "
                          "started by the controller (or agentrl eval) before the engines") from None
    # every attempt, every backoff, and calls queued ahead of it at the service's concurrency
    wait_s = worst_case_s(j.timeout_s, j.max_retries, j.backoff_s) * 2 + _CALL_MARGIN_S

    def complete(req: JudgeRequest) -> JudgeReply:
        try:
            return ray.get(service.complete.remote(req), timeout=wait_s)
        except ray.exceptions.RayTaskError as exc:
            cause = exc.cause if isinstance(exc.cause, JudgeError) else exc
            raise JudgeError(str(cause)) from None
        except (ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError) as exc:
            raise JudgeError(f"the run's judge service {name!r} did not answer: {type(exc).__name__}: {exc}") from None

    return EpisodeScorer(run_rubric(cfg, role), complete, model=j.model, combine_mode=cfg.reward.combine,
                         rule_weight=cfg.reward.rule_weight, rule_pass=cfg.reward.rule_pass,
                         success_threshold=cfg.reward.success_threshold, judge_settings=judge_settings(j),
                         cache_get=lambda key: ray.get(service.cache_get.remote(key), timeout=_CALL_MARGIN_S),
                         cache_put=lambda *a: ray.get(service.cache_put.remote(*a), timeout=_CALL_MARGIN_S),
                         max_workers=j.max_concurrency)
