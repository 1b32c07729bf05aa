"""Which rows go into which micro-batch, on which rank, and how a micro-batch's packed rows
are right-padded for the ``"padded"`` packing mode (``TrainerConfig.row_layout``).

Rank ``r`` of ``W`` works on rows ``r, r + W, r + 2W, ...`` (``rank_rows``). Its rows are
grouped into micro-batches: with ``"packed"``, bin-packed (first-fit decreasing) into at
most ``micro_batch_tokens`` tokens each (``pack_micro_batches``); with ``"padded"``, in
order by ``micro_batch_size`` rows and an optional cap on rows x longest row
(``micro_batches``); ``layout_micro_batches`` picks by mode. ``align_micro_batches``
pads a rank's list with empty groups (dummy passes) to the largest count of any rank, so
FSDP's collectives line up. ``padded_positions`` counts the padding a grouping costs
(``perf/padding_frac``).

Pure functions of row indices and lengths, except ``align_micro_batches`` (one MAX
all-reduce over the default process group).
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError
from agentrl.trainer.config import PACKING_MODES

DEFAULT_MICRO_BATCH_TOKENS = 8192
"""Token budget of a packed micro-batch when the config gives none."""


def pack_micro_batches(rows: Sequence[int], row_lens: Sequence[int], budget: int) -> list[list[int]]:
    """Bin-pack ``rows`` into micro-batches of at most ``budget`` tokens (first-fit
    decreasing: longest row first, each into the first micro-batch with room).

    A row longer than ``budget`` runs alone. Deterministic: ties in length keep row
    order; micro-batches come in creation order, each listing its rows in ascending order.

    Args:
        rows: indices of this rank's rows.
        row_lens: ``row_lens[r]`` = tokens of row ``r`` (indexed by row id, all rows).
        budget: tokens per micro-batch, >= 1.

    Returns:
        Lists of row indices; every row of ``rows`` in exactly one.

    Raises:
        ConfigError: ``budget < 1``.
    """
    if not (isinstance(budget, int) and budget >= 1):
        raise ConfigError(f"micro_batch_tokens={budget!r}; expected an int >= 1")
    order = sorted(rows, key=lambda r: (-int(row_lens[r]), r))
    bins: list[list[int]] = []
    room: list[int] = []
    for r in order:
        n = int(row_lens[r])
        for i, free in enumerate(room):
            if n <= free:
                bins[i].append(r)
                room[i] -= n
                break
        else:
            bins.append([r])
            room.append(budget - n)
    return [sorted(b) for b in bins]


def padded_positions(groups: Sequence[Sequence[int]], row_lens: Sequence[int], layout: str) -> tuple[int, int]:
    """``(padding, scored)``: positions the model runs on that are padding, and all
    positions it runs on, over ``groups`` (0 padding when packed)."""
    pad = scored = 0
    for g in groups:
        if not g:
            continue
        lens = [int(row_lens[r]) for r in g]
        width = sum(lens) if layout == "packed" else len(lens) * max(lens)
        scored += width
        pad += width - sum(lens)
    return pad, scored


def rank_rows(num_rows: int, rank: int, world_size: int) -> list[int]:
    """Rows ``rank, rank + W, rank + 2W, ...`` of ``num_rows``."""
    return list(range(rank, num_rows, world_size))


def micro_batches(
    rows: Sequence[int], row_lens: Sequence[int], micro_batch_size: int, micro_batch_tokens: int | None
) -> list[list[int]]:
    """Group ``rows`` in order: at most ``micro_batch_size`` rows and (if set) at most
    ``micro_batch_tokens`` padded tokens (rows x longest row) per group; a single row over
    the token cap runs alone. ``row_lens[r]`` is row ``r``'s token count."""
    groups: list[list[int]] = []
    cur: list[int] = []
    cur_max = 0
    for r in rows:
        new_max = max(cur_max, row_lens[r])
        too_many = len(cur) >= micro_batch_size
        too_big = micro_batch_tokens is not None and cur and (len(cur) + 1) * new_max > micro_batch_tokens
        if cur and (too_many or too_big):
            groups.append(cur)
            cur, new_max = [], row_lens[r]
        cur.append(r)
        cur_max = new_max
    if cur:
        groups.append(cur)
    return groups


def layout_micro_batches(
    rows: Sequence[int],
    row_lens: Sequence[int],
    *,
    layout: str,
    micro_batch_size: int,
    micro_batch_tokens: int | None,
) -> list[list[int]]:
    """Micro-batches of ``rows`` for a packing mode: ``"packed"`` bin-packs rows into at
    most ``micro_batch_tokens`` tokens each (``pack_micro_batches``; ``None``: the default
    budget ``DEFAULT_MICRO_BATCH_TOKENS``; ``micro_batch_size`` unused); ``"padded"`` groups
    rows in order (``micro_batches``).

    Raises:
        ConfigError: unknown ``layout``.
    """
    if layout == "packed":
        budget = DEFAULT_MICRO_BATCH_TOKENS if micro_batch_tokens is None else micro_batch_tokens
        return pack_micro_batches(rows, row_lens, budget)
    if layout == "padded":
        return micro_batches(rows, row_lens, micro_batch_size, micro_batch_tokens)
    raise ConfigError(f"row_layout={layout!r}; expected one of {PACKING_MODES}")


def align_micro_batches(groups: list[list[int]], device: torch.device, world_size: int) -> list[list[int]]:
    """``groups`` padded with empty groups (dummy passes) to the largest count of any
    rank, so every rank runs the same number of FSDP passes. Collective."""
    n = torch.tensor([len(groups)], dtype=torch.int64, device=device)
    if world_size > 1:
        dist.all_reduce(n, op=dist.ReduceOp.MAX)
    return groups + [[] for _ in range(int(n.item()) - len(groups))]


def right_pad_rows(
    input_ids: torch.Tensor, position_ids: torch.Tensor, slices: Sequence[slice], rows: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Packed rows → right-padded ``(ids, pos, attn)``, each ``[B, L]`` int64 on CPU, with
    ``L`` the longest selected row; pad id 0 and ``attn`` 0 on padding."""
    lens = [slices[r].stop - slices[r].start for r in rows]
    n_rows, width = len(rows), max(lens)
    ids = torch.zeros(n_rows, width, dtype=torch.long)  # (B, L)
    pos = torch.zeros(n_rows, width, dtype=torch.long)  # (B, L)
    attn = torch.zeros(n_rows, width, dtype=torch.long)  # (B, L)
    for b, (r, n) in enumerate(zip(rows, lens)):
        ids[b, :n] = input_ids[slices[r]]
        pos[b, :n] = position_ids[slices[r]]
        attn[b, :n] = 1
    return ids, pos, attn
