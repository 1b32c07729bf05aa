"""``TrainerCore``: the one step skeleton of ``PolicyTrainer`` and ``CriticTrainer``, used
by composition (each trainer holds one and keeps only its scoring and its loss).

What it owns, in the order a trainer meets it:

1. construction: process group, device, seeding, loading the HF model (dropout off),
   gradient checkpointing, an optional wrapper (the critic's value head), FSDP2 sharding,
   AdamW with linear warmup;
2. batch checks every trainer makes: token ids inside the vocabulary, and the same batch
   on every rank (a fingerprint compared by all-reduce);
3. the rank split and micro-batching of packed rows (in order by row count when padded,
   bin-packed by a token budget when packed), aligned across ranks, with dummy one-token
   passes (zero weight) on ranks with fewer micro-batches;
4. ``optimize``: per epoch zero-grad → the trainer's micro-batch callback (forward, loss,
   backward) or a dummy pass → metric all-reduce → global gradient-norm clipping → AdamW
   step, or a skipped step on a non-finite norm → scheduler step; then ``global_step + 1``;
5. checkpoint save / load with scheduler and per-rank RNG state.

Collective methods say so; the contract is the trainers' (see ``trainer.py``): every rank
calls them in the same order with the same arguments.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ContractError
from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer import micro_batches as mb
from agentrl.trainer.config import OptimConfig
from agentrl.trainer.scoring import install_scorer

MicroStep = Callable[[int, int, list[int]], torch.Tensor]
"""``(epoch, group_index, rows) -> sums``: score ``rows`` (one micro-batch of this rank),
call ``backward()`` on this micro-batch's share of the global loss, and return a
``[M]`` float64 tensor of metric sums to be added up over micro-batches and ranks."""


@dataclass
class EpochStats:
    """What ``TrainerCore.optimize`` measured, identical on every rank.

    Attributes:
        sums: per epoch, the ``[M]`` metric sums over all micro-batches of all ranks
            (``MicroStep`` return values, all-reduced), as Python floats.
        grad_norms: per epoch, the global gradient L2 norm before clipping.
        skipped: optimizer steps skipped for a non-finite gradient norm.
        lr: learning rate of the last optimizer step (before its scheduler step).
        no_signal: optimizer steps not taken because the global gradient was exactly
            zero (every loss token's advantage 0 and no other loss term): AdamW would
            otherwise keep moving the weights by its first moment (and weight decay) on
            a batch that carries no signal.
    """

    sums: list[list[float]]
    grad_norms: list[float]
    skipped: int
    lr: float
    no_signal: int = 0


class TrainerCore:
    """Model, optimizer, scheduler and the shared step skeleton of one trainer rank.

    Attributes:
        config: the trainer's (already validated) config.
        rank, world_size: this process's place in the default process group.
        device: where the model computes.
        model: the FSDP2-wrapped model (``wrap(backbone)``, or the backbone).
        vocab_size: rows of the backbone's input embedding.
        global_step: completed ``optimize`` calls (restored by ``load_checkpoint``).
        optimizer, scheduler: AdamW and its warmup ``LambdaLR``.

    Args:
        owner: the trainer's class name, for error messages.
        config: the validated config (``TrainerConfig`` or ``CriticConfig``).
        causal_lm: load ``AutoModelForCausalLM`` (policy) or ``AutoModel`` (critic backbone).
        dummy_output: ``(model, ids [1, 1] int64) -> tensor``, the forward of a dummy pass.
        wrap: builds the trained module from the backbone after gradient checkpointing
            is set (e.g. ``TurnValueModel``); ``None`` trains the backbone itself.

    Raises:
        ConfigError: no process group, CUDA requested but absent, or a model folder that
            cannot be loaded.
    """

    def __init__(
        self,
        owner: str,
        config: OptimConfig,
        *,
        causal_lm: bool,
        dummy_output: Callable[[torch.nn.Module, torch.Tensor], torch.Tensor],
        wrap: Callable[[torch.nn.Module], torch.nn.Module] | None = None,
    ) -> None:
        self.config = config
        self.rank, self.world_size = fc.require_process_group(owner)
        self.device = fc.pick_device(config.device, self.rank)
        self.global_step = 0
        fc.seed_everything(config.seed)

        backbone = fc.load_hf_model(config, causal_lm=causal_lm)
        self.vocab_size = int(backbone.get_input_embeddings().num_embeddings)
        if config.gradient_checkpointing:
            backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model = wrap(backbone) if wrap is not None else backbone
        model.train()  # dropout is already 0; train mode keeps gradient checkpointing active
        fc.shard_fsdp2(model, device=self.device, world_size=self.world_size, dtype=config.dtype)
        if causal_lm:
            # backbone -> hidden states where a loss reads -> chunked LM head, as an FSDP
            # forward method (agentrl.trainer.scoring)
            install_scorer(model)
        self.model = model
        self.optimizer, self.scheduler = fc.build_optimizer(model.parameters(), config)
        self._dummy_output = dummy_output

    # ------------------------------------------------------------------ batch checks

    def check_vocab(self, input_ids: torch.Tensor) -> None:
        """Raise ``ContractError`` naming the first token id outside ``[0, vocab_size)``."""
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            bad = int(input_ids.max()) if int(input_ids.max()) >= self.vocab_size else int(input_ids.min())
            raise ContractError(f"token id {bad} outside the model's vocabulary [0, {self.vocab_size})")

    def check_same_on_all_ranks(self, fingerprint: Sequence[float], message: str) -> None:
        """Raise ``ContractError(message)`` unless every rank passed the same
        ``fingerprint`` (e.g. token count, row count, id checksum). Collective."""
        if not fc.same_on_all_ranks(fingerprint, self.device, self.world_size):
            raise ContractError(message)

    # ------------------------------------------------------------------ rows

    def my_rows(self, num_rows: int) -> list[int]:
        """This rank's rows: ``rank, rank + W, rank + 2W, ...``."""
        return mb.rank_rows(num_rows, self.rank, self.world_size)

    def micro_batches(self, rows: Sequence[int], row_lens: Sequence[int], layout: str = "padded") -> list[list[int]]:
        """This rank's micro-batches (``row_lens[r]``: row ``r``'s tokens). ``layout``
        ``"padded"``: rows in order, at most ``micro_batch_size`` rows and (if set) at most
        ``micro_batch_tokens`` padded tokens per group; ``"packed"``: rows bin-packed into
        at most ``micro_batch_tokens`` tokens per group (``micro_batches.layout_micro_batches``)."""
        return mb.layout_micro_batches(
            rows,
            row_lens,
            layout=layout,
            micro_batch_size=self.config.micro_batch_size,
            micro_batch_tokens=self.config.micro_batch_tokens,
        )

    def aligned_micro_batches(
        self, rows: Sequence[int], row_lens: Sequence[int], layout: str = "padded"
    ) -> list[list[int]]:
        """``micro_batches(rows, row_lens, layout)`` padded with empty groups (dummy passes)
        to the largest count of any rank, so every rank runs the same number of FSDP
        passes. Collective."""
        return mb.align_micro_batches(self.micro_batches(rows, row_lens, layout), self.device, self.world_size)

    def all_rank_micro_batches(self, num_rows: int, row_lens: Sequence[int], layout: str) -> list[list[list[int]]]:
        """Every rank's (unaligned) micro-batches, computed locally: the rank split and
        the grouping are deterministic functions of the batch, which every rank holds."""
        return [
            self.micro_batches(mb.rank_rows(num_rows, r, self.world_size), row_lens, layout)
            for r in range(self.world_size)
        ]

    def dummy_forward(self, *, with_grad: bool) -> None:
        """A one-token pass with zero loss weight, so a rank without rows still joins the
        FSDP all-gathers (forward) and reduce-scatters (backward)."""
        ids = torch.zeros(1, 1, dtype=torch.long, device=self.device)
        with torch.set_grad_enabled(with_grad):
            out = self._dummy_output(self.model, ids)
            if with_grad:
                (out.float().sum() * 0.0).backward()

    def all_reduce(self, t: torch.Tensor, op: Any) -> None:
        """In-place all-reduce of ``t`` when there is more than one rank. Collective."""
        fc.all_reduce(t, op, self.world_size)

    # ------------------------------------------------------------------ the step

    def optimize(self, groups: Sequence[list[int]], epochs: int, micro_step: MicroStep, num_metrics: int) -> EpochStats:
        """``epochs`` optimizer steps over this rank's aligned micro-batches ``groups``,
        then ``global_step += 1``. Collective.

        Per epoch: zero-grad; for each group ``micro_step(epoch, g, rows)`` (which calls
        ``backward`` itself) or, for an empty group, a dummy pass; all-reduce (SUM) of the
        returned ``[num_metrics]`` float64 sums; clip the global gradient norm to
        ``config.max_grad_norm``; AdamW step, or on a non-finite norm drop the gradients
        and count a skipped step, or on a norm of exactly 0 take no step at all (the
        optimizer state untouched, counted in ``no_signal``; a zero-gradient AdamW step
        would still move every weight by its momentum); scheduler step.
        """
        sums: list[list[float]] = []
        norms: list[float] = []
        skipped, no_signal, lr_used = 0, 0, 0.0
        for epoch in range(epochs):
            self.optimizer.zero_grad(set_to_none=True)
            acc = torch.zeros(num_metrics, dtype=torch.float64, device=self.device)  # (M,)
            for g, rows in enumerate(groups):
                if not rows:
                    self.dummy_forward(with_grad=True)
                    continue
                acc += micro_step(epoch, g, rows)
            self.all_reduce(acc, dist.ReduceOp.SUM)
            sums.append(acc.tolist())

            grad_norm = fc.clip_grad_norm(self.model, self.config.max_grad_norm)
            norms.append(grad_norm)
            lr_used = float(self.scheduler.get_last_lr()[0])
            if not math.isfinite(grad_norm):
                skipped += 1
                self.optimizer.zero_grad(set_to_none=True)
            elif grad_norm == 0.0:  # global (all-reduced) norm: every rank agrees
                no_signal += 1
                self.optimizer.zero_grad(set_to_none=True)
            else:
                self.optimizer.step()
            self.scheduler.step()
        self.global_step += 1
        return EpochStats(sums=sums, grad_norms=norms, skipped=skipped, lr=lr_used, no_signal=no_signal)

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Model, optimizer, scheduler, RNG states, ``global_step`` and config to ``path``
        (layout: ``agentrl.trainer._fsdp_common.save_checkpoint``). Collective.

        Raises:
            CheckpointError: ``path`` already holds a checkpoint.
        """
        fc.save_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            global_step=self.global_step,
            config=self.config,
            rank=self.rank,
            world_size=self.world_size,
        )

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what ``save_checkpoint`` wrote, re-sharding to this world size; a rank
        without a saved RNG state keeps its own (with a warning). Collective.

        Raises:
            CheckpointError: not a complete checkpoint, or tensors that do not match.
        """
        self.global_step = fc.load_checkpoint(
            path,
            model=self.model,
            optimizer=self.optimizer,
            scheduler=self.scheduler,
            rank=self.rank,
            world_size=self.world_size,
            warn_stacklevel=4,
        )
