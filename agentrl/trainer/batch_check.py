"""The checks of a ``TokenBatch`` that only the policy trainer can make: its sampling
transform is one the trainer reproduces (temperature only), its temperature agrees with
``TrainerConfig.temperature``, its token ids fit the vocabulary and, for training, no row
starts with a loss token and every rank holds the same batch."""

from __future__ import annotations

import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.config import TrainerConfig
from agentrl.types import TokenBatch


def check_batch(batch: TokenBatch, config: TrainerConfig, core: TrainerCore, *, for_training: bool) -> float:
    """Validate ``batch`` for scoring (``for_training=False``) or for a training step, and
    return the temperature to score at (``batch.sampling.temperature``, a float > 0).

    Collective when ``for_training``: the ranks compare a fingerprint of their batches
    (token count, row count, an id checksum).

    Raises:
        ConfigError: ``top_p < 1`` or ``top_k > 0`` (cannot be reproduced), a temperature
            that is not a finite float > 0, or one that contradicts ``config.temperature``.
        ContractError: a token id outside the vocabulary; for training also a loss token
            at a row's first position, or ranks holding different batches.
    """
    s = batch.sampling
    if s.top_p < 1.0 or s.top_k > 0:
        raise ConfigError(
            f"batch sampled with top_p={s.top_p}, top_k={s.top_k}; the trainer can only "
            "reproduce temperature sampling (top_p=1.0, top_k<=0). Sample without "
            "truncation or the recomputed log-probs would not match the engine's"
        )
    t = float(s.temperature)
    if not (0.0 < t < float("inf")):
        raise ConfigError(f"batch.sampling.temperature={t}; expected a finite float > 0")
    if config.temperature is not None and t != config.temperature:
        raise ConfigError(
            f"batch.sampling.temperature={t} but TrainerConfig.temperature="
            f"{config.temperature}; the rollout and the trainer must agree"
        )
    core.check_vocab(batch.input_ids)
    if for_training:
        starts = torch.cumsum(batch.seq_lens, 0) - batch.seq_lens  # (B,)
        first = batch.loss_mask[starts] > 0  # (B,)
        if bool(first.any()):
            row = int(first.nonzero()[0])
            raise ContractError(
                f"row {row} ({batch.episode_ids[row]}) has loss_mask 1 on its first token, "
                "which has no prefix to be scored from; a row must start with a prompt"
            )
        fp = [float(batch.num_tokens), float(batch.num_rows), float((batch.input_ids % 9973).sum())]
        core.check_same_on_all_ranks(
            fp,
            "ranks hold different batches (token count, row count or id checksum "
            "differ); every rank must get the same full TokenBatch",
        )
    return t
