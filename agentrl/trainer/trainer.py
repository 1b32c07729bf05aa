"""``PolicyTrainer``: PPO-clip / GRPO policy updates of a Hugging Face causal LM under
FSDP2, one instance per rank.

Reading order: ``StepResult`` (what a step returns) → ``__init__`` (load, shard, optimizer) →
``compute_log_probs`` → ``step`` → ``kl_to_reference``. The state methods (``full_state_dict``,
``save_checkpoint``/``load_checkpoint``, ``save_hf``) are in ``agentrl.trainer.trainer_state``,
the batch checks in ``agentrl.trainer.batch_check``, the reference policy in
``agentrl.trainer.reference``. Loading,
sharding, the optimizer, micro-batching, dummy passes, the epoch loop (all-reduce, clip,
skipped steps, scheduler) and checkpoint/RNG state are shared with ``CriticTrainer``
through one ``agentrl.trainer._core.TrainerCore``; this file keeps the scoring and the
PPO loss.

Distributed contract: the caller initialises the default process group (gloo on CPU,
nccl on CUDA; a group of one for a single process, see
``agentrl.trainer.distributed.init_single_process_group``) before constructing the
trainer, and then calls every public method on every rank with the same arguments (the
same full ``TokenBatch``): they are collective. Rank ``r`` works on rows
``r, r + W, r + 2W, ...`` of the batch. A rank left with no rows (or with fewer
micro-batches than another rank) runs dummy one-token forwards/backwards with zero
weight so that FSDP's all-gathers and reduce-scatters still line up.

Scoring layout (``config.row_layout``, ``agentrl.trainer.packing``): ``"packed"`` (default)
scores a micro-batch's rows as one unpadded sequence ``[1, Tm]`` with attention restricted
to each row (variable-length flash attention on CUDA, one SDPA call per row elsewhere) and
the batch's ``position_ids`` (restarting per row); micro-batches are bin-packed by a token
budget (``micro_batch_tokens``). ``"padded"`` right-pads each micro-batch's rows to its
longest row with an ``attention_mask``. Either way the LM head runs only where a log-prob
is read (the position before each loss token in ``step``; every position in
``compute_log_probs``), in chunks of ``logprob_chunk_tokens``. Both layouts give the same
log-probs (1e-5) and gradients (1e-6) in fp32 (``tests/invariants/test_packing_invariants.py``).

Dropout is switched off at load (every ``*dropout*`` float of the HF config set to 0,
every ``nn.Dropout`` to ``p=0``): the trainer must score tokens with the same
deterministic function the engine sampled from, and ``old_log_probs`` must equal the
first PPO epoch's log-probs exactly.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.batch_check import check_batch
from agentrl.trainer.config import KL_ESTIMATORS, TrainerConfig
from agentrl.trainer.correction import (
    ROLLOUT_CORR_SUMS,
    RolloutCorrection,
    rollout_corr_metrics,
    rollout_correction,
)
from agentrl.trainer.kl import kl_importance_cap
from agentrl.trainer.losses import PPO_TOKEN_SUM_METRICS, ppo_loss
from agentrl.trainer.memory import PeakMemory
from agentrl.trainer.micro_batches import padded_positions
from agentrl.trainer.reference import (
    ScoreRows,
    kl_to_reference,
    load_reference,
    reference_log_probs,
)
from agentrl.trainer.scoring import dummy_score, score_rows
from agentrl.trainer.trainer_state import PolicyStateMixin
from agentrl.types import TokenBatch


@dataclass(frozen=True)
class StepResult:
    """What one ``PolicyTrainer.step`` returns: its metrics and, on rank 0, the trainer's
    value of each token of that step's batch (what the replay store keeps per sampled token).

    Attributes:
        metrics: the step's metrics, ``{name: float}`` (identical on every rank except
            ``perf/*``; the names are listed under ``PolicyTrainer.step``).
        log_probs: ``[T]`` float32 on CPU, aligned with the batch's ``input_ids`` (``T =
            batch.num_tokens``, every rank's rows): the log-prob the trainer gave each
            loss token in epoch 0's forward, i.e. at the weights the update started from
            and with the batch's sampling temperature (the proximal log-prob when the batch
            carries none); 0 where ``loss_mask`` is 0. ``None`` on ranks other than 0.
        entropies: ``[T]`` float32 on CPU, aligned as ``log_probs``: the entropy (nats) of
            the epoch-0 distribution that predicted each loss token; 0 where ``loss_mask``
            is 0. ``None`` on ranks other than 0.
    """

    metrics: dict[str, float]
    log_probs: torch.Tensor | None = None
    entropies: torch.Tensor | None = None


class PolicyTrainer(PolicyStateMixin):
    """Policy-gradient trainer for one rank of an FSDP2 data-parallel group.

    Attributes:
        config: the validated ``TrainerConfig``.
        rank, world_size: this process's place in the default process group.
        device: where the model computes.
        global_step: number of completed ``step()`` calls (restored by
            ``load_checkpoint``).
        model: the FSDP2-wrapped HF model (parameters are sharded ``DTensor``s); exposed
            for inspection, e.g. gradients in tests.
        reference: the frozen reference policy of the KL term (``config.kl.coef > 0``),
            FSDP2-sharded like ``model`` but without gradients or an optimizer; ``None``
            when the KL term is off (then it is never loaded). See
            ``agentrl.trainer.reference.load_reference``.

    Raises (constructor):
        ConfigError: invalid config, no process group, CUDA requested but absent, a
            model folder that cannot be loaded, or a reference whose vocabulary differs
            from the policy's.
    """

    def __init__(self, config: TrainerConfig) -> None:
        config.validate()
        self.config = config
        # seed, load (dropout off), gradient checkpointing, FSDP2, AdamW + warmup
        self._core = TrainerCore("PolicyTrainer", config, causal_lm=True, dummy_output=_lm_dummy_output)
        self.rank, self.world_size = self._core.rank, self._core.world_size
        self.device = self._core.device
        self.model = self._core.model
        # the frozen reference of the KL term (None when kl.coef == 0)
        self.reference = load_reference(config, self.model, device=self.device, world_size=self.world_size)

    @property
    def global_step(self) -> int:
        """Completed ``step()`` calls (restored by ``load_checkpoint``)."""
        return self._core.global_step

    # ------------------------------------------------------------------ scoring

    @torch.no_grad()
    def compute_log_probs(self, batch: TokenBatch) -> torch.Tensor:
        """Per-token log-probs of ``batch.input_ids`` under the current weights.

        Collective: call on every rank with the same batch; every rank gets the full result.

        Args:
            batch: packed rows; ``batch.sampling`` gives the temperature (logits are divided
                by it before the softmax).

        Returns:
            ``[T]`` float32 on CPU: position ``t`` holds ``log p(input_ids[t] |
            input_ids[row_start:t])``; 0 at each row's first token (nothing to condition on).

        Raises:
            ConfigError: ``top_p < 1`` or ``top_k > 0`` (cannot be reproduced), or a
                temperature that contradicts ``config.temperature``.
            ContractError: a token id outside the vocabulary.
        """
        temperature = check_batch(batch, self.config, self._core, for_training=False)
        groups = self._aligned_micro_batches(self._my_rows(batch), batch)
        out = torch.zeros(batch.num_tokens, dtype=torch.float32, device=self.device)  # (T,)
        slices = batch.row_slices()
        for rows in groups:
            if not rows:
                self._core.dummy_forward(with_grad=False)
                continue
            lp, _ = self._score_rows(batch, rows, temperature, with_grad=False, with_entropy=False, positions="all")
            idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(self.device)
            out[idx] = lp
        if self.world_size > 1:
            # Rows are disjoint across ranks and 0 elsewhere, so the sum is exact.
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    # ------------------------------------------------------------------ training

    def step(self, batch: TokenBatch) -> StepResult:
        """One training step on ``batch``: ``config.ppo_epochs`` optimizer steps of the
        decoupled PPO loss (``losses.ppo_loss``).

        Three log-probs, kept apart (docs/design.md): ``behavior_log_probs`` (the engine's, in
        the batch), ``proximal_log_probs`` (the weights this update starts from: the
        batch's when given, else taken, detached, from epoch 0's own forward, which is
        what the synchronous loop needs) and the current ones. The ratio current /
        proximal is clipped (clip-higher, and dual clip for negative advantages with
        ``config.dual_clip_c``); ``config.rollout_correction`` weights / masks each term
        by proximal / behavior (off by default: with on-policy data and correction off
        this is exactly the PPO-clip loss). With ``config.kl.coef > 0`` and
        ``kl.mode == "loss"`` the reference model's log-probs (no grad, scored once per
        step before the epochs) give ``coef * agg(k)`` in the loss.

        1. Global loss-token / sequence counts are all-reduced across ranks.
        2. Epoch 0: proximal log-probs, rollout correction and the engine↔trainer gap per
           micro-batch, reused by later epochs.
        3. Per epoch: forward/backward over this rank's micro-batches (gradient
           accumulation, loss normalised by the global counts), gradient clipping,
           AdamW step, scheduler step.

        Collective: call on every rank with the same batch.

        Returns:
            A ``StepResult``: the metrics below on every rank, and on rank 0 the per-token
            log-probs and entropies of epoch 0 for the whole batch (the ranks' rows are
            reduced to rank 0 only; other ranks hold ``None``). Metrics (floats; identical
            on every rank except ``perf/*``): means over
            epochs of ``actor/pg_loss`` and ``actor/kl_loss`` (as aggregated),
            ``actor/ppo_kl``, ``actor/pg_clipfrac``, ``actor/pg_clipfrac_dual``,
            ``actor/entropy``, ``actor/ratio_mean`` (token means over the batch's loss
            tokens) and, with the KL term in the loss, ``kl/ref_k1``, ``kl/ref_k2``,
            ``kl/ref_k3`` (KL(current ‖ reference)); ``kl/coef``; the ``rollout_corr/*``
            of epoch 0 (``losses.rollout_corr_metrics``: gap mean / max / p99 over all
            ranks' loss tokens, all-gathered exactly; importance-weight mean, clipped
            share, ESS, masked shares); ``actor/grad_norm`` (pre-clip, mean over epochs),
            ``actor/lr`` (of the last optimizer step), ``actor/num_loss_tokens``,
            ``actor/num_loss_seqs``, ``actor/skipped_step`` (optimizer steps skipped for a
            non-finite gradient norm), ``actor/no_signal_steps`` (optimizer steps not taken
            because the gradient was exactly zero, e.g. every advantage 0: AdamW's momentum
            would otherwise still move the weights), ``actor/global_step``; ``perf/tokens_per_s`` (batch
            tokens / step time), ``perf/step_s``, ``perf/padding_frac``,
            ``perf/peak_memory_mb``. docs/metrics.md's table defines each.

        Raises:
            ConfigError, ContractError: as ``compute_log_probs``; also a loss token at a
                row's first position, or ranks holding different batches.
        """
        t0 = time.perf_counter()
        peak = PeakMemory(self.device)  # perf/peak_memory_mb
        peak.start()
        cfg = self.config
        temperature = check_batch(batch, self.config, self._core, for_training=True)
        my_rows = self._my_rows(batch)
        groups = self._aligned_micro_batches(my_rows, batch)
        dev = self.device

        # 1. global loss-token / sequence counts: the normalisers of the loss.
        my_slices = _row_slices(batch, my_rows)
        row_tokens = [float(batch.loss_mask[s].sum()) for s in my_slices]
        counts = torch.tensor([sum(row_tokens), float(sum(n > 0 for n in row_tokens))], dtype=torch.float64, device=dev)
        self._core.all_reduce(counts, dist.ReduceOp.SUM)
        global_tokens, global_seqs = (float(x) for x in counts.tolist())
        if global_tokens == 0:
            raise ContractError("batch has no loss tokens (sum(loss_mask) == 0); nothing to train on")

        # 2. proximal log-probs (the weights this update starts from): the batch's when it
        # carries them (off-policy data), else taken (detached) from epoch 0's own forward
        # passes: the weights do not change until the optimizer step at the end of an
        # epoch, so this equals a separate no-grad pass and saves a full forward. The
        # rollout correction (weights proximal / behavior, masks) and the engine↔trainer
        # gap are computed once, in epoch 0, and reused by later epochs.
        given_prox = batch.proximal_log_probs is not None
        correct = cfg.rollout_correction.enabled
        prox_lps: list[torch.Tensor | None] = [None] * len(groups)
        corrections: list[RolloutCorrection | None] = [None] * len(groups)
        corr_sums = torch.zeros(len(ROLLOUT_CORR_SUMS), dtype=torch.float64, device=dev)  # (K,)
        gaps: list[torch.Tensor] = []
        token_parts: list[tuple[list[int], torch.Tensor, torch.Tensor]] = []  # epoch 0: (rows, lp, ent)

        # 3. reference log-probs of the KL term (kl.mode "loss"), no grad, once per step
        # before the epochs (reused by every epoch): a separate aligned pass over this
        # rank's micro-batches, with dummy passes where a rank has none, so the
        # reference's FSDP all-gathers line up across ranks and never interleave with
        # the policy's.
        kl_in_loss = self.reference is not None and cfg.kl.mode == "loss"
        ref_lps = self._reference_log_probs(batch, groups, temperature) if kl_in_loss else [None] * len(groups)

        # 4. PPO epochs: TrainerCore runs the loop (zero-grad, micro-batches or dummy
        # passes, all-reduce of these sums, clip, AdamW or a skipped step, scheduler).
        share_names = ("actor/pg_loss", "actor/kl_loss")  # summed over micro-batches and ranks
        token_names = PPO_TOKEN_SUM_METRICS + (tuple(f"kl/ref_{k}" for k in KL_ESTIMATORS) if kl_in_loss else ())
        metric_names = share_names + token_names  # token sums: divided by the global loss-token count

        def micro_step(epoch: int, g: int, rows: list[int]) -> torch.Tensor:
            """Score, loss and backward of one micro-batch; returns its metric sums in
            ``metric_names`` order, float64."""
            sub = batch.select_rows(rows)
            lp, ent = self._score_rows(batch, rows, temperature, with_grad=True, with_entropy=True)  # (Tm,) each
            mask = sub.loss_mask.to(dev)  # (Tm,)
            seq_ids = torch.repeat_interleave(torch.arange(len(rows)), sub.seq_lens).to(dev)  # (Tm,)
            if epoch == 0:
                prox_lps[g] = sub.proximal_log_probs.to(dev) if given_prox else lp.detach()  # (Tm,)
                corr = rollout_correction(
                    prox_lps[g], sub.behavior_log_probs.to(dev), mask, seq_ids, cfg.rollout_correction
                )
                corrections[g] = corr if correct else None
                corr_sums.add_(corr.sums)
                gaps.append(corr.gaps)
                token_parts.append((rows, lp.detach(), ent.detach()))  # the StepResult's per-token values
            loss, m = ppo_loss(
                lp,
                prox_lps[g],
                sub.advantages.to(dev),
                mask,
                seq_ids=seq_ids,
                correction=corrections[g],
                clip_ratio_low=cfg.clip_ratio_low,
                clip_ratio_high=cfg.clip_ratio_high,
                dual_clip_c=cfg.dual_clip_c,
                loss_agg_mode=cfg.loss_agg_mode,
                global_num_tokens=global_tokens,
                global_num_seqs=max(global_seqs, 1.0),
                entropy=ent,
                ref_log_probs=ref_lps[g],
                kl_coef=cfg.kl.coef if kl_in_loss else 0.0,
                kl_estimator=cfg.kl.estimator,
                kl_importance_cap=kl_importance_cap(cfg.rollout_correction),
            )
            loss.backward()
            return torch.stack([m[k].double() for k in metric_names])  # (M,)

        stats = self._core.optimize(groups, cfg.ppo_epochs, micro_step, len(metric_names))
        token_values = self._reduce_token_values(batch, token_parts)  # (2, T) on rank 0, else None
        self._core.all_reduce(corr_sums, dist.ReduceOp.SUM)
        # Every rank's |proximal - behavior| gaps in rank order, on every rank: exact (counts
        # all-gathered, then gaps padded to the largest count), so rollout_corr/gap_abs_p99 and
        # the max equal the one-rank values; 4 bytes per loss token per rank, once per step.
        my_gaps = torch.cat(gaps) if gaps else torch.zeros(0, device=dev)  # (N_mine,)
        all_gaps = fc.all_gather_concat(my_gaps, dev, self.world_size)  # (N_loss,)
        totals = {k: 0.0 for k in metric_names}
        for vals in stats.sums:
            for k, v in zip(metric_names, vals):
                totals[k] += v if k in share_names else v / global_tokens

        step_s = time.perf_counter() - t0
        n_ep = float(cfg.ppo_epochs)
        out = {k: v / n_ep for k, v in totals.items()}
        out.update(rollout_corr_metrics(corr_sums, all_gaps))
        out.update(
            {
                "kl/coef": float(cfg.kl.coef),
                "actor/grad_norm": sum(stats.grad_norms) / n_ep,
                "actor/lr": stats.lr,
                "actor/num_loss_tokens": global_tokens,
                "actor/num_loss_seqs": global_seqs,
                "actor/skipped_step": float(stats.skipped),
                "actor/no_signal_steps": float(stats.no_signal),
                "actor/global_step": float(self.global_step),
                "perf/tokens_per_s": batch.num_tokens / step_s if step_s > 0 else 0.0,
                "perf/step_s": step_s,
                **self._perf_metrics(batch, peak),  # perf/padding_frac, perf/peak_memory_mb
            }
        )
        if token_values is None:
            return StepResult(out)
        return StepResult(out, token_values[0], token_values[1])

    def _reduce_token_values(
        self, batch: TokenBatch, parts: list[tuple[list[int], torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor | None:
        """Epoch 0's per-micro-batch log-probs and entropies placed at their rows' token
        ranges of the full batch and summed over ranks onto rank 0 (the rows are disjoint,
        and ``x + 0`` is exact). Collective. Cost: one reduce of ``2 * T`` float32 to rank 0
        when ``W > 1``.

        Returns:
            ``[2, T]`` float32 on CPU on rank 0 (row 0 log-probs, row 1 entropies), ``None``
            on the other ranks.
        """
        out = torch.zeros(2, batch.num_tokens, dtype=torch.float32, device=self.device)  # (2, T)
        slices = batch.row_slices()
        for rows, lp, ent in parts:
            idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(self.device)  # (Tm,)
            out[0, idx] = lp.float()
            out[1, idx] = ent.float()
        if self.world_size > 1:
            dist.reduce(out, dst=0, op=dist.ReduceOp.SUM)
        return out.cpu() if self.rank == 0 else None

    # ------------------------------------------------------------------ reference policy

    @torch.no_grad()
    def kl_to_reference(self, batch: TokenBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token KL estimate of the sampling policy (the engine's
        ``batch.behavior_log_probs``) to the reference, for the KL penalty in the reward
        (``kl.mode: "reward"``): ``agentrl.trainer.reference.kl_to_reference`` with the
        reference scored as the policy is (``_score_rows``, the batch's temperature) and
        ``config.kl.estimator`` (k1 for the reward: its policy gradient is exactly the
        gradient of the KL; ``agentrl.trainer.kl``).

        Collective: call on every rank with the same batch; every rank gets the result.

        Returns:
            ``(k, metrics)``: ``k`` ``[T]`` float32 on CPU (nats), the estimate on loss
            tokens, 0 elsewhere; ``metrics``: ``kl/ref_k1``, ``kl/ref_k2``, ``kl/ref_k3``
            (means over the batch's loss tokens of each estimator of KL(sampling ‖
            reference)) and ``kl/coef``.

        Raises:
            ConfigError: no reference model (``kl.coef == 0``); as ``compute_log_probs``.
            ContractError: as ``compute_log_probs``; a batch without loss tokens.
        """
        if self.reference is None:
            raise ConfigError(
                f"kl_to_reference needs a reference model, but kl.coef={self.config.kl.coef}; "
                "set kl.coef > 0 (and kl.mode='reward') to load one"
            )
        temperature = check_batch(batch, self.config, self._core, for_training=False)
        if batch.num_loss_tokens == 0:
            raise ContractError("batch has no loss tokens (sum(loss_mask) == 0); nothing to compare to the reference")
        groups = self._aligned_micro_batches(self._my_rows(batch), batch)
        return kl_to_reference(self.reference, batch, groups, self._reference_scorer(batch, temperature),
                               self.config.kl, device=self.device, world_size=self.world_size)

    def _reference_log_probs(
        self, batch: TokenBatch, groups: Sequence[list[int]], temperature: float
    ) -> list[torch.Tensor | None]:
        """``reference.reference_log_probs`` of this rank's aligned micro-batches ``groups``,
        scored as the policy is (``_score_rows``). Collective."""
        assert self.reference is not None
        return reference_log_probs(self.reference, groups, self._reference_scorer(batch, temperature), self.device)

    def _reference_scorer(self, batch: TokenBatch, temperature: float) -> ScoreRows:
        """``(rows, model) -> [Tm]`` log-probs of ``batch``'s ``rows`` under ``model``
        without gradients, scored as the policy is (``reference.ScoreRows``)."""

        def score(rows: list[int], model: torch.nn.Module) -> torch.Tensor:
            lp, _ = self._score_rows(batch, rows, temperature, with_grad=False, with_entropy=False, model=model)
            return lp  # (Tm,)

        return score

    # ------------------------------------------------------------------ internals

    def _my_rows(self, batch: TokenBatch) -> list[int]:
        return self._core.my_rows(batch.num_rows)

    @property
    def _row_layout(self) -> str:
        return getattr(self.config, "row_layout", "packed")

    def _micro_batches(self, rows: Sequence[int], batch: TokenBatch) -> list[list[int]]:
        """This rank's micro-batches: ``row_layout="packed"``: rows bin-packed into at
        most ``micro_batch_tokens`` tokens each; ``"padded"``: rows in order, at most
        ``micro_batch_size`` rows (and ``micro_batch_tokens`` padded tokens) each."""
        return self._core.micro_batches(rows, batch.seq_lens.tolist(), self._row_layout)

    def _aligned_micro_batches(self, rows: Sequence[int], batch: TokenBatch) -> list[list[int]]:
        """This rank's micro-batches, padded with empty groups (dummy passes) to the
        largest count of any rank, so every rank runs the same number of FSDP passes."""
        return self._core.aligned_micro_batches(rows, batch.seq_lens.tolist(), self._row_layout)

    def _score_rows(
        self,
        batch: TokenBatch,
        rows: Sequence[int],
        temperature: float,
        *,
        with_grad: bool,
        with_entropy: bool,
        positions: str = "loss",
        model: torch.nn.Module | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Score ``rows`` (one micro-batch) in ``config.row_layout``; the LM head runs
        only at the positions before the scored tokens (``agentrl.trainer.scoring``).

        Args:
            batch, rows: the full batch and this micro-batch's row indices.
            temperature: logits are divided by it.
            with_grad: build the autograd graph.
            with_entropy: also return entropies.
            positions: ``"loss"``: only tokens with ``loss_mask == 1`` are scored;
                ``"all"``: every token except each row's first.
            model: the model to score with (default ``self.model``; e.g. a reference
                policy sharded the same way).

        Returns:
            ``(log_probs [Tm], entropies [Tm] or None)`` float32 on ``self.device``, in row
            order (matching ``batch.select_rows(rows)``): the log-prob of each scored token
            and the entropy of the distribution that predicted it; 0 at tokens not scored
            (row starts, and with ``"loss"`` every token with ``loss_mask == 0``).
        """
        return score_rows(
            self.model if model is None else model,
            batch,
            rows,
            temperature,
            layout=self._row_layout,
            device=self.device,
            chunk_tokens=self.config.logprob_chunk_tokens,
            with_grad=with_grad,
            with_entropy=with_entropy,
            positions=positions,
        )

    def _perf_metrics(self, batch: TokenBatch, peak: PeakMemory) -> dict[str, float]:
        """``perf/padding_frac`` (share of the positions the model ran on, over all ranks'
        micro-batches, that are padding; 0 when packed) and ``perf/peak_memory_mb`` (of
        ``peak``, started at the beginning of the step). Local: every rank holds the batch
        and micro-batching is deterministic, so no collective is needed."""
        lens = batch.seq_lens.tolist()
        pad = scored = 0
        for groups in self._core.all_rank_micro_batches(batch.num_rows, lens, self._row_layout):
            p, n = padded_positions(groups, lens, self._row_layout)
            pad, scored = pad + p, scored + n
        return {"perf/padding_frac": pad / scored if scored else 0.0, "perf/peak_memory_mb": peak.peak_mb()}


def _lm_dummy_output(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward of a dummy pass (``TrainerCore.dummy_forward``): one token through the
    backbone and the LM head, as a real micro-batch; ``[1]`` log-prob."""
    return dummy_score(model, ids)  # (1,)


def _row_slices(batch: TokenBatch, rows: Sequence[int]) -> list[slice]:
    slices = batch.row_slices()
    return [slices[r] for r in rows]
