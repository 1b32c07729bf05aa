"""Rollout correction: importance weights and masks of the mismatch between the engine's
``behavior_log_probs`` and the trainer's ``proximal_log_probs`` for the policy-gradient term
of the decoupled PPO loss (``agentrl.trainer.losses.ppo_loss``), and the batch's
``rollout_corr/*`` metrics from additive per-micro-batch sums (Hilton et al. 2021, "Batch
size-invariance for policy optimization"; AReaL, Fu et al. 2025, Sec. 5; IcePop, Ling
Team 2025). Configured by ``agentrl.trainer.config.RolloutCorrectionConfig``.

Functions of tensors only; shapes are 1-D over tokens (``T``), the layout of ``TokenBatch``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import RolloutCorrectionConfig

MAX_ABS_LOG_RATIO = 20.0
"""``log(pi / pi_old)`` is clamped to ±20 before ``exp`` so that a wild token cannot
overflow fp32 (``exp(89) = inf``). Inside the clip range this never binds."""

ROLLOUT_CORR_SUMS: tuple[str, ...] = (
    "gap_abs_sum",
    "loss_tokens",
    "loss_seqs",
    "weight_sum",
    "weight_sq_sum",
    "weight_count",
    "weight_clipped",
    "token_masked",
    "seq_masked",
)
"""Order of ``RolloutCorrection.sums``: additive statistics (float64) that a caller sums
over micro-batches and all-reduces (SUM) over ranks before ``rollout_corr_metrics``.
``weight_*`` count weight units: tokens (``is_level`` None or ``"token"``) or sequences
(``"sequence"``), over the units the masks keep."""


@dataclass
class RolloutCorrection:
    """Result of ``rollout_correction`` for one micro-batch (all tensors detached).

    Attributes:
        weights: ``[T]`` float32 importance weight of each token's policy-gradient term
            (after truncation; a sequence's weight on each of its tokens); 1 where
            ``is_level`` is None and off ``loss_mask``.
        keep: ``[T]`` bool, ``loss_mask`` minus the tokens the token band or the
            sequence band masks out. Masked tokens carry no policy-gradient term but still
            count in the normalisers (``aggregate_loss``).
        sums: ``[len(ROLLOUT_CORR_SUMS)]`` float64 additive statistics (see
            ``ROLLOUT_CORR_SUMS``).
        gaps: ``[n]`` float32 ``|proximal - behavior|`` (nats) of this call's ``n`` loss
            tokens, in token order; concatenate over micro-batches and gather over ranks
            for the exact quantile of ``rollout_corr_metrics``.
    """

    weights: torch.Tensor
    keep: torch.Tensor
    sums: torch.Tensor
    gaps: torch.Tensor


def rollout_correction(
    proximal_log_probs: torch.Tensor,
    behavior_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    seq_ids: torch.Tensor,
    config: RolloutCorrectionConfig | None = None,
) -> RolloutCorrection:
    """Importance weights and masks of the engine/trainer mismatch, per token, for the
    policy-gradient term of the decoupled PPO loss (Hilton et al. 2021, "Batch
    size-invariance for policy optimization", Sec. 3; AReaL, Fu et al. 2025, Sec. 5).

    With ``log w_t = proximal_t - behavior_t`` on loss tokens (clamped to
    ``±MAX_ABS_LOG_RATIO``):

    - ``is_level="token"``: ``weight_t = min(exp(log w_t), is_cap)`` (truncated IS, TIS).
    - ``is_level="sequence"``: ``W_s = min(exp(sum_{t in s} log w_t), is_cap)`` over the
      sequence's loss tokens (a product of ratios, never a sum of them), on each of its
      tokens.
    - ``token_mask_band=(lo, hi)``: a token with ``w_t`` outside ``[lo, hi]`` is masked
      (IcePop, Ling Team 2025).
    - ``seq_mask_band=(lo, hi)``: a sequence whose geometric mean
      ``exp(mean_{t in s} log w_t)`` is outside ``[lo, hi]`` is masked entirely.

    Bands are compared in log space. The weights carry no gradient. With
    ``proximal == behavior`` every weight is exactly 1 and nothing is masked (a band
    always contains 1, ``RolloutCorrectionConfig.validate``).

    Args:
        proximal_log_probs: ``[T]`` float32, the trainer's log-probs at the weights the
            update starts from.
        behavior_log_probs: ``[T]`` float32, the engine's log-probs at sampling time.
        loss_mask: ``[T]`` 0/1, any dtype. Other positions are ignored (NaN included).
        seq_ids: ``[T]`` int64 row index of each token, 0-based within this call.
        config: the correction (``None``: the default, off: weights 1, nothing masked;
            the gap statistics are computed all the same).

    Returns:
        ``RolloutCorrection`` (weights, keep mask, additive sums, per-token gaps).

    Raises:
        ConfigError: an invalid ``config``.
        ContractError: shapes that differ.
    """
    cfg = config if config is not None else RolloutCorrectionConfig()
    cfg.validate()
    shape = proximal_log_probs.shape
    if proximal_log_probs.dim() != 1:
        raise ContractError(f"proximal_log_probs has shape {tuple(shape)}; expected [T]")
    for name, t in (("behavior_log_probs", behavior_log_probs), ("loss_mask", loss_mask), ("seq_ids", seq_ids)):
        if t.shape != shape:
            raise ContractError(f"{name} has shape {tuple(t.shape)}; expected {tuple(shape)} like proximal_log_probs")
    dev = proximal_log_probs.device
    mask = loss_mask > 0  # (T,) bool
    zero = torch.zeros((), dtype=torch.float32, device=dev)
    prox = torch.where(mask, proximal_log_probs.detach().float(), zero)  # (T,)
    behav = torch.where(mask, behavior_log_probs.detach().float(), zero)  # (T,)
    log_w = (prox - behav).clamp(-MAX_ABS_LOG_RATIO, MAX_ABS_LOG_RATIO)  # (T,) 0 off-mask

    n_seq = int(seq_ids.max().item()) + 1 if seq_ids.numel() else 0
    seq_cnt = torch.zeros(n_seq, dtype=torch.float64, device=dev).index_add(0, seq_ids, mask.double())  # (S,)
    seq_log_w = torch.zeros(n_seq, dtype=torch.float64, device=dev).index_add(0, seq_ids, log_w.double())  # (S,)
    has_loss = seq_cnt > 0  # (S,) bool

    token_masked = torch.zeros_like(mask)  # (T,) bool
    if cfg.token_mask_band is not None:
        lo, hi = (math.log(b) for b in cfg.token_mask_band)
        token_masked = mask & ((log_w < lo) | (log_w > hi))  # (T,)
    seq_masked = torch.zeros_like(has_loss)  # (S,) bool
    if cfg.seq_mask_band is not None:
        lo, hi = (math.log(b) for b in cfg.seq_mask_band)
        mean_log_w = seq_log_w / seq_cnt.clamp(min=1.0)  # (S,)
        seq_masked = has_loss & ((mean_log_w < lo) | (mean_log_w > hi))  # (S,)
    keep = mask & ~token_masked & ~seq_masked[seq_ids]  # (T,) bool

    ones = torch.ones_like(log_w)  # (T,)
    if cfg.is_level == "token":
        raw = torch.exp(log_w)  # (T,)
        weights = torch.where(mask, raw.clamp(max=cfg.is_cap), ones)  # (T,)
        units, unit_w, unit_clipped = keep, weights, raw > cfg.is_cap  # (T,) each
    elif cfg.is_level == "sequence":
        raw_seq = torch.exp(seq_log_w)  # (S,) float64, inf when the sum overflows
        w_seq = raw_seq.clamp(max=cfg.is_cap).float()  # (S,)
        weights = torch.where(mask, w_seq[seq_ids], ones)  # (T,)
        units, unit_w, unit_clipped = has_loss & ~seq_masked, w_seq, raw_seq > cfg.is_cap  # (S,) each
    else:
        weights = ones  # (T,)
        units, unit_w, unit_clipped = keep, ones, torch.zeros_like(keep)  # (T,) each

    gaps = (prox - behav).abs()[mask]  # (n,) unclamped
    uw = torch.where(units, unit_w.double(), torch.zeros((), dtype=torch.float64, device=dev))  # (T,) or (S,)
    sums = torch.stack(
        [
            gaps.double().sum(),
            mask.double().sum(),
            has_loss.double().sum(),
            uw.sum(),
            (uw * uw).sum(),
            units.double().sum(),
            (units & unit_clipped).double().sum(),
            token_masked.double().sum(),
            seq_masked.double().sum(),
        ]
    )  # (K,) in ROLLOUT_CORR_SUMS order
    return RolloutCorrection(weights=weights.detach(), keep=keep, sums=sums, gaps=gaps.detach())


def quantile(values: torch.Tensor, q: float) -> float:
    """The ``q``-quantile of 1-D ``values`` with linear interpolation between order
    statistics (numpy's and ``torch.quantile``'s default), without ``torch.quantile``'s
    input-size limit. 0.0 for an empty tensor.

    Raises:
        ConfigError: ``q`` outside ``[0, 1]``.
    """
    if not 0.0 <= q <= 1.0:
        raise ConfigError(f"q={q}; expected 0 <= q <= 1")
    n = values.numel()
    if n == 0:
        return 0.0
    s = torch.sort(values.detach().double().reshape(-1)).values  # (n,)
    pos = q * (n - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return float(s[lo] + (s[hi] - s[lo]) * (pos - lo))


def rollout_corr_metrics(sums: torch.Tensor, gaps: torch.Tensor) -> dict[str, float]:
    """The ``rollout_corr/*`` metrics of a whole batch from its summed statistics.

    The caller adds ``RolloutCorrection.sums`` over its micro-batches, all-reduces the sum
    over ranks (SUM), concatenates ``RolloutCorrection.gaps`` over micro-batches and
    gathers them over ranks (the quantile needs every gap), then calls this once.

    Args:
        sums: ``[len(ROLLOUT_CORR_SUMS)]`` float64 (any float dtype), in that order.
        gaps: ``[N]`` float32, every loss token's ``|proximal - behavior|``.

    Returns:
        ``rollout_corr/gap_abs_mean``, ``rollout_corr/gap_abs_max``,
        ``rollout_corr/gap_abs_p99`` (nats, over loss tokens);
        ``rollout_corr/is_weight_mean`` (mean applied weight over the kept units; 1 when
        off or when no unit is kept), ``rollout_corr/is_clipped_frac`` (share of kept units
        whose weight was cut at the cap), ``rollout_corr/ess`` (``(sum w)^2 / (n sum w^2)``
        over the kept units, in (0, 1]; 1 when off or no unit is kept; 0 when every kept
        weight is 0, e.g. sequence weights that underflow), ``rollout_corr/token_masked_frac``
        (share of loss tokens the token band masked), ``rollout_corr/seq_masked_frac``
        (share of sequences with a loss token the sequence band masked).

    Raises:
        ContractError: ``sums`` of the wrong length.
    """
    if sums.shape != (len(ROLLOUT_CORR_SUMS),):
        raise ContractError(f"sums has shape {tuple(sums.shape)}; expected ({len(ROLLOUT_CORR_SUMS)},) (ROLLOUT_CORR_SUMS)")
    s = dict(zip(ROLLOUT_CORR_SUMS, (float(v) for v in sums.detach().double().cpu())))
    n_tok, n_seq, n_w = s["loss_tokens"], s["loss_seqs"], s["weight_count"]
    return {
        "rollout_corr/gap_abs_mean": s["gap_abs_sum"] / n_tok if n_tok > 0 else 0.0,
        "rollout_corr/gap_abs_max": float(gaps.max()) if gaps.numel() else 0.0,
        "rollout_corr/gap_abs_p99": quantile(gaps, 0.99),
        "rollout_corr/is_weight_mean": s["weight_sum"] / n_w if n_w > 0 else 1.0,
        "rollout_corr/is_clipped_frac": s["weight_clipped"] / n_w if n_w > 0 else 0.0,
        "rollout_corr/ess": _ess(s["weight_sum"], s["weight_sq_sum"], n_w),
        "rollout_corr/token_masked_frac": s["token_masked"] / n_tok if n_tok > 0 else 0.0,
        "rollout_corr/seq_masked_frac": s["seq_masked"] / n_seq if n_seq > 0 else 0.0,
    }


def _ess(weight_sum: float, weight_sq_sum: float, n: float) -> float:
    """Normalised effective sample size ``(sum w)^2 / (n sum w^2)`` of ``n`` weights >= 0:
    1 with no weights (nothing to judge); 0 when every weight is 0 (no effective sample;
    the formula is 0/0 there, and 1 would report the worst case as the best)."""
    if n <= 0:
        return 1.0
    if weight_sq_sum <= 0.0:
        return 0.0
    return weight_sum**2 / (n * weight_sq_sum)
