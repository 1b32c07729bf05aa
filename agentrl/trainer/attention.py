"""The trainer's attention kernel: ``VARLEN_SDPA`` (``agentrl_varlen_sdpa``), causal
attention that runs every row of a micro-batch at the row's own length, packed or padded,
and the choice of kernel when the model loads (``resolve_attn_implementation``).

``varlen_sdpa_attention`` is registered with transformers' ``AttentionInterface`` and its
mask hook (``_varlen_sdpa_mask``) with ``AttentionMaskInterface`` under ``VARLEN_SDPA``
(``register_varlen_sdpa``). Packed rows (``agentrl.trainer.packing``, one ``[1, Tm]``
sequence) reach it with their boundaries as ``cu_seq_lens_q/k`` (the keyword arguments
Hugging Face's variable-length flash attention reads) or as restarts of ``position_ids``;
padded rows with their ``[B, L]`` padding mask. Either way each row is one
``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` call over its
own tokens: no FLOP on padding or between rows, no dense ``[Tm, Tm]`` mask, and each row
scored bit for bit as a plain forward of the row alone. Kernels that attend over the
micro-batch's width (``sdpa``, ``eager``) are exact only up to rounding
(``agentrl.trainer.config.ATTENTION_WIDTH_LOG_PROB_TOL``, ``ATTENTION_WIDTH_GRAD_TOL``).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.nn.functional as F

from agentrl.errors import ContractError
from agentrl.trainer.config import VARLEN_SDPA  # one source for the name

__all__ = [
    "VARLEN_SDPA",
    "flash_attn_available",
    "register_varlen_sdpa",
    "resolve_attn_implementation",
    "varlen_sdpa_attention",
]

_register_lock = threading.Lock()


def _segments_from_position_ids(position_ids: torch.Tensor) -> list[int]:
    """Row boundaries ``[0, ..., Tm]`` of a packed ``[1, Tm]`` ``position_ids`` (a row
    starts wherever the position does not follow the previous one by 1)."""
    pos = position_ids.reshape(-1)  # (Tm,)
    starts = torch.nonzero(torch.diff(pos, prepend=pos[:1] - 2) != 1).flatten()  # (n,)
    return starts.tolist() + [int(pos.numel())]


def varlen_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    cu_seq_lens_k: torch.Tensor | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention of packed (or padded) rows, one ``scaled_dot_product_attention``
    call per row at the row's own length.

    The ``AttentionInterface`` signature of transformers (``sdpa_attention_forward``).
    With a ``[B, L]`` padding mask (padded rows) each row runs over its own tokens
    (``_padded_rows_attention``); with any other prepared mask (a 4-D one, decoding) it
    defers to transformers' own SDPA function unchanged.

    Args:
        module: the attention module (``num_key_value_groups`` read for GQA).
        query: ``[1, H, Tm, D]``; key, value: ``[1, Hkv, Tm, D]``.
        attention_mask: ``None`` for packed rows; ``[B, L]`` bool for padded rows (what
            ``_varlen_sdpa_mask`` returns), each row's attention then runs at its own length.
        dropout, scaling: as in ``scaled_dot_product_attention`` (dropout must be 0 for
            exact scoring; the trainer switches dropout off at load).
        cu_seq_lens_q, cu_seq_lens_k: int ``[n + 1]`` row boundaries (equal: self-attention);
            when absent they are read from ``kwargs["position_ids"]`` (restarts at 0).

    Returns:
        ``([1, Tm, H, D], None)`` (``[B, L, H, D]`` for padded rows), the layout
        transformers' attention functions return.

    Raises:
        ContractError: row boundaries given with a batch dimension other than 1, or query
            and key boundaries that differ.
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if cu_seq_lens_q is not None and query.shape[0] != 1:
        raise ContractError(f"packed attention expects a batch of 1 sequence, got query {tuple(query.shape)}")
    if attention_mask is not None and attention_mask.dim() == 2:  # padded rows (``_varlen_sdpa_mask``)
        return _padded_rows_attention(query, key, value, attention_mask, dropout, scaling), None
    if attention_mask is not None or query.shape[2] == 1 or query.shape[0] != 1:
        # a prepared 4-D mask, rows without padding (whose mask was dropped), decoding
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if cu_seq_lens_q is not None:
        if cu_seq_lens_k is not None and not torch.equal(cu_seq_lens_q, cu_seq_lens_k):
            raise ContractError("cu_seq_lens_q != cu_seq_lens_k; packed self-attention needs the same rows")
        bounds = cu_seq_lens_q.tolist()
    elif kwargs.get("position_ids") is not None:
        bounds = _segments_from_position_ids(kwargs["position_ids"])
    else:
        bounds = [0, query.shape[2]]
    gqa = query.shape[1] != key.shape[1]
    outs = []
    for s, e in zip(bounds[:-1], bounds[1:]):
        outs.append(
            F.scaled_dot_product_attention(
                query[:, :, s:e],  # (1, H, n_i, D)
                key[:, :, s:e],  # (1, Hkv, n_i, D)
                value[:, :, s:e],  # (1, Hkv, n_i, D)
                dropout_p=dropout,
                scale=scaling,
                is_causal=e - s > 1,
                enable_gqa=gqa,
            )
        )
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (1, H, Tm, D)
    return out.transpose(1, 2).contiguous(), None  # (1, Tm, H, D)


def _padded_rows_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    keep: torch.Tensor,
    dropout: float,
    scaling: float | None,
) -> torch.Tensor:
    """Causal attention of padded rows, one ``scaled_dot_product_attention`` call per row
    over its kept positions only, so each row is computed at its own length and matches
    the same row scored alone (or packed) bit for bit.

    Args:
        query: ``[B, H, L, D]``; key, value: ``[B, Hkv, L, D]``.
        keep: ``[B, L]`` bool (or 0/1), 1 on the row's tokens. Right padding (the trainer's)
            takes each row's prefix as a view; any other pattern gathers the kept positions,
            which then attend causally among themselves (as flash attention's unpadding).
        dropout, scaling: as in ``scaled_dot_product_attention``.

    Returns:
        ``[B, L, H, D]``; 0 at padding positions.
    """
    keep = keep.to(device=query.device, dtype=torch.bool)  # (B, L)
    gqa = query.shape[1] != key.shape[1]
    width = query.shape[2]
    rows = []
    for b in range(query.shape[0]):
        n = int(keep[b].sum())
        if n == 0:
            rows.append(query.new_zeros(1, query.shape[1], width, query.shape[3]))  # (1, H, L, D)
            continue
        prefix = bool(keep[b, :n].all())  # right padding
        if prefix:
            q, k, v = query[b : b + 1, :, :n], key[b : b + 1, :, :n], value[b : b + 1, :, :n]  # (1, H*, n, D)
        else:
            idx = keep[b].nonzero().flatten()  # (n,)
            q, k, v = (t[b : b + 1].index_select(2, idx) for t in (query, key, value))  # (1, H*, n, D)
        out = F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout, scale=scaling, is_causal=n > 1, enable_gqa=gqa
        )  # (1, H, n, D)
        if prefix:
            pad = out.new_zeros(1, out.shape[1], width - n, out.shape[3])  # (1, H, L - n, D)
            rows.append(torch.cat([out, pad], dim=2) if n < width else out)  # (1, H, L, D)
        else:
            rows.append(out.new_zeros(1, out.shape[1], width, out.shape[3]).index_copy(2, idx, out))  # (1, H, L, D)
    return torch.cat(rows).transpose(1, 2).contiguous()  # (B, L, H, D)


def _varlen_sdpa_mask(*args: Any, attention_mask: torch.Tensor | None = None, **kwargs: Any) -> torch.Tensor | None:
    """``AttentionMaskInterface`` entry of ``VARLEN_SDPA``: no mask for packed input (the
    kernel reads the row boundaries) or for rows without padding; for padded rows the
    ``[B, L]`` bool padding mask itself (as transformers' ``flash_attention_mask``), from
    which the kernel takes each row's length. Decoding with a cache (queries shorter than
    the keys) gets transformers' SDPA mask."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask

    if attention_mask is None:
        return None
    plain_causal = kwargs.get("mask_function", causal_mask_function) is causal_mask_function
    no_cache = kwargs.get("q_offset", 0) == 0 and kwargs.get("kv_offset", 0) == 0
    same_length = kwargs.get("q_length") == kwargs.get("kv_length") == attention_mask.shape[-1]
    if not args and attention_mask.dim() == 2 and plain_causal and no_cache and same_length:
        return None if bool(attention_mask.all()) else attention_mask.to(torch.bool)  # (B, L)
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register_varlen_sdpa() -> str:
    """Register ``VARLEN_SDPA`` with transformers (idempotent); return its name."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    with _register_lock:
        AttentionInterface.register(VARLEN_SDPA, varlen_sdpa_attention)
        AttentionMaskInterface.register(VARLEN_SDPA, _varlen_sdpa_mask)
    return VARLEN_SDPA


def flash_attn_available() -> bool:
    """Whether the ``flash_attn`` package can be imported."""
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


def resolve_attn_implementation(name: str, *, device: str, dtype: str) -> str:
    """The ``attn_implementation`` passed to ``from_pretrained`` for a config value.

    ``"auto"``: ``flash_attention_2`` on CUDA with ``flash_attn`` installed and bf16
    compute (flash attention has no fp32 kernel), else ``VARLEN_SDPA`` (registered here).
    ``VARLEN_SDPA`` itself is registered when named. Other names pass through.
    """
    if name == "auto":
        if device == "cuda" and dtype == "bfloat16" and flash_attn_available():
            return "flash_attention_2"
        return register_varlen_sdpa()
    if name == VARLEN_SDPA:
        return register_varlen_sdpa()
    return name
