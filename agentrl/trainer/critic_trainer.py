"""``CriticTrainer``: a value model (``TurnValueModel``) trained under FSDP2 with
(optionally clipped) MSE to returns, one instance per rank.

The model reads a value at given token positions of each row, so one trainer serves both
critic estimators:

* ``turn_critic``: one position per turn, the turn boundary (``critics.episode_boundaries``).
  Values feed ``critics.turn_critic_advantages`` (ArCHer, Zhou et al. 2024, §4; RAGEN's
  bi-level GAE).
* ``gae``: one position per sampled token, the token before it
  (``critics.episode_token_positions``; verl's ``values[:, -resp_len-1:-1]``). Values feed
  ``critics.token_critic_advantages`` (PPO's token-level GAE).

The targets are the ``returns`` those give back. Below, "turn" means one value position
(a turn for ``turn_critic``, a sampled token for ``gae``): the loss is a mean over them
(token-mean for ``gae``, as verl's critic loss).

Reading order: ``CriticConfig`` → ``agentrl.types.ValueBatch`` (the input) →
``CriticTrainer.__init__`` → ``compute_values`` → ``step`` → checkpoints.

Distributed contract: as ``PolicyTrainer`` (see ``agentrl.trainer.trainer``): the caller
initialises the default process group, then calls every public method on every rank with
the same full ``ValueBatch``; rank ``r`` works on rows ``r, r + W, ...``, micro-batched;
a rank with fewer micro-batches runs dummy one-token passes with zero weight. The loss is
divided by the *global* number of turns (value positions) of the step and gradients are summed across ranks,
so they do not depend on the micro-batch size or the number of ranks (design.md,
invariant 5).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer.config import validate_optim_fields
from agentrl.trainer.value_model import TurnValueModel
from agentrl.types import ValueBatch

# ---------------------------------------------------------------------------- config


@dataclass
class CriticConfig:
    """Configuration of ``CriticTrainer``. ``validate()`` (the trainer calls it) raises a
    ``ConfigError`` naming any bad value."""

    model_path: str
    """Hugging Face model folder the backbone is loaded from with ``AutoModel`` (by default
    the policy's base model; a causal-LM checkpoint loads, its ``lm_head`` unused)."""

    head_init_std: float = 0.0
    """Std of the value head's initial weight; 0 (default) zeroes it, so a fresh critic
    predicts 0 everywhere (see ``TurnValueModel``)."""

    value_clip: float | None = None
    """PPO value clipping range ``eps_v`` (``None``: plain MSE). With it the per-turn loss
    is ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)`` (PPO2 /
    CleanRL ``clip_vloss``; verl's ``cliprange_value`` defaults to 0.5). ``V_old`` is
    ``ValueBatch.old_values`` or, when absent, the values of this step's first epoch
    (then clipping only acts from the second epoch on). Returns in reward units."""

    epochs: int = 1
    """Optimizer steps (passes over the batch) per ``step()``."""

    dtype: str = "float32"
    """Compute dtype, ``"float32"`` or ``"bfloat16"`` (FSDP2 mixed precision; parameters
    and optimizer state stay fp32), as ``TrainerConfig.dtype``."""

    device: str = "cpu"
    """``"cpu"`` (gloo) or ``"cuda"`` (nccl; device ``LOCAL_RANK`` else ``rank %
    device_count``)."""

    attn_implementation: str = "sdpa"
    """Attention kernel passed to ``from_pretrained``."""

    lr: float = 1e-5
    """AdamW peak learning rate. Critics usually learn about 10x faster than the policy
    (verl's critic default 1e-5 vs actor 1e-6)."""

    weight_decay: float = 0.0
    """AdamW decoupled weight decay."""

    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW ``(beta1, beta2)``."""

    eps: float = 1e-8
    """AdamW epsilon."""

    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this (``None``: no clipping, norm still
    reported). A non-finite norm skips the optimizer step (``train/skipped_step``)."""

    warmup_steps: int = 0
    """Linear warmup over this many optimizer steps, then constant."""

    micro_batch_size: int = 4
    """Rows per forward/backward on one rank; does not change the result."""

    micro_batch_tokens: int | None = None
    """Optional cap on a micro-batch's padded size (rows x longest row)."""

    seed: int = 0
    """Seeds torch, numpy and ``random`` at construction (the head init uses it)."""

    gradient_checkpointing: bool = False
    """Recompute decoder-layer activations in backward (less memory, ~30% more time)."""

    def validate(self) -> None:
        """Raise ``ConfigError`` naming the first invalid field."""
        validate_optim_fields(self)
        if not (isinstance(self.head_init_std, (int, float)) and math.isfinite(self.head_init_std) and self.head_init_std >= 0):
            raise ConfigError(f"head_init_std={self.head_init_std!r}; expected a finite number >= 0")
        if self.value_clip is not None and not (math.isfinite(self.value_clip) and self.value_clip > 0):
            raise ConfigError(f"value_clip={self.value_clip!r}; expected a finite number > 0 or None")
        if not (isinstance(self.epochs, int) and self.epochs >= 1):
            raise ConfigError(f"epochs={self.epochs!r}; expected an int >= 1")


# ---------------------------------------------------------------------------- loss


def value_loss_terms(
    values: torch.Tensor, returns: torch.Tensor, old_values: torch.Tensor | None, value_clip: float | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn value loss, summed by the caller and divided by the global turn count.

    ``0.5 * (V - R)^2``, or with ``value_clip = eps_v`` and ``old_values``
    ``0.5 * max((V - R)^2, (V_old + clip(V - V_old, -eps_v, eps_v) - R)^2)`` (PPO value
    clipping, as in CleanRL ``ppo.py`` / verl ``compute_value_loss``).

    Args:
        values: ``[N]`` float32 current values (with grad).
        returns: ``[N]`` float32 targets.
        old_values: ``[N]`` float32 or ``None`` (required when ``value_clip`` is set).
        value_clip: ``eps_v > 0`` or ``None``.

    Returns:
        ``(loss [N], clipped [N])``: the per-turn loss and a 0/1 float mask of turns where
        the clipped term was the larger one (for ``losses/value_clipfrac``).
    """
    unclipped = (values - returns) ** 2  # (N,)
    if value_clip is None:
        return 0.5 * unclipped, torch.zeros_like(unclipped)
    if old_values is None:
        raise ContractError("value_clip is set but old_values is None")
    v_clip = old_values + torch.clamp(values - old_values, -value_clip, value_clip)  # (N,)
    clipped = (v_clip - returns) ** 2  # (N,)
    return 0.5 * torch.maximum(unclipped, clipped), (clipped > unclipped).float()


# ---------------------------------------------------------------------------- trainer


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
        self.rank, self.world_size = fc.require_process_group("CriticTrainer")
        self.device = fc.pick_device(config.device, self.rank)
        self.global_step = 0
        fc.seed_everything(config.seed)

        backbone = fc.load_hf_model(config, causal_lm=False)
        self._vocab_size = int(backbone.get_input_embeddings().num_embeddings)
        if config.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = TurnValueModel(backbone, head_init_std=float(config.head_init_std))
        model.train()  # dropout is 0; train mode keeps gradient checkpointing active
        fc.shard_fsdp2(model, device=self.device, world_size=self.world_size, dtype=config.dtype)
        self.model = model
        self._optimizer, self._scheduler = fc.build_optimizer(model.parameters(), config)

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
                self._dummy_forward(with_grad=False)
                continue
            v = self._values_of_rows(batch, rows, with_grad=False)  # (n,)
            idx = _turn_index(tsl, rows).to(self.device)
            out[idx] = v
        # Turns are disjoint across ranks and 0 elsewhere, so the sum is exact.
        fc.all_reduce(out, dist.ReduceOp.SUM, self.world_size)
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
            ``train/num_turns`` (value positions: turns, or sampled tokens for ``gae``), ``train/skipped_step``, ``train/global_step``,
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
        totals = {k: 0.0 for k in names}
        # first-epoch sums for explained variance: [sum R, sum R^2, sum (R-V), sum (R-V)^2]
        ev = torch.zeros(4, dtype=torch.float64, device=dev)
        grad_norm_total, skipped, lr_used = 0.0, 0, 0.0
        for epoch in range(cfg.epochs):
            self._optimizer.zero_grad(set_to_none=True)
            acc = torch.zeros(len(names), dtype=torch.float64, device=dev)  # sums over turns
            for g, rows in enumerate(groups):
                if not rows:
                    self._dummy_forward(with_grad=True)
                    continue
                idx = _turn_index(tsl, rows)
                ret = batch.returns[idx].to(dev)  # (n,)
                v = self._values_of_rows(batch, rows, with_grad=True)  # (n,)
                if epoch == 0:
                    old_first[g] = v.detach()
                    err = (ret - v.detach()).double()
                    ev += torch.stack([ret.double().sum(), (ret.double() ** 2).sum(), err.sum(), (err**2).sum()])
                if cfg.value_clip is not None:
                    old = batch.old_values[idx].to(dev) if batch.old_values is not None else old_first[g]
                else:
                    old = None
                per_turn, clipped = value_loss_terms(v, ret, old, cfg.value_clip)  # (n,), (n,)
                loss = per_turn.sum() / n_turns
                loss.backward()
                acc += torch.stack([loss.detach().double(), clipped.double().sum(), v.detach().double().sum()])
            fc.all_reduce(acc, dist.ReduceOp.SUM, self.world_size)
            totals["losses/value_loss"] += float(acc[0])
            totals["losses/value_clipfrac"] += float(acc[1]) / n_turns
            totals["critic/values_mean"] += float(acc[2]) / n_turns
            grad_norm = fc.clip_grad_norm(self.model, cfg.max_grad_norm)
            grad_norm_total += grad_norm
            lr_used = float(self._scheduler.get_last_lr()[0])
            if math.isfinite(grad_norm):
                self._optimizer.step()
            else:
                skipped += 1
                self._optimizer.zero_grad(set_to_none=True)
            self._scheduler.step()
            if epoch == 0:
                fc.all_reduce(ev, dist.ReduceOp.SUM, self.world_size)

        self.global_step += 1
        s_r, s_r2, s_e, s_e2 = (float(x) for x in ev.tolist())
        var_r = s_r2 / n_turns - (s_r / n_turns) ** 2
        var_e = s_e2 / n_turns - (s_e / n_turns) ** 2
        n_ep = float(cfg.epochs)
        out = {k: v / n_ep for k, v in totals.items()}
        out.update(
            {
                "critic/returns_mean": s_r / n_turns,
                "critic/explained_variance": 1.0 - var_e / var_r if var_r > 1e-12 else 0.0,
                "train/grad_norm": grad_norm_total / n_ep,
                "train/lr": lr_used,
                "train/num_value_positions": n_turns,
                "train/skipped_step": float(skipped),
                "train/global_step": float(self.global_step),
                "perf/step_s": time.perf_counter() - t0,
            }
        )
        return out

    # ------------------------------------------------------------------ state

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write model, optimizer, scheduler, RNG states and the step counter to ``path``
        (layout of ``agentrl.trainer._fsdp_common.save_checkpoint``; use a folder of its
        own, e.g. ``<run checkpoint>/critic``). Collective.

        Raises:
            CheckpointError: ``path`` already holds a checkpoint.
        """
        fc.save_checkpoint(
            path,
            model=self.model,
            optimizer=self._optimizer,
            scheduler=self._scheduler,
            global_step=self.global_step,
            config=self.config,
            rank=self.rank,
            world_size=self.world_size,
        )

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what ``save_checkpoint`` wrote (re-sharding to this world size).
        Collective.

        Raises:
            CheckpointError: not a complete checkpoint, or tensors that do not match.
        """
        self.global_step = fc.load_checkpoint(
            path,
            model=self.model,
            optimizer=self._optimizer,
            scheduler=self._scheduler,
            rank=self.rank,
            world_size=self.world_size,
        )

    # ------------------------------------------------------------------ internals

    def _check_batch(self, batch: ValueBatch, *, for_training: bool) -> None:
        if not isinstance(batch, ValueBatch):
            raise ContractError(f"expected a ValueBatch, got {type(batch).__name__}")
        ids = batch.input_ids
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self._vocab_size):
            bad = int(ids.max()) if int(ids.max()) >= self._vocab_size else int(ids.min())
            raise ContractError(f"token id {bad} outside the model's vocabulary [0, {self._vocab_size})")
        if for_training:
            fp = [
                float(batch.num_tokens),
                float(batch.num_rows),
                float(batch.num_positions),
                float((batch.input_ids % 9973).sum()),
                float(batch.returns.double().sum()) if batch.returns is not None else 0.0,
            ]
            if not fc.same_on_all_ranks(fp, self.device, self.world_size):
                raise ContractError(
                    "ranks hold different critic batches (token, row or turn count, id or "
                    "return checksum differ); every rank must get the same full ValueBatch"
                )

    def _groups(self, batch: ValueBatch) -> list[list[int]]:
        mine = fc.rank_rows(batch.num_rows, self.rank, self.world_size)
        groups = fc.micro_batches(
            mine, batch.seq_lens.tolist(), self.config.micro_batch_size, self.config.micro_batch_tokens
        )
        return fc.align_micro_batches(groups, self.device, self.world_size)

    def _values_of_rows(self, batch: ValueBatch, rows: Sequence[int], *, with_grad: bool) -> torch.Tensor:
        """Forward ``rows`` right-padded; return their turns' values ``[n]`` in order."""
        dev = self.device
        ids, pos, attn = fc.right_pad_rows(batch.input_ids, batch.position_ids, batch.row_slices(), rows)  # (B, L)
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

    def _dummy_forward(self, *, with_grad: bool) -> None:
        """A one-token pass with zero loss weight, so a rank without rows still joins the
        FSDP all-gathers (forward) and reduce-scatters (backward)."""
        one = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(with_grad):
            v = self.model(one, torch.ones_like(one), one, one)  # (1, 1)
            if with_grad:
                (v.sum() * 0.0).backward()


def _turn_index(turn_slices: Sequence[slice], rows: Sequence[int]) -> torch.Tensor:
    """Positions in the packed turn tensors of ``rows``' turns, in order: ``[n]`` int64."""
    parts = [torch.arange(turn_slices[r].start, turn_slices[r].stop) for r in rows]
    return torch.cat(parts) if parts else torch.zeros(0, dtype=torch.long)
