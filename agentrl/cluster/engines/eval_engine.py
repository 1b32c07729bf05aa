"""The dedicated eval engine of async training: a ``RolloutActor`` of its own, placed with
``cluster.placement.eval``, that evaluates one policy version at a time while the rollout
engines keep streaming (the schedule is the driver's, ``agentrl.driver.dedicated_eval``)."""

from __future__ import annotations

from typing import Any, Sequence

from agentrl.cluster.actors.placement import role_options
from agentrl.cluster.actors.rollout_actor import RolloutActor
from agentrl.config import config_from_dict

__all__ = ["eval_engine_config", "start_eval_engine"]


def eval_engine_config(cfg: Any) -> dict[str, Any]:
    """The eval engine's ``cfg_dict``: the run's with the eval section's budget in place of
    the rollout's, as ``agentrl eval`` builds it (``evaluate.eval_config``): its context is
    vLLM's ``max_model_len``; each rollout call passes the budget again
    (``agentrl.driver.evaluation.eval_budget``). Validated here, in the driver, so a budget that cannot work
    (``eval.max_new_tokens >= eval.max_context_tokens``) is a start-up error. Its training
    judge is off (``reward.judge`` None): the eval's episodes are scored by ``eval.judge``
    (kept; the eval budget's ``judge="eval"`` makes the engine score them through the
    service ``agentrl-judge-eval-<run_id>``), else by the env's rule.

    Raises:
        ConfigError: naming the values.
    """
    ev = cfg.eval
    data = cfg.model_dump(mode="json")
    data["rollout"].update(temperature=ev.temperature, top_p=1.0, top_k=-1, max_turns=ev.max_turns,
                           max_new_tokens=ev.max_new_tokens, max_context_tokens=ev.max_context_tokens)
    data["algorithm"].update(dynamic_sampling=False, overlong_buffer_tokens=0)
    # never the training judge: eval.judge (its own service) or the env's rule
    data.setdefault("reward", {})["judge"] = None
    config_from_dict(data)
    return data


def start_eval_engine(cfg: Any, model_path: str, run_id: str, sandbox_hosts: Sequence[Any] = ()) -> Any:
    """Start the dedicated eval engine's actor (``RolloutActor`` with
    ``eval_engine_config``, placed with ``cluster.placement.eval``, engine index
    ``rollout.num_engines`` in logs and sandbox labels); returns its handle at once (its
    constructor loads the model meanwhile; calls queue behind it).

    Raises:
        ConfigError: an eval budget the engine cannot take (``eval_engine_config``).
    """
    return RolloutActor.options(**role_options(cfg, "eval")).remote(
        eval_engine_config(cfg), model_path, run_id, engine_index=cfg.rollout.num_engines,
        sandbox_hosts=list(sandbox_hosts) or None)

