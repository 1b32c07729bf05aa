"""``CriticTrainer``: a value model (``TurnValueModel``) trained under FSDP2 with
(optionally clipped) MSE to returns, one instance per rank.

The model reads a value at given token positions of each row, so one trainer serves both
critic estimators:

* ``turn_critic``: one position per turn, the turn boundary (``agentrl.credit.episode_boundaries``).
  Values feed ``critics.turn_critic_advantages`` (ArCHer, Zhou et al. 2024, §4; RAGEN's
  bi-level GAE).
* ``gae``: one position per sampled token, the token before it
  (``agentrl.credit.episode_token_positions``; verl's ``values[:, -resp_len-1:-1]``). Values feed
  ``critics.token_critic_advantages`` (PPO's token-level GAE).

The targets are the ``returns`` those give back. Below, "turn" means one value position
(a turn for ``turn_critic``, a sampled token for ``gae``): the loss is a mean over them
(token-mean for ``gae``, as verl's critic loss).

Reading order: ``agentrl.trainer.config.CriticConfig`` → ``agentrl.types.ValueBatch``
(the input) → ``CriticTrainer.__init__`` → ``compute_values`` → ``step`` → checkpoints.
The loss is ``agentrl.trainer.losses.value_loss_terms``; loading, sharding, the optimizer,
micro-batching, dummy passes, the epoch loop and checkpoints are ``PolicyTrainer``'s, through
one ``agentrl.trainer._core.TrainerCore``. This file keeps the value scoring.

Distributed contract: as ``PolicyTrainer`` (see ``agentrl.trainer.trainer``): the caller
initialises the default process group, then calls every public method on every rank with
the same full ``ValueBatch``; rank ``r`` works on rows ``r, r + W, ...``, micro-batched;
a rank with fewer micro-batches runs dummy one-token passes with zero weight. The loss is
divided by the *global* number of turns (value positions) of the step and gradients are summed across ranks,
so they do not depend on the micro-batch size or the number of ranks (docs/design.md,
invariant 5).
"""

from __future__ import annotations

import os
import time
from typing import Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ContractError
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.micro_batches import right_pad_rows
from agentrl.trainer.config import CriticConfig
from agentrl.trainer.losses import value_loss_terms
from agentrl.trainer.value_model import TurnValueModel
from agentrl.types import ValueBatch

__all__ = ["CriticConfig", "CriticTrainer"]


