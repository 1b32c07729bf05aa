"""Pure loss functions of the trainers: token log-probs, entropy, the PPO-clip policy
loss (``policy_loss``) and the critic's (optionally clipped) value loss
(``value_loss_terms``).

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

import torch
from torch.utils.checkpoint import checkpoint

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import DEFAULT_CHUNK_TOKENS, LOSS_AGG_MODES, LossAggMode, validate_clip_ratios

__all__ = [
    "DEFAULT_CHUNK_TOKENS",
    "LOSS_AGG_MODES",
    "LossAggMode",
    "MAX_ABS_LOG_RATIO",
    "entropy_from_logits",
    "logprobs_from_logits",
    "policy_loss",
    "value_loss_terms",
]

MAX_ABS_LOG_RATIO = 20.0
"""``log(pi / pi_old)`` is clamped to ±20 before ``exp`` so that a wild token cannot
overflow fp32 (``exp(89) = inf``). Inside the clip range this never binds."""


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
    (design.md, invariant 4); top-p / top-k truncation is not modelled (the trainer refuses
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


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    loss_agg_mode: LossAggMode = "token-mean",
    global_num_tokens: float | torch.Tensor | None = None,
    global_num_seqs: float | torch.Tensor | None = None,
    seq_ids: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip policy loss (Schulman et al. 2017, "Proximal Policy Optimization
    Algorithms", Eq. 7) with DAPO's decoupled clip range (Yu et al. 2025, "DAPO", Sec. 3.1,
    "clip-higher"), aggregated with a *global* normaliser.

    Per token ``t`` with ``r_t = exp(log_probs - old_log_probs)``::

        loss_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - clip_ratio_low, 1 + clip_ratio_high))

    Aggregation (``loss_mask`` selects the tokens; ``S`` sums over this call's tokens only):

    - ``token-mean``: ``S(loss_t) / global_num_tokens``.
    - ``seq-mean-token-mean``: ``sum_seq mean_{t in seq}(loss_t) / global_num_seqs``.
    - ``seq-mean-token-sum``: ``sum_seq sum_{t in seq}(loss_t) / global_num_seqs``.

    The global counts are those of the whole optimizer step (all micro-batches, all
    ranks), so summing this function's result over micro-batches and ranks gives the
    loss of the whole batch, and its gradient does not depend on how the batch was split
    (design.md, invariant 5). Left ``None``, they default to this call's own counts
    (masked tokens; sequences with at least one masked token).

    Positions with ``loss_mask == 0`` never influence the result or its gradient, whatever
    ``old_log_probs``/``advantages``/``log_probs`` hold there (NaN and inf included): the
    inputs are selected with ``torch.where`` before any arithmetic, not multiplied by the
    mask (``NaN * 0 = NaN``).

    Args:
        log_probs: ``[T]`` float32, current policy log-probs (requires grad).
        old_log_probs: ``[T]`` float32, log-probs at the weights that started this step.
        advantages: ``[T]`` float32.
        loss_mask: ``[T]`` 0/1 (any dtype).
        clip_ratio_low, clip_ratio_high: clip range ``[1 - low, 1 + high]``.
        loss_agg_mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens: normaliser for ``token-mean``.
        global_num_seqs: normaliser for the ``seq-mean-*`` modes.
        seq_ids: ``[T]`` int64 row index of each token, required for ``seq-mean-*``.
        entropy: optional ``[T]`` float32 per-token entropy, only reported.

    Returns:
        ``(loss, metrics)``: ``loss`` a 0-dim float32 tensor (this call's share of the
        global loss); ``metrics`` 0-dim detached tensors, means over this call's masked
        tokens except ``losses/policy_loss`` (= ``loss``):
        ``losses/policy_loss``, ``losses/approx_kl`` (k3 estimator ``(r - 1) - log r``,
        Schulman 2020, "Approximating KL divergence"), ``losses/clipfrac`` (share of tokens
        whose clipped term is the larger one, i.e. whose gradient the clip removed),
        ``losses/entropy`` (0 when ``entropy`` is None), ``losses/ratio_mean``.

    Raises:
        ConfigError: unknown ``loss_agg_mode``, a clip ratio outside its range, a
            normaliser <= 0.
        ContractError: shapes that differ, or ``seq_ids`` missing for a ``seq-mean`` mode.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ConfigError(f"loss_agg_mode={loss_agg_mode!r}; expected one of {LOSS_AGG_MODES}")
    validate_clip_ratios(clip_ratio_low, clip_ratio_high)
    shape = log_probs.shape
    if log_probs.dim() != 1:
        raise ContractError(f"log_probs has shape {tuple(shape)}; expected [T]")
    for name, t in (("old_log_probs", old_log_probs), ("advantages", advantages), ("loss_mask", loss_mask)):
        if t.shape != shape:
            raise ContractError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} like log_probs")
    if entropy is not None and entropy.shape != shape:
        raise ContractError(f"entropy has shape {tuple(entropy.shape)}; expected {tuple(shape)}")
    seq_mode = loss_agg_mode != "token-mean"
    if seq_mode and (seq_ids is None or seq_ids.shape != shape):
        raise ContractError(
            f"loss_agg_mode={loss_agg_mode!r} needs seq_ids of shape {tuple(shape)}, got "
            f"{None if seq_ids is None else tuple(seq_ids.shape)}"
        )

    mask = loss_mask > 0  # (T,) bool
    zero = torch.zeros((), dtype=torch.float32, device=log_probs.device)
    lp = torch.where(mask, log_probs.float(), zero)  # (T,)
    old = torch.where(mask, old_log_probs.detach().float(), zero)  # (T,)
    adv = torch.where(mask, advantages.detach().float(), zero)  # (T,)

    log_ratio = (lp - old).clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO)  # (T,) 0 off-mask
    ratio = torch.exp(log_ratio)  # (T,) 1 off-mask
    pg_unclipped = -adv * ratio  # (T,)
    pg_clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)  # (T,)
    token_loss = torch.where(mask, torch.maximum(pg_unclipped, pg_clipped), zero)  # (T,)

    n_local_tokens = mask.sum()
    if loss_agg_mode == "token-mean":
        denom = n_local_tokens.clamp(min=1).float() if global_num_tokens is None else global_num_tokens
        loss = token_loss.sum() / _positive(denom, "global_num_tokens")
    else:
        assert seq_ids is not None
        n_seq = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
        seq_sum = torch.zeros(n_seq, dtype=torch.float32, device=lp.device).index_add(0, seq_ids, token_loss)
        seq_cnt = torch.zeros(n_seq, dtype=torch.float32, device=lp.device).index_add(0, seq_ids, mask.float())
        if loss_agg_mode == "seq-mean-token-mean":
            per_seq = torch.where(seq_cnt > 0, seq_sum / seq_cnt.clamp(min=1.0), zero)  # (S,)
        else:
            per_seq = seq_sum  # (S,)
        denom = (seq_cnt > 0).sum().clamp(min=1).float() if global_num_seqs is None else global_num_seqs
        loss = per_seq.sum() / _positive(denom, "global_num_seqs")

    with torch.no_grad():
        n = n_local_tokens.clamp(min=1).float()
        approx_kl = torch.where(mask, (ratio - 1.0) - log_ratio, zero).sum() / n
        clipfrac = (mask & (pg_clipped > pg_unclipped)).float().sum() / n
        ratio_mean = torch.where(mask, ratio, zero).sum() / n
        ent = zero if entropy is None else torch.where(mask, entropy.float(), zero).sum() / n
        metrics = {
            "losses/policy_loss": loss.detach(),
            "losses/approx_kl": approx_kl,
            "losses/clipfrac": clipfrac,
            "losses/entropy": ent,
            "losses/ratio_mean": ratio_mean,
        }
    return loss, metrics


def _positive(value: float | torch.Tensor, name: str) -> float | torch.Tensor:
    v = float(value) if not isinstance(value, torch.Tensor) else float(value.detach().item())
    if not v > 0:
        raise ConfigError(f"{name}={v}; expected a count > 0 of the whole optimizer step")
    return value


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
