"""Advantage estimators by name (``algorithm.advantage`` in the run config).

The estimators work at different levels, so they do not share one signature:

=============  =========================  ==============================================
name           function                   input → output
=============  =========================  ==============================================
``grpo``       ``grpo_advantages``        ``rewards [N], group_ids [N]`` → ``[N]``
``rloo``       ``rloo_advantages``        same; leave-one-out baseline, no std
``drgrpo``     ``drgrpo_advantages``      same; mean baseline, no std (Dr. GRPO)
``gigpo``      ``gigpo_advantages``       per-step rewards/anchors → ``[T_i]`` per traj.
``turn_critic`` ``turn_gae``              ``rewards [K], values [K]`` → ``([K], [K])``
``gae``        ``gae``                    ``[B, T]`` rewards/values/mask → ``([B,T],)*2``
=============  =========================  ==============================================

``turn_critic`` and ``gae`` need a learned critic: the controller applies them to episodes
through ``turn_critic_advantages`` (one value per turn) and ``token_critic_advantages`` (one
value per sampled token, the chain running across turns; ``algorithm.token_gamma`` /
``token_lam``).

Users add their own with ``register_estimator("my_adv", fn)``.
"""

from __future__ import annotations

import re
from typing import Callable

from agentrl.errors import ConfigError
from critics.gae import gae, turn_gae
from critics.gigpo import gigpo_advantages
from critics.grpo import drgrpo_advantages, grpo_advantages, rloo_advantages

Estimator = Callable[..., object]

ESTIMATORS: dict[str, Estimator] = {
    "grpo": grpo_advantages,
    "rloo": rloo_advantages,
    "drgrpo": drgrpo_advantages,
    "gigpo": gigpo_advantages,
    "turn_critic": turn_gae,
    "gae": gae,
}
"""Registered estimators by name. Read it freely; add to it with ``register_estimator``."""

_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_.\-]*$")


def get_estimator(name: str) -> Estimator:
    """The estimator registered as ``name``.

    Raises:
        ConfigError: unknown name; the message lists the known names.
    """
    try:
        return ESTIMATORS[name]
    except (KeyError, TypeError):
        raise ConfigError(
            f"unknown advantage estimator {name!r}; known: {', '.join(sorted(ESTIMATORS))} "
            "(add one with critics.register_estimator)"
        ) from None


def register_estimator(name: str, fn: Estimator, *, overwrite: bool = False) -> None:
    """Register ``fn`` under ``name`` so ``get_estimator(name)`` returns it.

    The function should be pure (no I/O) and document its shapes, like the built-ins.

    Args:
        name: a letter followed by letters, digits, ``_``, ``.`` or ``-``.
        fn: the estimator, a callable.
        overwrite: replace an existing registration (including a built-in) instead of
            raising.

    Raises:
        ConfigError: bad name, ``fn`` not callable, or ``name`` already registered and
            ``overwrite`` is False.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ConfigError(
            f"estimator name {name!r}; expected a letter followed by letters, digits, '_', "
            "'.' or '-'"
        )
    if not callable(fn):
        raise ConfigError(f"estimator {name!r}: {fn!r} is not callable")
    if name in ESTIMATORS and not overwrite:
        raise ConfigError(
            f"estimator {name!r} is already registered ({ESTIMATORS[name]!r}); pass "
            "overwrite=True to replace it"
        )
    ESTIMATORS[name] = fn