class CriticTrainer:
    """Value-model trainer (turn-level or token-level critic) for one rank of an FSDP2
    data-parallel group.

    Attributes:
        config: the validated ``CriticConfig``.
        rank, world_size, device: as ``PolicyTrainer``.
        global_step: completed ``step()`` calls (restored by ``load_checkpoint``).
        model: the FSDP2-wrapped ``TurnValueModel``.

    Raises (constructor):
        ConfigError: invalid config, no process group, CUDA requested but absent, or a
            model folder that cannot be loaded.
    """

    def __init__(self, config: CriticConfig) -> None:
        config.validate()
        self.config = config
        # seed, load the backbone (dropout off), gradient checkpointing, the value head
        # (initialised from the seeded RNG), FSDP2, AdamW + warmup
        self._core = TrainerCore(
            "CriticTrainer",
            config,
            causal_lm=False,
            dummy_output=_value_dummy_output,
            wrap=lambda backbone: TurnValueModel(backbone, head_init_std=float(config.head_init_std)),
        )
        self.rank, self.world_size = self._core.rank, self._core.world_size
        self.device = self._core.device
        self.model = self._core.model

    @property
    def global_step(self) -> int:
        """Completed ``step()`` calls (restored by ``load_checkpoint``)."""
        return self._core.global_step

    # ------------------------------------------------------------------ values

    @torch.no_grad()
    def compute_values(self, batch: ValueBatch) -> torch.Tensor:
        """The value at every position of ``batch.positions`` (``V(s_k)`` at each turn
        boundary, or ``V`` before each sampled token for ``gae``) under the current weights.

        Collective: call on every rank with the same batch; every rank gets the result.

        Returns:
            ``[N]`` float32 on CPU, turns in ``batch.positions`` order (split per row with
            ``batch.position_slices()``).

        Raises:
            ContractError: a token id outside the vocabulary.
        """
        self._check_batch(batch, for_training=False)
        out = torch.zeros(batch.num_positions, dtype=torch.float32, device=self.device)  # (N,)
        tsl = batch.position_slices()
        for rows in self._groups(batch):
            if not rows:
                self._core.dummy_forward(with_grad=False)
                continue
            v = self._values_of_rows(batch, rows, with_grad=False)  # (n,)
            idx = _turn_index(tsl, rows).to(self.device)
            out[idx] = v
        # Turns are disjoint across ranks and 0 elsewhere, so the sum is exact.
        self._core.all_reduce(out, dist.ReduceOp.SUM)
        return out.cpu()

    # ------------------------------------------------------------------ training

    def step(self, batch: ValueBatch) -> dict[str, float]:
        """``config.epochs`` optimizer steps of value regression on ``batch``.

        Loss per epoch: ``sum over the batch's turns of value_loss_terms(...) / N`` with
        ``N`` the global turn count (all-reduced), gradients summed across ranks, global
        gradient-norm clipping, AdamW, scheduler step.

        Collective: call on every rank with the same batch.

        Returns:
            Metrics (identical on every rank; means over epochs unless said):
            ``losses/value_loss``, ``losses/value_clipfrac``, ``critic/values_mean``,
            ``critic/returns_mean``, ``critic/explained_variance`` (``1 - Var(R - V) /
            Var(R)`` over the batch, first epoch's values; 0 when ``Var(R) == 0``),
            ``train/grad_norm`` (pre-clip), ``train/lr`` (last optimizer step),
            ``train/num_value_positions`` (turns, or sampled tokens for ``gae``),
            ``train/skipped_step`` (optimizer steps skipped for a non-finite gradient norm),
            ``train/no_signal_steps`` (optimizer steps not taken because the gradient was
            exactly zero, e.g. every return equal to its value), ``train/global_step``,
            ``perf/step_s``.

        Raises:
            ContractError: no value positions or no ``returns`` in the batch, a token id outside the
                vocabulary, or ranks holding different batches.
        """
        t0 = time.perf_counter()
        cfg = self.config
        self._check_batch(batch, for_training=True)
        dev = self.device
        n_turns = float(batch.num_positions)  # every rank holds the full batch (checked)
        if n_turns == 0:
            raise ContractError("ValueBatch has no value positions; nothing to train on")
        if batch.returns is None:
            raise ContractError("ValueBatch has no returns; step() needs value targets (compute_values does not)")
        groups = self._groups(batch)
        tsl = batch.position_slices()
        old_first: list[torch.Tensor | None] = [None] * len(groups)
        names = ("losses/value_loss", "losses/value_clipfrac", "critic/values_mean")
        # first-epoch sums for explained variance: [sum R, sum R^2, sum (R-V), sum (R-V)^2]
        ev = torch.zeros(4, dtype=torch.float64, device=dev)

        def micro_step(epoch: int, g: int, rows: list[int]) -> torch.Tensor:
            """Values, loss and backward of one micro-batch; returns [loss, clipped
            positions, sum V] over its value positions, float64."""
            idx = _turn_index(tsl, rows)
            ret = batch.returns[idx].to(dev)  # (n,)
            v = self._values_of_rows(batch, rows, with_grad=True)  # (n,)
            if epoch == 0:
                old_first[g] = v.detach()
                err = (ret - v.detach()).double()
                ev.add_(torch.stack([ret.double().sum(), (ret.double() ** 2).sum(), err.sum(), (err**2).sum()]))
            if cfg.value_clip is not None:
                old = batch.old_values[idx].to(dev) if batch.old_values is not None else old_first[g]
            else:
                old = None
            per_turn, clipped = value_loss_terms(v, ret, old, cfg.value_clip)  # (n,), (n,)
            loss = per_turn.sum() / n_turns
            loss.backward()
            return torch.stack([loss.detach().double(), clipped.double().sum(), v.detach().double().sum()])

        stats = self._core.optimize(groups, cfg.epochs, micro_step, len(names))
        self._core.all_reduce(ev, dist.ReduceOp.SUM)
        totals = {k: 0.0 for k in names}
        for acc in stats.sums:
            totals["losses/value_loss"] += acc[0]
            totals["losses/value_clipfrac"] += acc[1] / n_turns
            totals["critic/values_mean"] += acc[2] / n_turns

        s_r, s_r2, s_e, s_e2 = (float(x) for x in ev.tolist())
        var_r = s_r2 / n_turns - (s_r / n_turns) ** 2
        var_e = s_e2 / n_turns - (s_e / n_turns) ** 2
        n_ep = float(cfg.epochs)
        out = {k: v / n_ep for k, v in totals.items()}
        out.update(
            {
                "critic/returns_mean": s_r / n_turns,
                "critic/explained_variance": 1.0 - var_e / var_r if var_r > 1e-12 else 0.0,
                "train/grad_norm": sum(stats.grad_norms) / n_ep,
                "train/lr": stats.lr,
                "train/num_value_positions": n_turns,
                "train/skipped_step": float(stats.skipped),
                "train/no_signal_steps": float(stats.no_signal),
                "train/global_step": float(self.global_step),
                "perf/step_s": time.perf_counter() - t0,
            }
        )
        return out

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write model, optimizer, scheduler, RNG states and the step counter to ``path``
        (the layout ``PolicyTrainer.save_checkpoint`` documents; use a folder of its
        own, e.g. ``<run checkpoint>/critic``). Collective.

        Raises:
            CheckpointError: ``path`` already holds a checkpoint.
        """
        self._core.save_checkpoint(path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what ``save_checkpoint`` wrote (re-sharding to this world size).
        Collective.

        Raises:
            CheckpointError: not a complete checkpoint, or tensors that do not match.
        """
        self._core.load_checkpoint(path)

    # ------------------------------------------------------------------ internals

    def _check_batch(self, batch: ValueBatch, *, for_training: bool) -> None:
        if not isinstance(batch, ValueBatch):
            raise ContractError(f"expected a ValueBatch, got {type(batch).__name__}")
        self._core.check_vocab(batch.input_ids)
        if for_training:
            fp = [
                float(batch.num_tokens),
                float(batch.num_rows),
                float(batch.num_positions),
                float((batch.input_ids % 9973).sum()),
                float(batch.returns.double().sum()) if batch.returns is not None else 0.0,
            ]
            self._core.check_same_on_all_ranks(
                fp,
                "ranks hold different critic batches (token, row or value-position count, id "
                "or return checksum differ); every rank must get the same full ValueBatch",
            )

    def _groups(self, batch: ValueBatch) -> list[list[int]]:
        """This rank's micro-batches of rows, aligned across ranks (empty: dummy pass)."""
        return self._core.aligned_micro_batches(self._core.my_rows(batch.num_rows), batch.seq_lens.tolist())

    def _values_of_rows(self, batch: ValueBatch, rows: Sequence[int], *, with_grad: bool) -> torch.Tensor:
        """Forward ``rows`` right-padded; return their turns' values ``[n]`` in order."""
        dev = self.device
        ids, pos, attn = right_pad_rows(batch.input_ids, batch.position_ids, batch.row_slices(), rows)  # (B, L)
        tsl = batch.position_slices()
        counts = [tsl[r].stop - tsl[r].start for r in rows]
        k_max = max(max(counts), 1)
        bidx = torch.zeros(len(rows), k_max, dtype=torch.long)  # (B, K), pad index 0
        valid = torch.zeros(len(rows), k_max, dtype=torch.bool)  # (B, K)
        for b, (r, k) in enumerate(zip(rows, counts)):
            bidx[b, :k] = batch.positions[tsl[r]]
            valid[b, :k] = True
        with torch.set_grad_enabled(with_grad):
            v = self.model(ids.to(dev), attn.to(dev), pos.to(dev), bidx.to(dev))  # (B, K)
            return v[valid.to(dev)]  # (n,)


def _value_dummy_output(model: torch.nn.Module, one: torch.Tensor) -> torch.Tensor:
    """The forward of a dummy pass (``TrainerCore.dummy_forward``): ``[1, 1]`` values
    of a one-token row read at position 0."""
    return model(one, torch.ones_like(one), one, one)  # (1, 1)


def _turn_index(turn_slices: Sequence[slice], rows: Sequence[int]) -> torch.Tensor:
    """Positions in the packed turn tensors of ``rows``' turns, in order: ``[n]`` int64."""
    parts = [torch.arange(turn_slices[r].start, turn_slices[r].stop) for r in rows]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
