"""How ``PolicyTrainer`` lays out and scores the rows of one micro-batch.

Two row layouts (``TrainerConfig.row_layout``):

- ``"packed"`` (default): the micro-batch's rows are concatenated into one sequence
  ``[1, Tm]`` with no padding. Attention is restricted to each row (block-diagonal causal)
  and position ids restart at 0 per row, so every row is scored exactly as if alone. The
  row boundaries travel to the attention kernel as ``cu_seq_lens_q/k`` (int32 ``[n + 1]``)
  and ``max_length_q/k`` keyword arguments, the names Hugging Face's variable-length flash
  attention reads (``transformers.modeling_flash_attention_utils._flash_attention_forward``).
  Kernels: ``flash_attention_2`` on CUDA (``flash_attn_varlen_func``); elsewhere
  ``VARLEN_SDPA`` (``agentrl.trainer.attention``, registered with transformers'
  ``AttentionInterface``), which runs
  ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` once per row
  segment, so no FLOP is spent on padding or between rows and no dense ``[Tm, Tm]`` mask
  is built (its ``AttentionMaskInterface`` entry returns ``None`` for packed input). The
  ``sdpa`` and ``eager`` kernels also score packed rows, up to rounding (below):
  transformers detects the restarts of ``position_ids`` and builds a dense block-diagonal
  mask over the whole packed sequence.
- ``"padded"``: rows right-padded to the longest row of the micro-batch with an
  ``attention_mask``, kept for comparison and for kernels without variable-length
  support. ``VARLEN_SDPA`` (its mask entry hands the kernel the ``[B, L]`` padding mask,
  as transformers does for flash attention) runs each row's attention at the row's own
  length, so padded rows score exactly as packed ones. A kernel that attends over the
  padded width (``sdpa``, ``eager``) is exact only up to rounding: PyTorch's CPU
  flash-attention kernel (``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp``) picks its
  query/key block sizes from the sequence length and each query block's causal end, so a
  row computed inside a longer sequence sums its attention in another order, with or
  without a mask (measured bounds: ``agentrl.trainer.config.ATTENTION_WIDTH_LOG_PROB_TOL``
  and ``ATTENTION_WIDTH_GRAD_TOL``).

Micro-batches are formed in ``agentrl.trainer.micro_batches``; the tokens are scored in
``agentrl.trainer.scoring`` (LM head only where a loss reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, Sequence, get_args

import torch

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer.config import PACKING_MODES
from agentrl.trainer.micro_batches import right_pad_rows

ScoredPositions = Literal["loss", "all"]
SCORED_POSITIONS: tuple[str, ...] = get_args(ScoredPositions)


@dataclass(frozen=True)
class ModelInputs:
    """The model inputs of one micro-batch in one layout, on the target device.

    Attributes:
        input_ids, position_ids: ``[1, Tm]`` (packed) or ``[B, L]`` (padded) int64.
        attention_mask: ``None`` (packed) or ``[B, L]`` int64, 0 on padding.
        attn_kwargs: ``cu_seq_lens_q/k`` (int32 ``[B + 1]``) and ``max_length_q/k`` for
            packed rows; empty when padded.
        flat_index: ``[Tm]`` int64, the flat model position (``b * L + t``) of each packed
            token of the micro-batch.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    attn_kwargs: dict[str, Any]
    flat_index: torch.Tensor


def model_inputs(
    input_ids: torch.Tensor, position_ids: torch.Tensor, seq_lens: Sequence[int], layout: str, device: torch.device
) -> ModelInputs:
    """Lay out a micro-batch's packed rows for the model.

    Args:
        input_ids, position_ids: ``[Tm]`` int64, the micro-batch's rows concatenated
            (``TokenBatch.select_rows(rows)``).
        seq_lens: the ``B`` row lengths, ``sum == Tm``.
        layout: ``"packed"`` or ``"padded"``.
        device: where the model computes.

    Raises:
        ConfigError: unknown ``layout``.
    """
    lens = [int(n) for n in seq_lens]
    total = sum(lens)
    if layout == "packed":
        cu = torch.tensor([0] + lens, dtype=torch.int32).cumsum(0, dtype=torch.int32).to(device)  # (B+1,)
        width = max(lens)
        return ModelInputs(
            input_ids=input_ids.reshape(1, total).to(device),  # (1, Tm)
            position_ids=position_ids.reshape(1, total).to(device),  # (1, Tm)
            attention_mask=None,
            attn_kwargs={"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": width, "max_length_k": width},
            flat_index=torch.arange(total, device=device),  # (Tm,)
        )
    if layout == "padded":
        slices, start = [], 0
        for n in lens:
            slices.append(slice(start, start + n))
            start += n
        ids, pos, attn = right_pad_rows(input_ids, position_ids, slices, range(len(lens)))  # (B, L) each
        width = ids.shape[1]
        flat = torch.cat([torch.arange(n) + b * width for b, n in enumerate(lens)])  # (Tm,)
        return ModelInputs(ids.to(device), pos.to(device), attn.to(device), {}, flat.to(device))
    raise ConfigError(f"row_layout={layout!r}; expected one of {PACKING_MODES}")


def scored_targets(loss_mask: torch.Tensor, seq_lens: Sequence[int], positions: str) -> torch.Tensor:
    """Packed indices ``t`` of the tokens whose log-prob is computed (each predicted from
    the hidden state at ``t - 1``, inside its row).

    Args:
        loss_mask: ``[Tm]`` 0/1.
        seq_lens: the ``B`` row lengths.
        positions: ``"loss"``: tokens with ``loss_mask == 1`` (never a row's first token;
            ``TokenBatch.pack`` and the trainer check it); ``"all"``: every token except
            each row's first (nothing to condition on).

    Returns:
        ``[n]`` int64 on CPU, ascending.

    Raises:
        ConfigError: unknown ``positions``.
        ContractError: a loss token at a row's first position.
    """
    lens = torch.as_tensor([int(n) for n in seq_lens], dtype=torch.long)  # (B,)
    starts = torch.cumsum(lens, 0) - lens  # (B,)
    if positions == "loss":
        if bool((loss_mask[starts] > 0).any()):
            raise ContractError("loss_mask is 1 on a row's first token, which has no prefix to be scored from")
        return torch.nonzero(loss_mask > 0).flatten()  # (n,)
    if positions == "all":
        keep = torch.ones(int(lens.sum()), dtype=torch.bool)  # (Tm,)
        keep[starts] = False
        return torch.nonzero(keep).flatten()  # (n,)
    raise ConfigError(f"positions={positions!r}; expected one of {SCORED_POSITIONS}")
