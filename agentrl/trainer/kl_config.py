"""``KLConfig``: the KL penalty toward a frozen reference policy (coefficient, estimator,
loss or reward mode, reference folder) that ``agentrl.trainer.kl`` and
``agentrl.trainer.reference`` apply. Imports no torch, so the run configuration can build and
check it."""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Literal, get_args

from agentrl.errors import ConfigError
from agentrl.trainer.documented import documented

KLEstimator = Literal["k1", "k2", "k3"]
"""Estimators of KL(current || reference) per token (Schulman 2020, "Approximating KL
Divergence"); see ``agentrl.trainer.kl``."""
KL_ESTIMATORS: tuple[str, ...] = get_args(KLEstimator)

KLMode = Literal["loss", "reward"]
"""Where the KL-to-reference term acts: added to the loss, or subtracted from the reward."""
KL_MODES: tuple[str, ...] = get_args(KLMode)

KL_DEFAULT_ESTIMATORS: dict[str, KLEstimator] = {"reward": "k1", "loss": "k3"}
"""``KLConfig.estimator`` when it is left ``None``, by ``KLConfig.mode``: k1 in the reward
(its policy gradient is exactly that of the KL; k2 and k3 there bias it), k3 in the loss
(unbiased and >= 0, as in GRPO; the gradient there is the same for every estimator). See
``agentrl.trainer.kl``."""

@dataclass
class KLConfig:
    """A KL penalty toward a frozen reference policy (the initial policy by default),
    estimated per loss token with k1, k2 or k3 (Schulman 2020, "Approximating KL
    Divergence"). Off by default (``coef`` 0). In ``mode='reward'`` use k1 (its policy
    gradient is the exact gradient of the KL), the default there; in ``mode='loss'`` the
    estimator sets the reported value and every one gets the gradient of KL(current ||
    reference), k3 by default. ``estimator=None`` (the default) is resolved at construction
    by ``mode`` (``KL_DEFAULT_ESTIMATORS``); ``validate`` warns (``UserWarning``, once per
    process and message) when a penalty in ``mode='reward'`` names k2 or k3. See
    ``agentrl.trainer.kl`` (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient
    estimation for RL")."""

    coef: float = documented(
        0.0,
        doc=(
            "Weight of the KL(current || reference) penalty; 0 (default) turns it off and no reference "
            "model is loaded. Must be >= 0."
        ),
    )
    estimator: KLEstimator | None = documented(
        None,
        doc=(
            "Per-token estimator of KL(current || reference) with d = log current - log reference "
            "(Schulman 2020): k1 = d (unbiased, can be negative), k2 = d^2 / 2 (low variance, biased), "
            "k3 = exp(-d) - 1 + d (unbiased and >= 0, as in GRPO). None (default): k1 in 'reward' mode, k3 in "
            "'loss' mode. 'reward' mode: use k1, the standard choice of PPO for RLHF, whose policy gradient is "
            "exactly that of the KL (k2 and k3 there bias it; naming one warns). 'loss' mode: the estimator is "
            "the value added to the loss and reported (actor/kl_loss); the gradient is the same for all three: "
            "d * grad log current per sampled token weighted by current / behavior, unbiased for grad "
            "KL(current || reference) (differentiating the estimate itself gives 0 in expectation for k1 and "
            "the gradient of KL(reference || current) for k3; Tang & Munos 2025), with the weight truncated at "
            "rollout_correction.is_cap when its importance weights are on, else at 2 (bounded variance for a "
            "little bias)."
        ),
    )
    mode: KLMode = documented(
        "loss",
        doc=(
            "'loss': coef times the aggregated estimate is added to the loss (loss_agg_mode, global "
            "normalisers), as in GRPO. 'reward': coef times the per-token estimate, summed over each turn's "
            "sampled tokens, is subtracted from that turn's reward before the advantage estimator runs, as in "
            "PPO for RLHF (verl's use_kl_in_reward)."
        ),
    )
    reference_path: str | None = documented(
        None,
        doc=(
            "Hugging Face folder of the reference model; None (default): the initial policy. Its vocabulary "
            "must equal the policy's."
        ),
    )

    def __post_init__(self) -> None:
        if self.estimator is None and self.mode in KL_DEFAULT_ESTIMATORS:
            self.estimator = KL_DEFAULT_ESTIMATORS[self.mode]

    def validate(self, prefix: str = "kl.") -> None:
        """Raise ``ConfigError`` naming the first invalid field (``prefix`` + name).

        Warns (``UserWarning``) when a penalty (``coef > 0``) in ``mode='reward'`` names k2
        or k3: accepted (a stored run keeps its penalty), but its policy gradient is biased
        (``agentrl.trainer.kl``). Python's default filter shows a message once per process."""
        c = self.coef
        if not (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c) and c >= 0.0):
            raise ConfigError(f"{prefix}coef={c!r}; expected a finite number >= 0 (0 turns the KL penalty off)")
        if self.mode not in KL_MODES:
            raise ConfigError(f"{prefix}mode={self.mode!r}; expected one of {KL_MODES}")
        if self.estimator not in KL_ESTIMATORS:
            raise ConfigError(f"{prefix}estimator={self.estimator!r}; expected one of {KL_ESTIMATORS}")
        if self.mode == "reward" and self.estimator != "k1" and c > 0:
            warnings.warn(
                f"kl.estimator={self.estimator!r} with kl.mode='reward': a per-token {self.estimator} penalty in "
                "the reward gives a biased policy gradient of KL(current || reference) (its expected score-function "
                "term is not the KL's; Tang & Munos 2025); k1, the default in reward mode, gives the exact one",
                UserWarning,
                stacklevel=1,
            )
        if self.reference_path is not None and not (isinstance(self.reference_path, str) and self.reference_path):
            raise ConfigError(f"{prefix}reference_path={self.reference_path!r}; expected a model folder path or None")
