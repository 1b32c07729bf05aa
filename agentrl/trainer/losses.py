"""Pure loss functions of the trainers: token log-probs, entropy, the policy loss (``ppo_loss``) and the
critic's (optionally clipped) value loss (``value_loss_terms``).

The policy loss keeps the three log-probs apart (docs/design.md): ``behavior_log_probs`` (the
engine's), ``proximal_log_probs`` (the trainer's at the weights the update starts from)
and the current ones. ``rollout_correction`` turns the behavior/proximal mismatch into
detached per-token weights and masks (``agentrl.trainer.correction``, re-exported here);
``ppo_loss`` is the decoupled PPO-clip loss with
clip-higher and dual clip, weighted and masked by that correction, plus an optional
KL-to-reference term (``agentrl.trainer.kl``: value k1 / k2 / k3, gradient that of
KL(current ‖ reference)), all aggregated with global normalisers (``aggregate_loss``);
``rollout_corr_metrics`` gives the batch's ``rollout_corr/*`` metrics from additive
per-micro-batch sums. Without correction, dual
clip or KL, ``ppo_loss`` is the plain PPO-clip loss.

Everything here is a function of tensors; nothing touches a model, a process group or a
file. Shapes are 1-D over tokens (``T``), the layout of ``TokenBatch``, or over value
positions (``N``), the layout of ``ValueBatch``.

Memory: a ``[T, V]`` logits tensor for a 49,152-token vocabulary is 196 KB per token in
fp32. ``logprobs_from_logits`` and ``entropy_from_logits`` therefore work on chunks of
``chunk_tokens`` rows at a time, and when the logits require grad each chunk runs under
activation checkpointing, so autograd keeps only the logits (which the model produced
anyway) and never a second ``[T, V]`` fp32 copy (the scaled / softmaxed logits are rebuilt
chunk by chunk during backward). Peak extra memory is about ``chunk_tokens * V * 4`` bytes
times a small constant.
"""

from __future__ import annotations

import math

import torch
from torch.utils.checkpoint import checkpoint

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import (
    DEFAULT_CHUNK_TOKENS,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    KLEstimator,
    LossAggMode,
    validate_clip_ratios,
    validate_dual_clip_c,
)
from agentrl.trainer.correction import (
    MAX_ABS_LOG_RATIO,
    ROLLOUT_CORR_SUMS,
    RolloutCorrection,
    quantile,
    rollout_corr_metrics,
    rollout_correction,
)
from agentrl.trainer.kl import KL_IMPORTANCE_CAP, kl_loss_term, kl_penalty

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "LOSS_AGG_MODES",
    "LossAggMode",
    "MAX_ABS_LOG_RATIO",
    "PPO_TOKEN_SUM_METRICS",
    "ROLLOUT_CORR_SUMS",
    "RolloutCorrection",
    "aggregate_loss",
    "entropy_from_logits",
    "kl_loss_term",
    "kl_penalty",
    "logprobs_from_logits",
    "ppo_loss",
    "quantile",
    "rollout_corr_metrics",
    "rollout_correction",
    "value_loss_terms",
]

def _check_temperature(temperature: float) -> None:
    if not (isinstance(temperature, (int, float)) and temperature > 0.0 and temperature < float("inf")):
        raise ConfigError(
            f"temperature={temperature!r}; expected a finite float > 0 (greedy sampling at "
            "temperature 0 has no log-probs to train on)"
        )


