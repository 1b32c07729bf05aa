"""The KL-to-reference penalty per token: its value (``kl_penalty``: k1, k2, k3) and the
loss term whose gradient is that of KL(current ‖ reference) (``kl_loss_term``).

Which estimator for which mode (``TrainerConfig.kl``):

- ``kl.mode: reward`` (the penalty is subtracted from each turn's reward, PPO for RLHF:
  Ouyang et al. 2022, "Training language models to follow instructions with human
  feedback", Eq. 2; Ziegler et al. 2019, Sec. 2): use **k1**. The policy gradient then
  multiplies each token's score by the penalties of that token and the later ones, and
  with k1 = log current - log reference that is exactly the gradient of the sequence-level
  KL(current ‖ reference) (Tang & Munos 2025, "On a few pitfalls in KL divergence gradient
  estimation for RL"). k3 and k2 there give a biased gradient: their expected
  score-function term is not the KL's (k3 adds ``E[(ref / current - 1) grad log current]``).
- ``kl.mode: loss`` (a term of the loss, as GRPO, Shao et al. 2024, Eq. 3): the estimator
  sets only the *value* (what ``actor/kl_loss`` and the loss report); **k3** (unbiased,
  >= 0) is the default. The gradient is the same for every estimator: the score-function
  gradient of KL(current ‖ reference) at each sampled state (``kl_loss_term``).

Why not differentiate the estimate (as GRPO's formula reads, and verl, TRL and slime did
before fixing it; Schulman 2020, "Approximating KL Divergence", gives the estimators for
values, not gradients): the samples come from the policy, so the expectation has a
gradient of its own that autograd on ``k(log_probs)`` never sees. With ``d = log pi -
log ref`` on a token ``y ~ pi``:

- ``grad k1 = grad log pi(y)``, whose expectation is 0: no regularisation at all;
- ``grad k3 = (1 - ref / pi) grad log pi(y)``, whose expectation is ``sum_y (pi - ref)
  grad log pi(y) = grad KL(ref ‖ pi)``, the reverse direction;
- ``grad k2 = d grad log pi(y)``, whose expectation is ``grad KL(pi ‖ ref)`` (right).

The true gradient is ``grad KL(pi ‖ ref) = E_{y~pi}[d(y) grad log pi(y)]`` (the
``E[grad d] = E[grad log pi] = 0`` term drops). ``kl_loss_term`` uses this form for every
estimator (a straight-through term: value ``k``, gradient ``d grad log pi``; verl's
``"k3+"``): the member ``b = 0`` of the unbiased family ``(d + b) grad log pi`` (any
constant ``b``), which is also k2's own derivative and the ratio trick ``(pi / sg(pi)) k3``;
the ratio trick on k1 gives ``b = 1``, which near the reference (small ``d``) adds noise of
order 1 to every token's gradient.

Off-policy samples: tokens come from the behavior policy ``mu`` (the engine, possibly some
versions behind), while the gradient is wanted at the current ``pi``, so each token's
coefficient carries the importance weight ``rho = pi / mu`` (detached):
``E_{y~mu}[rho d grad log pi] = grad KL(pi ‖ ref)``. In ``ppo_loss`` ``rho`` is built as
the policy-gradient term's weight is: ``current / proximal`` (1 in the first pass over a
batch, up to rounding) times the rollout-correction weight ``proximal / behavior``
(truncated at ``is_cap``), without PPO's clipping (the KL has no trust region to keep),
and then truncated as a whole (below). Without a rollout correction the second factor is
1, and the proximal log-probs are the trainer's own at the weights the update starts from
(the batch's ``proximal_log_probs`` when it carries them, else the trainer's
recomputation in the first pass), not the engine's: the gap between proximal and behavior
(engine/trainer numerics, and the policy versions an asynchronous sample is behind) is then
left uncorrected in the KL gradient exactly as in the policy-gradient term, and a
``rollout_correction.is_level`` corrects both.

Truncation: ``current / proximal`` is bounded only by the log-ratio clamp (``e^20``), so
with ``ppo_epochs > 1`` a token whose probability grew during the update would put an
unbounded weight on its KL gradient. ``ppo_loss`` uses ``min(rho, c)`` instead: truncated
importance sampling, as V-trace truncates ``pi / mu`` at ``rho_bar`` (Espeholt et al. 2018,
"IMPALA", Sec. 4.1) and TIS at a cap (Yao et al. 2025, "Your Efficient RL Framework
Secretly Brings You Off-Policy RL Training"), with ``c`` the rollout correction's
``is_cap`` when its importance weights are on, else ``KL_IMPORTANCE_CAP``
(``kl_importance_cap``). The trade: each token's coefficient is bounded,
``|c d| <= 20 c``, so no token can dominate the step (bounded variance), at the price of a
bias on the tokens with ``rho > c``: those the current policy already samples more than
the behavior policy did get less of the KL's pull than the exact gradient gives (as
V-trace's truncated ``rho_bar`` evaluates a policy between the behavior and the target
one). With ``ppo_epochs == 1`` and no correction ``rho`` is 1 and nothing is cut.

As with the policy-gradient term, the state distribution is not differentiated: the term
regularises each sampled state's next-token distribution; the part of the sequence-level
KL's gradient that runs through later tokens is what a k1 penalty in the reward carries.
"""

from __future__ import annotations

import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import KL_ESTIMATORS, KLEstimator, RolloutCorrectionConfig

__all__ = ["KL_IMPORTANCE_CAP", "MAX_ABS_KL_LOG_RATIO", "kl_importance_cap", "kl_loss_term", "kl_penalty"]

