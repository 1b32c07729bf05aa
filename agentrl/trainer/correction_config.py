"""``RolloutCorrectionConfig``: the settings of the rollout correction (importance weights
and masks of the engine↔trainer mismatch) that ``agentrl.trainer.correction`` applies.
Imports no torch, so the run configuration can build and check it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, get_args

from agentrl.errors import ConfigError
from agentrl.trainer.documented import documented

ISLevel = Literal["token", "sequence"]
"""Values of ``RolloutCorrectionConfig.is_level`` besides ``None`` (off)."""
IS_LEVELS: tuple[str, ...] = get_args(ISLevel)

def _check_band(name: str, band: Any) -> None:
    """A mask band ``(low, high)`` of importance ratios: finite, ``0 < low <= 1 <= high``
    (a band that excludes 1 would mask on-policy tokens, whose ratio is exactly 1)."""
    if band is None:
        return
    ok = (
        isinstance(band, (tuple, list))
        and len(band) == 2
        and all(isinstance(b, (int, float)) and not isinstance(b, bool) and math.isfinite(b) for b in band)
    )
    if not ok:
        raise ConfigError(f"{name}={band!r}; expected a pair (low, high) of finite numbers, or None (off)")
    low, high = band
    if low > high:
        raise ConfigError(f"{name}={tuple(band)}: low={low} > high={high}; expected low <= high")
    if not (0.0 < low <= 1.0 <= high):
        raise ConfigError(
            f"{name}={tuple(band)}; expected 0 < low <= 1 <= high (a ratio of 1, on-policy, must stay inside)"
        )


@dataclass
class RolloutCorrectionConfig:
    """Rollout correction: how the mismatch between the engine's ``behavior_log_probs`` and
    the trainer's ``proximal_log_probs`` (weights ``w_t = exp(proximal_t - behavior_t)``,
    per loss token) reweights or masks the policy-gradient term of the decoupled PPO loss
    (Hilton et al. 2021, "Batch size-invariance for policy optimization"; AReaL, Fu et al.
    2025, Sec. 5). Off by default: every weight is 1. See
    ``agentrl.trainer.losses.rollout_correction``."""

    is_level: ISLevel | None = documented(
        None,
        doc=(
            "Importance sampling against the engine's log-probs. None (default): off, every weight is 1. "
            "'token': truncated IS per token, weight min(w_t, is_cap) (TIS). 'sequence': one weight per "
            "sequence, exp(sum over its loss tokens of log w_t) (never a sum of per-token ratios), truncated "
            "at is_cap and applied to every token of the sequence; unbiased for whole-sequence rewards but "
            "of higher variance. Here w_t = proximal / behavior probability of token t; the weights carry "
            "no gradient."
        ),
    )
    is_cap: float = documented(
        2.0,
        doc=(
            "Truncation of the importance weights (token or sequence): weights above it are cut to it, "
            "which trades a little bias for bounded variance (rollout_corr/is_clipped_frac counts the cuts). "
            "Must be >= 1."
        ),
    )
    token_mask_band: tuple[float, float] | None = documented(
        None,
        doc=(
            "IcePop-style token masking: a loss token whose w_t leaves [low, high] gets no policy-gradient "
            "term (it still counts in the token-mean normaliser). None: off. Needs 0 < low <= 1 <= high, "
            "e.g. [0.5, 2.0]."
        ),
    )
    seq_mask_band: tuple[float, float] | None = documented(
        None,
        doc=(
            "Sequence masking: a sequence whose geometric-mean ratio exp(mean over its loss tokens of "
            "log w_t) leaves [low, high] gets no policy-gradient term on any token (its tokens still count "
            "in the normalisers). None: off. Needs 0 < low <= 1 <= high, e.g. [0.999, 1.001] for a "
            "length-independent test of the mismatch."
        ),
    )

    @property
    def enabled(self) -> bool:
        """True when any correction (importance weights or a mask band) is on."""
        return self.is_level is not None or self.token_mask_band is not None or self.seq_mask_band is not None

    def validate(self, prefix: str = "rollout_correction.") -> None:
        """Raise ``ConfigError`` naming the first invalid field (``prefix`` + name)."""
        if self.is_level is not None and self.is_level not in IS_LEVELS:
            raise ConfigError(f"{prefix}is_level={self.is_level!r}; expected one of {IS_LEVELS} or None (off)")
        cap = self.is_cap
        if not (isinstance(cap, (int, float)) and not isinstance(cap, bool) and math.isfinite(cap) and cap >= 1.0):
            raise ConfigError(f"{prefix}is_cap={cap!r}; expected a finite number >= 1")
        _check_band(f"{prefix}token_mask_band", self.token_mask_band)
        _check_band(f"{prefix}seq_mask_band", self.seq_mask_band)