def _logprob_chunk(logits: torch.Tensor, labels: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() / temperature  # (C, V) fp32
    lse = torch.logsumexp(scaled, dim=-1)  # (C,)
    picked = scaled.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # (C,)
    return picked - lse  # (C,)


def _entropy_chunk(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    scaled = logits.float() / temperature  # (C, V) fp32
    logp = torch.log_softmax(scaled, dim=-1)  # (C, V)
    return -(logp.exp() * logp).sum(dim=-1)  # (C,)


def _chunked(fn, n: int, chunk_tokens: int, needs_grad: bool, *args_fn) -> torch.Tensor:
    outs = []
    for start in range(0, n, chunk_tokens):
        stop = min(start + chunk_tokens, n)
        args = [a(start, stop) for a in args_fn]
        if needs_grad:
            outs.append(checkpoint(fn, *args, use_reentrant=False))
        else:
            outs.append(fn(*args))
    return torch.cat(outs) if outs else torch.zeros(0)


def logprobs_from_logits(
    logits: torch.Tensor,
    labels: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Log-probability of each label under ``softmax(logits / temperature)``.

    This is the sampling distribution of an engine that applied only a temperature
    (docs/design.md, invariant 4); top-p / top-k truncation is not modelled (the trainer refuses
    such batches).

    Args:
        logits: ``[T, V]`` any float dtype (upcast to fp32 chunk by chunk).
        labels: ``[T]`` int64 token ids in ``[0, V)``.
        temperature: > 0; logits are divided by it before the softmax.
        chunk_tokens: rows processed at once (see the module docstring on memory).

    Returns:
        ``[T]`` float32 log-probs (nats), ``log_softmax(logits / temperature)[t, labels[t]]``.

    Raises:
        ConfigError: temperature <= 0 or not finite, chunk_tokens < 1.
        ContractError: shapes that do not match.
    """
    _check_temperature(temperature)
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens={chunk_tokens}; expected >= 1")
    if logits.dim() != 2 or labels.dim() != 1 or logits.shape[0] != labels.shape[0]:
        raise ContractError(
            f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)}; expected [T, V] and [T]"
        )
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    out = _chunked(
        lambda lg, lb: _logprob_chunk(lg, lb, temperature),
        logits.shape[0],
        chunk_tokens,
        needs_grad,
        lambda a, b: logits[a:b],
        lambda a, b: labels[a:b],
    )
    return out.to(device=logits.device, dtype=torch.float32)


def entropy_from_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    *,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Entropy (nats) of ``softmax(logits / temperature)`` per row: the same scaled
    distribution that ``logprobs_from_logits`` scores.

    Args:
        logits: ``[T, V]`` any float dtype.
        temperature: > 0.
        chunk_tokens: rows processed at once.

    Returns:
        ``[T]`` float32 entropies, ``-sum_v p_v log p_v``.

    Raises:
        ConfigError: temperature <= 0 or not finite, chunk_tokens < 1.
        ContractError: logits not 2-D.
    """
    _check_temperature(temperature)
    if chunk_tokens < 1:
        raise ConfigError(f"chunk_tokens={chunk_tokens}; expected >= 1")
    if logits.dim() != 2:
        raise ContractError(f"logits {tuple(logits.shape)}; expected [T, V]")
    needs_grad = torch.is_grad_enabled() and logits.requires_grad
    out = _chunked(
        lambda lg: _entropy_chunk(lg, temperature),
        logits.shape[0],
        chunk_tokens,
        needs_grad,
        lambda a, b: logits[a:b],
    )
    return out.to(device=logits.device, dtype=torch.float32)


def _positive(value: float | torch.Tensor, name: str) -> float | torch.Tensor:
    v = float(value) if not isinstance(value, torch.Tensor) else float(value.detach().item())
    if not v > 0:
        raise ConfigError(f"{name}={v}; expected a count > 0 of the whole optimizer step")
    return value


# ---------------------------------------------------------------- loss aggregation


def aggregate_loss(
    token_values: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: LossAggMode = "token-mean",
    *,
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    seq_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Aggregate per-token loss values into this call's share of the batch's loss, with
    *global* normalisers (docs/design.md, invariant 5).

    ``S`` sums over this call's tokens; ``n_s`` is sequence ``s``'s count of loss tokens
    (``loss_mask``), always the original count: a token zeroed by a rollout-correction mask
    still counts (as in verl and IcePop), so masking never rescales the other tokens.

    - ``token-mean``: ``S(v_t) / global_num_tokens``.
    - ``seq-mean-token-mean``: ``sum_s (sum_{t in s} v_t / n_s) / global_num_seqs``.
    - ``seq-mean-token-sum``: ``sum_s sum_{t in s} v_t / global_num_seqs``.

    The global counts are the whole optimizer step's (all micro-batches, all ranks; a row
    never straddles two calls), so the sum of this function's results over the calls is
    the batch's loss and its gradient does not depend on the split. Left ``None`` they
    default to this call's own counts (loss tokens; sequences with a loss token).

    Args:
        token_values: ``[T]`` float32, already 0 where ``loss_mask`` is 0 (use
            ``torch.where``, not a product: ``NaN * 0 = NaN``).
        loss_mask: ``[T]`` 0/1, any dtype.
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens: normaliser of ``token-mean`` (> 0).
        global_num_seqs: normaliser of the ``seq-mean-*`` modes (> 0).
        seq_ids: ``[T]`` int64 row index of each token (0-based within this call),
            required by the ``seq-mean-*`` modes.

    Returns:
        0-dim float32 tensor.

    Raises:
        ConfigError: unknown ``loss_agg_mode``, a normaliser <= 0.
        ContractError: ``seq_ids`` missing or of another shape in a ``seq-mean-*`` mode.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"loss_agg_mode={loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    mask = loss_mask > 0  # (T,) bool
    if loss_agg_mode == "token-mean":
        denom = mask.sum().clamp(min=1).float() if global_num_tokens is None else global_num_tokens
        return token_values.sum() / _positive(denom, "global_num_tokens")
    if seq_ids is None or seq_ids.shape != token_values.shape:
        raise ContractError(
            f"loss_agg_mode={loss_agg_mode!r} needs seq_ids of shape {tuple(token_values.shape)}, got "
            f"{None if seq_ids is None else tuple(seq_ids.shape)}"
        )
    zero = torch.zeros((), dtype=torch.float32, device=token_values.device)
    n_seq = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    seq_sum = torch.zeros(n_seq, dtype=torch.float32, device=token_values.device).index_add(0, seq_ids, token_values)  # (S,)
    seq_cnt = torch.zeros(n_seq, dtype=torch.float32, device=token_values.device).index_add(0, seq_ids, mask.float())  # (S,)
    if loss_agg_mode == "seq-mean-token-mean":
        per_seq = torch.where(seq_cnt > 0, seq_sum / seq_cnt.clamp(min=1.0), zero)  # (S,)
    else:
        per_seq = seq_sum  # (S,)
    denom = (seq_cnt > 0).sum().clamp(min=1).float() if global_num_seqs is None else global_num_seqs
    return per_seq.sum() / _positive(denom, "global_num_seqs")


# ---------------------------------------------------------------- the policy loss, assembled

PPO_TOKEN_SUM_METRICS: tuple[str, ...] = (
    "actor/ppo_kl",
    "actor/pg_clipfrac",
    "actor/pg_clipfrac_dual",
    "actor/entropy",
    "actor/ratio_mean",
)
"""Metrics of ``ppo_loss`` that are sums over the call's loss tokens: sum them over
micro-batches and ranks and divide by the global loss-token count for the batch's mean.
(``kl/ref_k1``, ``kl/ref_k2``, ``kl/ref_k3`` likewise, when a reference is given.)"""


def ppo_loss(
    log_probs: torch.Tensor,
    proximal_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    seq_ids: torch.Tensor | None = None,
    correction: RolloutCorrection | None = None,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
    loss_agg_mode: LossAggMode = "token-mean",
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    kl_importance_cap: float = KL_IMPORTANCE_CAP,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The policy loss: decoupled PPO-clip with clip-higher and dual clip, rollout
    correction, and an optional KL-to-reference term, aggregated with global normalisers.

    Per loss token ``t``, with ``r_t = exp(log_probs_t - proximal_t)`` (log-ratio clamped
    to ``±MAX_ABS_LOG_RATIO``), ``w_t`` the rollout-correction weight (``correction.weights``;
    1 without a correction) and ``A_t`` the advantage::

        clip_t = max(-A_t r_t, -A_t clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high))
        pg_t   = clip_t                        if A_t >= 0 or dual_clip_c is None
               = min(clip_t, -dual_clip_c A_t) if A_t < 0
        loss   = agg(w_t * pg_t * keep_t) + kl_coef * agg(kl_t)

    Sources: PPO-clip (Schulman et al. 2017, Eq. 7); clip-higher (Yu et al. 2025, "DAPO",
    Sec. 3.1); the decoupled objective, ratio to the proximal policy weighted by
    proximal / behavior (Hilton et al. 2021, Sec. 3; AReaL, Fu et al. 2025, Sec. 5); dual
    clip (Ye et al. 2020, "Mastering Complex Control in MOBA Games with Deep RL", Eq. 5);
    the KL term ``kl_t = kl_loss_term(log_probs, ref_log_probs, kl_estimator, sg(rho_t))``
    with ``rho_t = min(r_t w_t, kl_importance_cap)`` on every loss token (not only the kept
    ones: the masks address the engine/trainer mismatch of the policy-gradient term, the
    KL regularises the policy). Its value is the estimate ``k_t`` (Schulman 2020), its
    gradient ``rho_t d_t grad log_probs_t`` with ``d_t = log_probs_t - ref_log_probs_t``:
    in expectation over the sampled tokens, the gradient of KL(current ‖ reference) at each
    state, for every estimator, with ``r_t w_t`` (current / behavior, not PPO-clipped)
    correcting for tokens sampled by an older policy, truncated at the cap so that a
    later epoch's large ``r_t`` cannot put an unbounded weight on a token (bias where
    ``r_t w_t`` exceeds the cap; ``agentrl.trainer.kl``; differentiating ``k_t`` itself
    would give 0 in expectation for k1 and the gradient of KL(reference ‖ current) for k3).

    ``agg`` is ``aggregate_loss`` with ``loss_agg_mode`` and the global normalisers; tokens
    that ``correction.keep`` masks out contribute 0 but stay in the counts (verl, IcePop),
    so the result summed over micro-batches and ranks does not depend on the split
    (docs/design.md, invariant 5). Positions with ``loss_mask == 0`` never influence the result
    or its gradient, whatever the inputs hold there (NaN and inf included).

    Without ``correction``, ``dual_clip_c`` and ``kl_coef``, the loss is bitwise the plain
    PPO-clip loss with the proximal log-probs as the old ones (the trainer's loss before the
    decoupled objective; ``tests/unit/trainer/test_trainer_ppo_loss.py`` keeps a copy of it).

    Args:
        log_probs: ``[T]`` float32, current log-probs (requires grad).
        proximal_log_probs: ``[T]`` float32, log-probs at the weights the update started
            from (detached here).
        advantages: ``[T]`` float32 (detached here).
        loss_mask: ``[T]`` 0/1, any dtype.
        seq_ids: ``[T]`` int64 row index of each token (0-based within this call);
            required by the ``seq-mean-*`` modes.
        correction: ``rollout_correction``'s result for these tokens, or ``None`` (weights
            1, nothing masked).
        clip_ratio_low, clip_ratio_high: clip range ``[1 - low, 1 + high]``.
        dual_clip_c: the dual-clip constant ``c > 1``, or ``None`` (off).
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens, global_num_seqs: the whole step's normalisers (see
            ``aggregate_loss``).
        entropy: optional ``[T]`` float32 per-token entropy, only reported.
        ref_log_probs: ``[T]`` float32 reference log-probs (detached here); required when
            ``kl_coef > 0``, and when given the ``kl/ref_k*`` metrics are reported.
        kl_coef: weight of the KL term (>= 0; 0 = off).
        kl_estimator: ``"k1"``, ``"k2"`` or ``"k3"``.
        kl_importance_cap: truncation ``c >= 1`` of the KL term's importance weight
            ``r_t w_t`` (``agentrl.trainer.kl.kl_importance_cap``: the rollout
            correction's ``is_cap`` when its weights are on, else ``KL_IMPORTANCE_CAP``).

    Returns:
        ``(loss, metrics)``: ``loss`` a 0-dim float32 tensor, this call's share of the
        batch's loss (policy gradient + KL). ``metrics``: 0-dim detached float32 tensors.
        ``actor/pg_loss`` and ``actor/kl_loss`` (0 when off; ``kl_coef`` times the
        aggregated estimate ``k_t``) are this call's shares (add them over calls). The
        names in ``PPO_TOKEN_SUM_METRICS`` and ``kl/ref_k1``, ``kl/ref_k2``, ``kl/ref_k3``
        (only with ``ref_log_probs``) are sums over this call's loss tokens (add them over
        calls, divide by the global loss-token count):
        ``actor/ppo_kl`` (k3 of KL(proximal || current), ``(r - 1) - log r``),
        ``actor/pg_clipfrac`` (kept tokens whose clipped term is the larger),
        ``actor/pg_clipfrac_dual`` (kept tokens with ``A < 0`` where the bound
        ``-c A`` is the smaller), ``actor/entropy``, ``actor/ratio_mean`` (``r``), and
        ``kl/ref_k*`` (each estimator of KL(current || reference)).

    Raises:
        ConfigError: unknown ``loss_agg_mode`` or ``kl_estimator``, a clip ratio outside
            its range, ``dual_clip_c <= 1``, ``kl_coef < 0``, ``kl_importance_cap`` not a
            finite number >= 1, a normaliser <= 0.
        ContractError: shapes that differ, ``seq_ids`` missing for a ``seq-mean`` mode,
            ``ref_log_probs`` missing with ``kl_coef > 0``.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"loss_agg_mode={loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    validate_clip_ratios(clip_ratio_low, clip_ratio_high)
    validate_dual_clip_c(dual_clip_c)
    if not (isinstance(kl_coef, (int, float)) and math.isfinite(kl_coef) and kl_coef >= 0.0):
        raise ConfigError(f"kl_coef={kl_coef!r}; expected a finite number >= 0")
    if kl_estimator not in KL_ESTIMATORS:
        raise ConfigError(f"kl_estimator={kl_estimator!r}; expected one of {KL_ESTIMATORS}")
    cap = kl_importance_cap
    if not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and math.isfinite(cap) and cap >= 1.0):
        raise ConfigError(f"kl_importance_cap={cap!r}; expected a finite number >= 1")
    shape = log_probs.shape
    if log_probs.dim() != 1:
        raise ContractError(f"log_probs has shape {tuple(shape)}; expected [T]")
    named = [("proximal_log_probs", proximal_log_probs), ("advantages", advantages), ("loss_mask", loss_mask)]
    if entropy is not None:
        named.append(("entropy", entropy))
    if ref_log_probs is not None:
        named.append(("ref_log_probs", ref_log_probs))
    if correction is not None:
        named += [("correction.weights", correction.weights), ("correction.keep", correction.keep)]
    for name, t in named:
        if t.shape != shape:
            raise ContractError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} like log_probs")
    if loss_agg_mode != "token-mean" and (seq_ids is None or seq_ids.shape != shape):
        raise ContractError(
            f"loss_agg_mode={loss_agg_mode!r} needs seq_ids of shape {tuple(shape)}, got "
            f"{None if seq_ids is None else tuple(seq_ids.shape)}"
        )
    if kl_coef > 0 and ref_log_probs is None:
        raise ContractError(f"kl_coef={kl_coef} needs ref_log_probs (the reference model's log-probs), got None")

    mask = loss_mask > 0  # (T,) bool
    zero = torch.zeros((), dtype=torch.float32, device=log_probs.device)
    lp = torch.where(mask, log_probs.float(), zero)  # (T,)
    prox = torch.where(mask, proximal_log_probs.detach().float(), zero)  # (T,)
    adv = torch.where(mask, advantages.detach().float(), zero)  # (T,)

    log_ratio = (lp - prox).clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO)  # (T,) 0 off-mask
    ratio = torch.exp(log_ratio)  # (T,) 1 off-mask
    pg_unclipped = -adv * ratio  # (T,)
    pg_clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # (T,)
    clip_loss = torch.maximum(pg_unclipped, pg_clipped)  # (T,)
    pg = clip_loss  # (T,)
    if dual_clip_c is not None:
        pg_dual = -adv * dual_clip_c  # (T,) the bound c * |A| for A < 0
        pg = torch.where(adv < 0, torch.minimum(clip_loss, pg_dual), clip_loss)  # (T,)
    keep = mask  # (T,) bool
    if correction is not None:
        pg = pg * correction.weights.detach().float()  # (T,)
        keep = mask & correction.keep  # (T,)
    token_loss = torch.where(keep, pg, zero)  # (T,)
    agg = dict(
        loss_agg_mode=loss_agg_mode, global_num_tokens=global_num_tokens, global_num_seqs=global_num_seqs, seq_ids=seq_ids
    )
    pg_loss = aggregate_loss(token_loss, loss_mask, **agg)
    loss = pg_loss
    ref = None
    kl_loss = zero
    if ref_log_probs is not None:
        ref = torch.where(mask, ref_log_probs.detach().float(), zero)  # (T,)
    if kl_coef > 0:
        assert ref is not None
        rho = ratio.detach() if correction is None else ratio.detach() * correction.weights.detach().float()  # (T,)
        rho = rho.clamp(max=kl_importance_cap)  # (T,) truncated IS (agentrl.trainer.kl)
        kl_tok = torch.where(mask, kl_loss_term(lp, ref, kl_estimator, importance_weights=rho), zero)  # (T,)
        kl_loss = kl_coef * aggregate_loss(kl_tok, loss_mask, **agg)
        loss = pg_loss + kl_loss

    with torch.no_grad():
        metrics = {
            "actor/pg_loss": pg_loss.detach(),
            "actor/kl_loss": kl_loss.detach(),
            "actor/ppo_kl": torch.where(mask, (ratio - 1.0) - log_ratio, zero).sum(),
            "actor/pg_clipfrac": (keep & (pg_clipped > pg_unclipped)).float().sum(),
            "actor/pg_clipfrac_dual": (
                (keep & (adv < 0) & (clip_loss > -adv * dual_clip_c)).float().sum() if dual_clip_c is not None else zero
            ),
            "actor/entropy": zero if entropy is None else torch.where(mask, entropy.float(), zero).sum(),
            "actor/ratio_mean": torch.where(mask, ratio, zero).sum(),
        }
        if ref is not None:
            lp_d = lp.detach()  # (T,)
            for est in KL_ESTIMATORS:
                metrics[f"kl/ref_{est}"] = torch.where(mask, kl_penalty(lp_d, ref, est), zero).sum()
    return loss, metrics


def value_loss_terms(
    values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor | None, value_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-position value loss of the critic, summed by the caller and divided by the
    global count of value positions (turns for ``turn_critic``, sampled tokens for ``gae``).

    ``0.5 * (V - R)^2``, or with ``value_clip = eps_v`` and ``old_values``
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)`` (PPO value
    clipping, as in CleanRL ``ppo.py`` / verl ``compute_value_loss``).

    Args:
        values: ``[N]`` float32 current values (with grad).
        returns: ``[N]`` float32 targets, in reward units.
        old_values: ``[N]`` float32 or ``None`` (required when ``value_clip`` is set).
        value_clip: ``eps_v > 0`` or ``None``.

    Returns:
        ``(loss [N], clipped [N])``: the per-position loss and a 0/1 float mask of
        positions where the clipped term was the larger one (for ``losses/value_clipfrac``).

    Raises:
        ContractError: ``value_clip`` set but ``old_values`` is ``None``.
    """
    unclipped = (values - returns) ** 2  # (N,)
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    if old_values is None:
        raise ContractError("value_clip is set but old_values is None")
    v_clip = old_values + torch.clamp(values - old_values, -value_clip, value_clip)  # (N,)
    clipped = (v_clip - returns) ** 2  # (N,)
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()
