"""Does ``env.group_size`` give the advantage estimator a signal? The start-up check of a
training run, read from the estimator's registration in ``critics``' registry
(``critics.register_estimator``'s ``min_group_size`` / ``advised_group_size``), so a
user's estimator declares its own needs too.

A group-relative estimator (grpo, rloo, drgrpo: Shao et al. 2024, Ahmadian et al. 2024,
Liu et al. 2025) compares the rollouts of one task instance with each other; with a group
of one every advantage is 0 and the run never learns. GiGPO's step groups (Feng et al.
2025) still compare revisited anchor states, so a group of one only warns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentrl.errors import ConfigError
from critics.registry import ESTIMATORS, get_estimator

if TYPE_CHECKING:
    from agentrl.config import Config

__all__ = ["check_group_size"]


def check_group_size(cfg: Config) -> list[str]:
    """The group-size check of a training run (``agentrl.driver.controller.train`` calls
    it before anything starts; not part of ``Config`` validation, because evaluation
    configs reuse ``env.group_size`` for ``eval.samples``, where no advantage is computed).

    Args:
        cfg: the validated run config (``env.group_size``, ``algorithm.advantage``,
            ``algorithm.dynamic_sampling`` are read).

    Returns:
        Warnings to log once: ``env.group_size`` below the estimator's
        ``advised_group_size`` (gigpo with a group of one: only revisited anchor states give
        a signal).

    Raises:
        ConfigError: ``env.group_size`` below the estimator's ``min_group_size`` (grpo,
            rloo, drgrpo with 1: every advantage 0, every update skipped), or 1 with
            ``algorithm.dynamic_sampling`` (a group of one always has equal rewards, so
            every group would be dropped); the message names the value, the estimator and
            what to use instead. An ``algorithm.advantage`` that is not registered (naming
            the registered ones).
    """

    g, name = cfg.env.group_size, cfg.algorithm.advantage
    est = get_estimator(name)
    why = f" ({est.group_size_note})" if est.group_size_note else ""
    if g < est.min_group_size:
        alone = sorted(n for n, e in ESTIMATORS.items() if e.advised_group_size <= g)
        instead = (f", or an estimator with its full signal at {g} rollout(s) per task instance: "
                   f"{', '.join(alone)}") if alone else ""
        raise ConfigError(
            f"env.group_size={g} with algorithm.advantage={name!r}: the estimator needs at least "
            f"{est.min_group_size} rollouts per task instance{why}; with fewer every advantage is 0 and the run "
            f"would never learn; set env.group_size >= {est.min_group_size} (e.g. 4){instead}"
        )
    if cfg.algorithm.dynamic_sampling and g < 2:
        raise ConfigError(
            f"env.group_size={g} with algorithm.dynamic_sampling=true: dynamic sampling drops every group whose "
            "rewards are all equal, and a group of one always is, so nothing would be trained; set "
            "env.group_size >= 2 or algorithm.dynamic_sampling=false"
        )
    if g < est.advised_group_size:
        return [f"env.group_size={g} with algorithm.advantage={name!r}, below its advised group size "
                f"{est.advised_group_size}{why}; set env.group_size >= {est.advised_group_size} for its full signal"]
    return []
