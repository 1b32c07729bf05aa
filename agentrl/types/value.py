"""Value targets for a critic: ``ValueRow`` (one token row with the ``[K]`` positions
where values are read, their float targets and rollout-time values) and ``ValueBatch``
(rows packed without padding: int64 token tensors ``[T]``, int64 positions ``[N]``,
float32 targets ``[N]``), built only by the validating ``ValueBatch.pack``.

torch is imported inside ``ValueBatch.pack``, so importing this module stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

from agentrl.errors import ContractError


def _slices(lens: Sequence[int]) -> list[slice]:
    out, start = [], 0
    for n in lens:
        out.append(slice(start, start + n))
        start += n
    return out


@dataclass(frozen=True)
class ValueRow:
    """One value-model row before packing (what ``ValueBatch.pack`` takes).

    The one batch type for value targets: a critic reads values at chosen *positions* of
    the same token rows the policy trains on, and is fitted to ``returns`` there.
    ``TokenBatch`` carries no value targets (a per-token ``returns`` would be wrong for the
    turn-level critic, which has one target per turn, not per token).

    Attributes:
        input_ids: ``[L]`` token ids (a row of ``Episode.training_sequences``).
        positions: ``[K]`` row-local token indices in ``[0, L)`` where values are read:
            each turn's boundary (the last token before turn k's completion) for
            ``turn_critic``, or ``p - 1`` for every sampled token ``p`` for ``gae``.
        returns: ``[K]`` value targets, or ``None`` for a batch that is only evaluated.
        old_values: ``[K]`` values at rollout time (for value clipping), or ``None``.
        episode_id: for error messages.
    """

    input_ids: Sequence[int]
    positions: Sequence[int]
    returns: Sequence[float] | None = None
    old_values: Sequence[float] | None = None
    episode_id: str = ""


@dataclass(frozen=True)
class ValueBatch:
    """Packed value-model input (no padding). Build it only with ``ValueBatch.pack``.

    Attributes:
        input_ids: ``[T]`` int64, rows concatenated.
        position_ids: ``[T]`` int64, restarting at 0 per row.
        seq_lens: ``[B]`` int64 row lengths, ``sum(seq_lens) == T``.
        positions: ``[N]`` int64 row-local token index of every value position, rows in
            order (``N`` = total value positions).
        positions_per_row: ``[B]`` int64, ``sum == N``.
        returns: ``[N]`` float32 targets, or ``None`` (evaluation only).
        old_values: ``[N]`` float32 rollout-time values, or ``None``.
        episode_ids: ``B`` strings.
    """

    input_ids: Any
    position_ids: Any
    seq_lens: Any
    positions: Any
    positions_per_row: Any
    returns: Any
    old_values: Any
    episode_ids: tuple[str, ...]

    @property
    def num_rows(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_positions(self) -> int:
        return int(self.positions.shape[0])

    def row_slices(self) -> list[slice]:
        """Token-range slice of each row in the packed token tensors."""
        return _slices(self.seq_lens.tolist())

    def position_slices(self) -> list[slice]:
        """Range of each row's value positions in ``positions`` / ``returns`` / ``old_values``."""
        return _slices(self.positions_per_row.tolist())

    @classmethod
    def pack(cls, rows: Sequence[ValueRow]) -> "ValueBatch":
        """Validate and pack rows (position ids ``0..L-1`` per row).

        Raises:
            ContractError: no rows, an empty row, a position outside its row,
                ``len(returns) != len(positions)`` (or ``old_values``), a non-finite
                return or old value, ``returns`` or ``old_values`` on some rows only.
        """
        import torch  # heavy: imported only when a batch is built

        if not rows:
            raise ContractError("ValueBatch.pack got no rows")
        with_old = rows[0].old_values is not None
        with_ret = rows[0].returns is not None
        ids: list[int] = []
        pos: list[int] = []
        lens: list[int] = []
        where: list[int] = []
        ret: list[float] = []
        old: list[float] = []
        counts: list[int] = []
        for i, r in enumerate(rows):
            n = len(r.input_ids)
            if n == 0:
                raise ContractError(f"row {i} ({r.episode_id}) has no tokens")
            p = [int(x) for x in r.positions]
            k = len(p)
            bad = [x for x in p if not 0 <= x < n]
            if bad:
                raise ContractError(f"row {i} ({r.episode_id}): position {bad[0]} outside the row's tokens [0, {n})")
            if (r.old_values is not None) != with_old:
                raise ContractError("either every row carries old_values or none does")
            if (r.returns is not None) != with_ret:
                raise ContractError("either every row carries returns or none does")
            for name, vals, out in (("returns", r.returns, ret), ("old_values", r.old_values, old)):
                if vals is None:
                    continue
                v = [float(x) for x in vals]
                if len(v) != k:
                    raise ContractError(
                        f"row {i} ({r.episode_id}): {len(v)} {name} for {k} positions; expected one per position"
                    )
                if not all(math.isfinite(x) for x in v):
                    raise ContractError(f"row {i} ({r.episode_id}): {name} {v} are not all finite")
                out.extend(v)
            ids.extend(int(x) for x in r.input_ids)
            pos.extend(range(n))
            lens.append(n)
            where.extend(p)
            counts.append(k)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
            seq_lens=torch.tensor(lens, dtype=torch.long),
            positions=torch.tensor(where, dtype=torch.long),
            positions_per_row=torch.tensor(counts, dtype=torch.long),
            returns=torch.tensor(ret, dtype=torch.float32) if with_ret else None,
            old_values=torch.tensor(old, dtype=torch.float32) if with_old else None,
            episode_ids=tuple(r.episode_id for r in rows),
        )