MAX_ABS_KL_LOG_RATIO = 20.0
"""``log current - log reference`` is clamped to ±20 before ``exp`` (fp32 ``exp(89) =
inf``); the same clamped value sets the gradient's coefficient."""

KL_IMPORTANCE_CAP = 2.0
"""Truncation of the KL term's importance weight in ``ppo_loss`` (``current / proximal``
times the rollout-correction weight) when no rollout correction sets one
(``kl_importance_cap``): the default ``RolloutCorrectionConfig.is_cap``, TIS's usual cap.
Bias/variance trade: module docstring."""


def kl_importance_cap(rollout_correction: RolloutCorrectionConfig) -> float:
    """The truncation of the KL term's importance weight in ``ppo_loss``
    (``kl_importance_cap=``): ``rollout_correction.is_cap`` when its importance weights are
    on (``is_level`` set), so the policy-gradient and KL terms are cut at the same cap; else
    ``KL_IMPORTANCE_CAP``."""
    return float(rollout_correction.is_cap) if rollout_correction.is_level is not None else KL_IMPORTANCE_CAP


def _log_ratio(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: str) -> torch.Tensor:
    if estimator not in KL_ESTIMATORS:
        raise ConfigError(f"kl estimator={estimator!r}; expected one of {KL_ESTIMATORS}")
    if log_probs.shape != ref_log_probs.shape:
        raise ContractError(
            f"ref_log_probs has shape {tuple(ref_log_probs.shape)}; expected {tuple(log_probs.shape)} like log_probs"
        )
    return (log_probs.float() - ref_log_probs.float()).clamp(-MAX_ABS_KL_LOG_RATIO, MAX_ABS_KL_LOG_RATIO)  # (T,)


def kl_penalty(
    log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(current ‖ reference) from the log-probs of the sampled
    tokens (Schulman 2020, "Approximating KL Divergence", http://joschu.net/blog/kl-approx.html).

    With ``d = log_probs - ref_log_probs`` (clamped to ``±MAX_ABS_KL_LOG_RATIO`` so that
    ``exp`` stays finite in fp32) and ``r = exp(-d) = ref / current``:

    - ``k1 = d``: unbiased, high variance, negative on some tokens.
    - ``k2 = d^2 / 2``: biased, low variance, >= 0.
    - ``k3 = (r - 1) - log r = exp(-d) - 1 + d``: unbiased, >= 0 (GRPO's choice).
      Computed as ``expm1(-d) + d`` (no cancellation at small d).

    This is the *value*. Its autograd derivative is that of the formula (``1``, ``d``,
    ``1 - exp(-d)``), which for k1 and k3 is **not** the gradient of the KL (see the
    module docstring): a loss takes ``kl_loss_term``.

    Args:
        log_probs: ``[T]`` float32, the policy's log-probs of the sampled tokens (nats).
        ref_log_probs: ``[T]`` float32, the reference model's log-probs of the same tokens.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``.

    Returns:
        ``[T]`` float32 per-token estimates (nats). Masking is the caller's.

    Raises:
        ConfigError: unknown ``estimator``.
        ContractError: shapes that differ.
    """
    d = _log_ratio(log_probs, ref_log_probs, estimator)  # (T,)
    if estimator == "k1":
        return d  # (T,)
    if estimator == "k2":
        return 0.5 * d * d  # (T,)
    return torch.expm1(-d) + d  # (T,)


def kl_loss_term(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    estimator: KLEstimator = "k3",
    importance_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token KL-to-reference loss term: its value is the estimate ``kl_penalty`` gives,
    its gradient the score-function gradient of KL(current ‖ reference).

    ``term_t = k_t + (c_t * log_probs_t - sg(c_t * log_probs_t))`` with ``c_t = sg(rho_t
    d_t)``, ``d_t`` the clamped log-ratio and ``rho_t`` the importance weight (1 when
    ``None``). So ``term_t == k_t`` in value (bit for bit), and ``d term_t / d log_probs_t
    = rho_t d_t``, whose expectation over tokens drawn from the sampling policy is
    ``grad KL(current ‖ reference)`` at that state, for k1, k2 and k3 alike (module
    docstring; Tang & Munos 2025; verl's straight-through ``"k3+"``). The reference's
    log-probs get no gradient.

    Args:
        log_probs: ``[T]`` float32, current log-probs of the sampled tokens (with grad).
        ref_log_probs: ``[T]`` float32, the reference's log-probs (detached here).
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``: the value.
        importance_weights: ``[T]`` float32 ``current / behavior`` per token (detached
            here; ``ppo_loss`` passes it truncated), or ``None`` for on-policy samples.

    Returns:
        ``[T]`` float32 per-token terms (nats). Masking and aggregation are the caller's.

    Raises:
        ConfigError: unknown ``estimator``.
        ContractError: shapes that differ.
    """
    ref = ref_log_probs.detach()
    value = kl_penalty(log_probs.detach(), ref, estimator)  # (T,)
    coef = _log_ratio(log_probs.detach(), ref, estimator)  # (T,) d
    if importance_weights is not None:
        if importance_weights.shape != log_probs.shape:
            raise ContractError(
                f"importance_weights has shape {tuple(importance_weights.shape)}; expected {tuple(log_probs.shape)}"
            )
        coef = coef * importance_weights.detach().float()  # (T,) rho * d
    surrogate = coef * log_probs.float()  # (T,) gradient rho * d
    return value + (surrogate - surrogate.detach())  # (T,) value k
