"""What the trainer sees: ``TokenSequence`` (one row as Python sequences, before packing)
and ``TokenBatch`` (rows packed without padding into 1-D tensors over ``T`` tokens:
int64 ids, positions and versions, float32 masks, log-probs and advantages), built only
by the validating ``TokenBatch.pack``.

torch is imported inside the functions that build tensors, so importing this module
stays cheap.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

from agentrl.errors import ContractError
from agentrl.types.turn import SamplingRecord


@dataclass(frozen=True)
class TokenSequence:
    """One trainer row before packing (what ``TokenBatch.pack`` takes).

    Attributes:
        input_ids: ``[L]`` token ids.
        loss_mask: ``[L]`` 0/1.
        behavior_log_probs: ``[sum(loss_mask)]`` engine log-probs of the masked tokens.
        advantages: ``[L]`` per-token advantages (0 where ``loss_mask`` is 0).
        group_id, policy_version, episode_id: metadata; ``policy_version`` is the row's
            OLDEST sampled-token version.
        token_policy_versions: ``[L]`` weight version of each sampled token (0 where
            ``loss_mask`` is 0), or ``None``: every sampled token is ``policy_version``.
    """

    input_ids: Sequence[int]
    loss_mask: Sequence[int]
    behavior_log_probs: Sequence[float]
    advantages: Sequence[float]
    group_id: str
    policy_version: int
    episode_id: str = ""
    token_policy_versions: Sequence[int] | None = None


@dataclass(frozen=True)
class TokenBatch:
    """What the trainer sees, and nothing more: packed sequences without padding.

    All per-token tensors are 1-D over the concatenation of the rows (``T`` = total
    tokens). Build it only with ``TokenBatch.pack`` (the one validating constructor).

    Attributes:
        input_ids: ``[T]`` int64.
        position_ids: ``[T]`` int64, restarting at 0 for every row.
        loss_mask: ``[T]`` float32 of 0.0/1.0.
        behavior_log_probs: ``[T]`` float32, engine log-probs on masked tokens, 0 elsewhere.
        advantages: ``[T]`` float32, 0 where ``loss_mask`` is 0.
        seq_lens: ``[B]`` int64 row lengths, ``sum(seq_lens) == T``.
        group_ids: ``B`` strings. episode_ids: ``B``.
        policy_versions: ``[B]`` int64, each row's OLDEST sampled-token version (the
            sample's staleness is ``trainer_version - policy_versions[b]``).
        token_policy_versions: ``[T]`` int64, the weight version that sampled each token,
            0 where ``loss_mask`` is 0 (a row's tokens may span versions: partial rollouts).
        sampling: the transform every row was sampled with (must be uniform).
        proximal_log_probs: ``[T]`` float32 or ``None``: the trainer's log-probs (nats) at
            the weights the update starts from (docs/design.md, "Three log-probs"), finite on
            loss tokens, 0 elsewhere. ``None`` (on-policy, the synchronous loop): the
            trainer takes them from the first epoch's own forward (today's
            ``old_log_probs``). Set them with ``pack(..., proximal_log_probs=...)`` or
            ``with_proximal_log_probs``, which validate them.
    """

    input_ids: Any
    position_ids: Any
    loss_mask: Any
    behavior_log_probs: Any
    advantages: Any
    seq_lens: Any
    policy_versions: Any
    group_ids: tuple[str, ...]
    episode_ids: tuple[str, ...]
    sampling: SamplingRecord
    proximal_log_probs: Any = None
    token_policy_versions: Any = None

    @property
    def num_rows(self) -> int:
        return len(self.group_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_loss_tokens(self) -> int:
        return int(self.loss_mask.sum().item())

    def row_slices(self) -> list[slice]:
        """Token-range slice of each row in the packed tensors."""
        out, start = [], 0
        for n in self.seq_lens.tolist():
            out.append(slice(start, start + n))
            start += n
        return out

    def select_rows(self, rows: Sequence[int]) -> "TokenBatch":
        """A new batch holding only ``rows`` (in that order); used for micro-batching."""
        import torch  # heavy: imported only when a batch is built

        slices = self.row_slices()
        idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]) if rows else torch.zeros(0, dtype=torch.long)

        def take(t: Any) -> Any:
            return None if t is None else t[idx]

        return TokenBatch(
            input_ids=take(self.input_ids),
            position_ids=take(self.position_ids),
            loss_mask=take(self.loss_mask),
            behavior_log_probs=take(self.behavior_log_probs),
            advantages=take(self.advantages),
            seq_lens=self.seq_lens[list(rows)] if rows else self.seq_lens[:0],
            policy_versions=self.policy_versions[list(rows)] if rows else self.policy_versions[:0],
            group_ids=tuple(self.group_ids[r] for r in rows),
            episode_ids=tuple(self.episode_ids[r] for r in rows),
            sampling=self.sampling,
            proximal_log_probs=take(self.proximal_log_probs),
            token_policy_versions=take(self.token_policy_versions),
        )

    def with_proximal_log_probs(self, proximal_log_probs: Any) -> "TokenBatch":
        """This batch with ``proximal_log_probs`` set (``[T]``, e.g. what
        ``PolicyTrainer.compute_log_probs`` returned at the weights the update starts
        from), checked as ``pack`` checks them. ``None`` clears them.

        Raises:
            ContractError: not ``[T]``, or a non-finite value on a loss token.
        """
        return replace(self, proximal_log_probs=_checked_proximal(proximal_log_probs, self.loss_mask))

    @classmethod
    def pack(
        cls, rows: Sequence[TokenSequence], sampling: SamplingRecord, *, proximal_log_probs: Any = None
    ) -> "TokenBatch":
        """Validate and pack rows into one batch.

        Args:
            rows: the rows, in order.
            sampling: the transform every row was sampled with.
            proximal_log_probs: optional ``[T]`` (tensor or sequence, ``T`` = the packed
                token count) trainer log-probs at the weights the update starts from;
                stored as float32, set to 0 off the loss tokens.

        Raises:
            ContractError: empty input, mismatched lengths, ``sum(loss_mask) !=
                len(behavior_log_probs)``, a non-finite advantage, a non-zero
                advantage on an unmasked token, ``proximal_log_probs`` not ``[T]`` or
                not finite on a loss token, or ``token_policy_versions`` not ``[L]``, below
                the row's ``policy_version`` on a loss token, or decreasing along the row.
        """
        import torch  # heavy: imported only when a batch is built

        if not rows:
            raise ContractError("TokenBatch.pack got no rows")
        ids, pos, mask, blp, adv, lens, tpv = [], [], [], [], [], [], []
        for i, r in enumerate(rows):
            n = len(r.input_ids)
            if n == 0:
                raise ContractError(f"row {i} ({r.episode_id}) has no tokens")
            if len(r.loss_mask) != n or len(r.advantages) != n:
                raise ContractError(
                    f"row {i} ({r.episode_id}): input_ids has {n} tokens, loss_mask "
                    f"{len(r.loss_mask)}, advantages {len(r.advantages)}; expected equal"
                )
            m = [int(x) for x in r.loss_mask]
            if any(x not in (0, 1) for x in m):
                raise ContractError(f"row {i}: loss_mask must be 0/1")
            if m[0] == 1:
                raise ContractError(
                    f"row {i} ({r.episode_id}): loss_mask is 1 on the first token, which has no "
                    "prefix to be scored from; a row starts with prompt tokens"
                )
            if sum(m) != len(r.behavior_log_probs):
                raise ContractError(
                    f"row {i} ({r.episode_id}): sum(loss_mask)={sum(m)} != "
                    f"len(behavior_log_probs)={len(r.behavior_log_probs)}"
                )
            a = [float(x) for x in r.advantages]
            for k, (x, mk) in enumerate(zip(a, m)):
                if not math.isfinite(x):
                    raise ContractError(f"row {i} ({r.episode_id}): advantage {x} at token {k} is not finite")
                if mk == 0 and x != 0.0:
                    raise ContractError(
                        f"row {i} ({r.episode_id}): advantage {x} on unmasked token {k}; "
                        "observation tokens never get an advantage"
                    )
            tpv.extend(_checked_token_versions(r, i, m))
            full_lp = [0.0] * n
            it = iter(r.behavior_log_probs)
            for k in range(n):
                if m[k]:
                    full_lp[k] = float(next(it))
            ids.extend(int(x) for x in r.input_ids)
            pos.extend(range(n))
            mask.extend(m)
            blp.extend(full_lp)
            adv.extend(a)
            lens.append(n)
        return cls(
            input_ids=torch.tensor(ids, dtype=torch.long),
            position_ids=torch.tensor(pos, dtype=torch.long),
            loss_mask=torch.tensor(mask, dtype=torch.float32),
            behavior_log_probs=torch.tensor(blp, dtype=torch.float32),
            advantages=torch.tensor(adv, dtype=torch.float32),
            seq_lens=torch.tensor(lens, dtype=torch.long),
            policy_versions=torch.tensor([r.policy_version for r in rows], dtype=torch.long),
            group_ids=tuple(r.group_id for r in rows),
            episode_ids=tuple(r.episode_id for r in rows),
            sampling=sampling,
            token_policy_versions=torch.tensor(tpv, dtype=torch.long),
        ).with_proximal_log_probs(proximal_log_probs)


def _checked_token_versions(r: TokenSequence, i: int, m: Sequence[int]) -> list[int]:
    """Row ``i``'s per-token versions ``[L]`` (0 off the loss tokens); ``None`` means every
    sampled token is the row's ``policy_version``.

    Raises:
        ContractError: not one per token, a sampled token older than the row's version, or
            versions decreasing along the row's sampled tokens.
    """
    if r.token_policy_versions is None:
        return [int(r.policy_version) if mk else 0 for mk in m]
    if len(r.token_policy_versions) != len(m):
        raise ContractError(f"row {i} ({r.episode_id}): token_policy_versions has {len(r.token_policy_versions)} "
                            f"entries for {len(m)} tokens; expected one per token")
    out = [int(v) if mk else 0 for v, mk in zip(r.token_policy_versions, m)]
    sampled = [v for v, mk in zip(out, m) if mk]
    if sampled and min(sampled) < r.policy_version:
        raise ContractError(f"row {i} ({r.episode_id}): a sampled token has version {min(sampled)}, below the row's "
                            f"policy_version={r.policy_version} (expected the row's oldest token version)")
    if any(b < a for a, b in zip(sampled, sampled[1:])):
        raise ContractError(f"row {i} ({r.episode_id}): token_policy_versions decrease along the row's sampled tokens")
    return out


def _checked_proximal(values: Any, loss_mask: Any) -> Any:
    """``values`` as a ``[T]`` float32 tensor, 0 where ``loss_mask`` is 0 (``None`` stays
    ``None``).

    Raises:
        ContractError: not one value per token, or a non-finite value on a loss token.
    """
    import torch  # heavy: imported only when a batch is built

    if values is None:
        return None
    t = torch.as_tensor(values).detach().to(device="cpu", dtype=torch.float32)  # (T,)
    if t.shape != loss_mask.shape:
        raise ContractError(
            f"proximal_log_probs has shape {tuple(t.shape)}; expected {tuple(loss_mask.shape)} "
            "(one log-prob per packed token, [T] float32)"
        )
    on = loss_mask > 0  # (T,)
    bad = (~torch.isfinite(t) & on).nonzero()
    if bad.numel():
        k = int(bad[0])
        raise ContractError(f"proximal_log_probs[{k}]={float(t[k])} on a loss token; expected a finite log-prob")
    return torch.where(on, t, torch.zeros_like(t))  # (T,)
