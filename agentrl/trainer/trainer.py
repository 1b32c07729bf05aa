"""``PolicyTrainer``: PPO-clip / GRPO policy updates of a Hugging Face causal LM under
FSDP2, one instance per rank.

Reading order: ``__init__`` (load, shard, optimizer) → ``compute_log_probs`` → ``step`` →
state (``full_state_dict``, ``save_checkpoint``/``load_checkpoint``, ``save_hf``). Loading,
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

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from agentrl.errors import ConfigError, ContractError
from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer import packing
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.config import KL_ESTIMATORS, TrainerConfig
from agentrl.trainer.kl import kl_importance_cap
from agentrl.trainer.losses import (
    PPO_TOKEN_SUM_METRICS,
    ROLLOUT_CORR_SUMS,
    RolloutCorrection,
    kl_penalty,
    ppo_loss,
    rollout_corr_metrics,
    rollout_correction,
)
from agentrl.types import TokenBatch

# What save_hf copies from the model folder besides what save_pretrained writes: the
# tokenizer (fast and slow forms) and the chat template (file forms of transformers >= 4.43).
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
    "chat_template.json",
)


class PolicyTrainer:
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
            when the KL term is off (then it is never loaded). See ``_load_reference``.

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
        self.reference = self._load_reference()
        self._token_values: torch.Tensor | None = None  # (2, T) of the last step: log-probs, entropies

    def _load_reference(self) -> torch.nn.Module | None:
        """The frozen reference policy of the KL term, or ``None`` when ``kl.coef == 0``.

        Weights: ``config.kl.reference_path``, or by default the initial policy
        (``config.model_path``), loaded as the policy is (``load_hf_model``: fp32, dropout
        off, the same attention kernel), ``requires_grad_(False)``, ``eval()``, and sharded
        with FSDP2 like the policy (same mesh shape and compute dtype) but with no
        optimizer. It is not part of the checkpoint: it never changes, so a resumed run
        loads it again from the same folder (which must therefore still hold the same
        weights). Memory: one more copy of the weights (sharded over the ranks), and no
        gradients or optimizer state.

        Raises:
            ConfigError: the folder cannot be loaded, or its vocabulary (input-embedding
                rows, or output-embedding rows) differs from the policy's.
        """
        cfg = self.config
        if not cfg.kl.coef > 0:
            return None
        path = cfg.kl.reference_path or cfg.model_path
        ref = fc.load_hf_model(dataclasses.replace(cfg, model_path=path), causal_lm=True)
        for what, get in (("input", "get_input_embeddings"), ("output", "get_output_embeddings")):
            mine, theirs = getattr(self.model, get)(), getattr(ref, get)()
            n_mine = None if mine is None else int(mine.weight.shape[0])
            n_ref = None if theirs is None else int(theirs.weight.shape[0])
            if n_mine != n_ref:
                raise ConfigError(
                    f"kl.reference_path={path!r} has {n_ref} {what}-embedding rows but the policy "
                    f"(model_path={cfg.model_path!r}) has {n_mine}; the reference must share the policy's vocabulary"
                )
        ref.requires_grad_(False)
        ref.eval()
        fc.shard_fsdp2(ref, device=self.device, world_size=self.world_size, dtype=cfg.dtype)
        packing.install_scorer(ref)  # scored like the policy: LM head only where a loss reads
        return ref

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
        temperature = self._check_batch(batch, for_training=False)
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

    def step(self, batch: TokenBatch) -> dict[str, float]:
        """One training step on ``batch``: ``config.ppo_epochs`` optimizer steps of the
        decoupled PPO loss (``losses.ppo_loss``).

        Three log-probs, kept apart (design.md): ``behavior_log_probs`` (the engine's, in
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
            Metrics (floats; identical on every rank except ``perf/*``): means over
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
            ``perf/peak_memory_mb``. The README's metric table defines each.

        Raises:
            ConfigError, ContractError: as ``compute_log_probs``; also a loss token at a
                row's first position, or ranks holding different batches.
        """
        t0 = time.perf_counter()
        peak = packing.PeakMemory(self.device)  # perf/peak_memory_mb
        peak.start()
        cfg = self.config
        temperature = self._check_batch(batch, for_training=True)
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
                token_parts.append((rows, lp.detach(), ent.detach()))  # for last_token_values
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
        self._token_values = self._assemble_token_values(batch, token_parts)
        self._core.all_reduce(corr_sums, dist.ReduceOp.SUM)
        all_gaps = self._gather_gaps(torch.cat(gaps) if gaps else torch.zeros(0, device=dev))  # (N_loss,)
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
        return out

    def last_token_values(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The trainer-side value of each token of the last ``step``'s batch, for the replay
        store: ``(log_probs [T], entropies [T])`` float32 on CPU, aligned with the batch's
        ``input_ids`` (every rank's rows; 0 where ``loss_mask`` is 0). Both come from epoch
        0's forward, i.e. at the weights the update started from and with the sampling
        transform of ``behavior_log_probs`` (temperature): the log-prob the trainer gave each
        sampled token (the proximal log-prob when the batch carries none) and the entropy
        (nats) of the distribution that predicted it. ``None`` before the first step.
        Local: ``step`` already gathered them."""
        if self._token_values is None:
            return None
        return self._token_values[0], self._token_values[1]

    def _assemble_token_values(
        self, batch: TokenBatch, parts: list[tuple[list[int], torch.Tensor, torch.Tensor]]
    ) -> torch.Tensor:
        """Epoch 0's per-micro-batch log-probs and entropies placed at their rows' token
        ranges of the full batch, summed over ranks (the rows are disjoint, and ``x + 0`` is
        exact). Collective. Cost: one all-reduce of ``2 * T`` float32 when ``W > 1``."""
        out = torch.zeros(2, batch.num_tokens, dtype=torch.float32, device=self.device)  # (2, T)
        slices = batch.row_slices()
        for rows, lp, ent in parts:
            idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(self.device)  # (Tm,)
            out[0, idx] = lp.float()
            out[1, idx] = ent.float()
        if self.world_size > 1:
            self._core.all_reduce(out, dist.ReduceOp.SUM)
        return out.cpu()

    # ------------------------------------------------------------------ reference policy

    @torch.no_grad()
    def kl_to_reference(self, batch: TokenBatch) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-token KL estimate of the sampling policy to the reference, for the KL
        penalty in the reward (``kl.mode: "reward"``; verl's ``use_kl_in_reward``).

        The sampling policy's log-prob of each sampled token is the engine's
        (``batch.behavior_log_probs``); the reference scores the same tokens at the
        batch's temperature, with the same scoring function as the policy
        (``_score_rows``). With ``d_t = behavior_t - reference_t``, the estimator
        ``config.kl.estimator`` of KL(sampling ‖ reference) (``agentrl.trainer.kl.kl_penalty``,
        Schulman 2020) is returned per token; the caller scales it by ``kl.coef`` and
        subtracts it from the reward (``agentrl.credit.kl_reward``). k1 is the estimator
        for the reward: the policy gradient of a k1 penalty is exactly the gradient of the
        KL (``agentrl.trainer.kl``).

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
        temperature = self._check_batch(batch, for_training=False)
        if batch.num_loss_tokens == 0:
            raise ContractError("batch has no loss tokens (sum(loss_mask) == 0); nothing to compare to the reference")
        groups = self._aligned_micro_batches(self._my_rows(batch), batch)
        ref = torch.zeros(batch.num_tokens, dtype=torch.float32, device=self.device)  # (T,)
        slices = batch.row_slices()
        for rows, lp in zip(groups, self._reference_log_probs(batch, groups, temperature)):
            if lp is not None:
                idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(self.device)
                ref[idx] = lp
        if self.world_size > 1:
            dist.all_reduce(ref, op=dist.ReduceOp.SUM)  # rows are disjoint across ranks, 0 elsewhere
        ref = ref.cpu()  # (T,)
        mask = batch.loss_mask > 0  # (T,)
        behavior = torch.where(mask, batch.behavior_log_probs.float(), torch.zeros(()))  # (T,)
        ref = torch.where(mask, ref, torch.zeros(()))  # (T,)
        n = float(mask.sum())
        metrics = {
            f"kl/ref_{k}": float(torch.where(mask, kl_penalty(behavior, ref, k), torch.zeros(())).double().sum()) / n
            for k in KL_ESTIMATORS
        }
        metrics["kl/coef"] = float(self.config.kl.coef)
        per_token = torch.where(mask, kl_penalty(behavior, ref, self.config.kl.estimator), torch.zeros(()))  # (T,)
        return per_token, metrics

    def _reference_log_probs(
        self, batch: TokenBatch, groups: Sequence[list[int]], temperature: float
    ) -> list[torch.Tensor | None]:
        """The reference's log-probs of each of this rank's micro-batches ``groups``
        (aligned: an empty group runs a dummy pass, so every rank joins the reference's
        FSDP all-gathers), without gradients. Collective.

        Returns:
            per group ``[Tm]`` float32 on ``self.device`` (``_score_rows`` layout: loss
            tokens scored, 0 elsewhere), or ``None`` for an empty group.
        """
        assert self.reference is not None
        out: list[torch.Tensor | None] = []
        with torch.no_grad():
            for rows in groups:
                if not rows:
                    _lm_dummy_output(self.reference, torch.zeros(1, 1, dtype=torch.long, device=self.device))
                    out.append(None)
                    continue
                lp, _ = self._score_rows(
                    batch, rows, temperature, with_grad=False, with_entropy=False, model=self.reference
                )  # (Tm,)
                out.append(lp)
        return out

    def _gather_gaps(self, gaps: torch.Tensor) -> torch.Tensor:
        """Every rank's per-token ``|proximal - behavior|`` gaps, concatenated in rank
        order, on every rank. Collective.

        Exact, not a histogram: the counts are all-gathered, then each rank's gaps padded
        to the largest count and all-gathered, so the quantile (``rollout_corr/gap_abs_p99``)
        and the max are computed from the same numbers on every rank and equal the
        one-rank values. Cost: 4 bytes per loss token per rank (a 100k-token batch moves
        0.4 MB), once per step.
        """
        if self.world_size == 1:
            return gaps
        dev = self.device
        n = torch.tensor([gaps.numel()], dtype=torch.int64, device=dev)
        counts = [torch.zeros_like(n) for _ in range(self.world_size)]
        dist.all_gather(counts, n)
        sizes = [int(c) for c in counts]
        padded = torch.zeros(max(max(sizes), 1), dtype=torch.float32, device=dev)  # (max_n,)
        padded[: gaps.numel()] = gaps.float()
        bufs = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(bufs, padded)
        return torch.cat([b[:k] for b, k in zip(bufs, sizes)])  # (sum n,)

    # ------------------------------------------------------------------ state

    def full_state_dict(
        self, dtype: torch.dtype | None = None, *, copy: bool = True, tied_copies: bool = True
    ) -> dict[str, torch.Tensor]:
        """The full (unsharded) model weights with HF parameter names, on CPU.

        What vLLM's ``reload_weights`` takes (platform-notes.md). Collective: every rank
        must call it; rank 0 gets the dict, other ranks get ``{}``.

        Args:
            dtype: cast floating-point tensors to this dtype (e.g. ``torch.bfloat16`` for a
                bf16 engine; note the precision warning in platform-notes.md); ``None``
                keeps fp32.
            copy: ``True``: no tensor shares memory with the live parameters. ``False``: on
                one CPU rank (where the gathered tensors are the parameters themselves) the
                live tensors are returned uncopied, valid until the next ``step``; for a
                caller that copies them at once (the weight sync, which packs them into one
                buffer) and so saves a copy of every weight.
            tied_copies: ``False`` leaves out each weight the model declares tied to another
                (``all_tied_weights_keys``: ``lm_head.weight`` when ``tie_word_embeddings``),
                so a tied tensor is sent once, under its source's name (what vLLM loads).

        Returns:
            ``{hf_name: tensor}`` on rank 0, ``{}`` elsewhere.
        """
        if self.world_size == 1:
            # One rank: every DTensor's local shard is the whole tensor (same keys and storage
            # as get_model_state_dict's, measured 10 ms vs 50 ms for SmolLM2-135M on CPU).
            sd = {}
            for k, v in self.model.state_dict().items():
                v = v.to_local() if hasattr(v, "to_local") else v
                sd[k] = v if v.device.type == "cpu" else v.cpu()
        else:
            sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return {}
        if not tied_copies:
            for target, source in (getattr(self.model, "all_tied_weights_keys", None) or {}).items():
                if source in sd:
                    sd.pop(target, None)
        # On CPU with one rank the "gathered" tensors are the live parameters themselves;
        # copy those, or the caller's dict would change with the next optimizer step.
        live = {fc.storage_ptr(p) for p in self.model.parameters()} if copy else set()
        out = {}
        for k, v in sd.items():
            if fc.storage_ptr(v) in live:
                v = v.clone()
            if dtype is not None and v.is_floating_point():
                v = v.to(dtype)
            out[k] = v
        return out

    def save_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Write model, optimizer, scheduler, RNG states and the step counter to ``path``.

        Layout (collective: every rank must call):

        - ``dcp/``: model and optimizer state, sharded, with ``torch.distributed.checkpoint``
          (each rank writes its own shards; loadable on another world size).
        - ``trainer_state.pt`` (rank 0): ``global_step``, scheduler state, world size, config.
        - ``rng_rank{r}.pt`` (each rank): torch (and CUDA), numpy and ``random`` states.
        - ``COMPLETE`` (rank 0, last, after a barrier): marks the checkpoint as whole.

        Raises:
            CheckpointError: ``path`` exists and already holds a checkpoint.
        """
        self._core.save_checkpoint(path)

    def load_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Restore what ``save_checkpoint`` wrote. Collective.

        RNG states are per rank: when resuming on a different world size, ranks without
        a saved state keep their current one (with a warning); model and optimizer
        re-shard to the new world size.

        Raises:
            CheckpointError: ``path`` is not a complete checkpoint, or its tensors do not
                match this model.
        """
        self._core.load_checkpoint(path)

    def save_hf(
        self, path: str | os.PathLike[str], dtype: torch.dtype | None = None, *, max_shard_size: int | str = "5GB"
    ) -> None:
        """Write a Hugging Face model folder for users and for engines that load from disk
        (``AutoModelForCausalLM.from_pretrained``, vLLM): ``model.safetensors`` (or
        ``model-0000k-of-0000n.safetensors`` shards of at most ``max_shard_size`` with
        ``model.safetensors.index.json``), ``config.json``, ``generation_config.json`` where
        the model has one, and the tokenizer and chat-template files found in
        ``config.model_path`` (``_TOKENIZER_FILES``). Collective; rank 0 writes.

        Tied weights (``tie_word_embeddings``) are stored once, under the key
        ``from_pretrained`` ties again from (``model.embed_tokens.weight`` for Llama; see
        ``agentrl.trainer.export.drop_tied_copies``). ``config.json`` carries ``use_cache`` and
        dropout as the model folder has them (the trainer turns them off for scoring) and
        the ``dtype`` written. Every file gets the mode of a newly created file under the
        umask (``export.follow_umask``). ``full_state_dict`` (the weight sync) is unchanged.

        Args:
            path: target folder (created; files of an earlier save are overwritten).
            dtype: weight dtype written (``None``: fp32, the master weights).
            max_shard_size: largest safetensors file (``"5GB"``, or bytes as an int).

        Raises:
            ContractError: two weights declared tied hold different values.
        """
        from agentrl.trainer import export as hf_export

        sd = self.full_state_dict(dtype)
        if self.rank == 0:
            path = Path(path)
            path.mkdir(parents=True, exist_ok=True)
            sd = hf_export.drop_tied_copies(sd, getattr(self.model, "all_tied_weights_keys", None) or {})
            self.model.save_pretrained(path, state_dict=sd, max_shard_size=max_shard_size)
            src = Path(self.config.model_path)
            hf_export.restore_user_config(path / "config.json", src / "config.json", dtype or torch.float32)
            for name in _TOKENIZER_FILES:
                if (src / name).is_file():
                    shutil.copy2(src / name, path / name)
            hf_export.follow_umask(path)  # safetensors writes 0600; the folder is for users
        dist.barrier()

    # ------------------------------------------------------------------ internals

    def _check_batch(self, batch: TokenBatch, *, for_training: bool) -> float:
        """Validate what only the trainer can check; return the temperature to use."""
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
        if self.config.temperature is not None and t != self.config.temperature:
            raise ConfigError(
                f"batch.sampling.temperature={t} but TrainerConfig.temperature="
                f"{self.config.temperature}; the rollout and the trainer must agree"
            )
        self._core.check_vocab(batch.input_ids)
        if for_training:
            starts = torch.cumsum(batch.seq_lens, 0) - batch.seq_lens  # (B,)
            first = batch.loss_mask[starts] > 0
            if bool(first.any()):
                row = int(first.nonzero()[0])
                raise ContractError(
                    f"row {row} ({batch.episode_ids[row]}) has loss_mask 1 on its first token, "
                    "which has no prefix to be scored from; a row must start with a prompt"
                )
            fp = [float(batch.num_tokens), float(batch.num_rows), float((batch.input_ids % 9973).sum())]
            self._core.check_same_on_all_ranks(
                fp,
                "ranks hold different batches (token count, row count or id checksum "
                "differ); every rank must get the same full TokenBatch",
            )
        return t

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
        only at the positions before the scored tokens (``agentrl.trainer.packing``).

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
        sub = batch.select_rows(rows)
        lens = sub.seq_lens.tolist()
        inputs = packing.model_inputs(sub.input_ids, sub.position_ids, lens, self._row_layout, self.device)
        targets = packing.scored_targets(sub.loss_mask, lens, positions)  # (n,)
        with torch.set_grad_enabled(with_grad):
            lp_sel, ent_sel = packing.score_tokens(
                self.model if model is None else model,
                inputs,
                targets,
                sub.input_ids[targets],
                temperature,
                chunk_tokens=self.config.logprob_chunk_tokens,
                with_entropy=with_entropy,
            )  # (n,) each
            idx = targets.to(self.device)
            lp = torch.zeros(sub.num_tokens, dtype=torch.float32, device=self.device).index_put((idx,), lp_sel)  # (Tm,)
        ent = None
        if ent_sel is not None:
            ent = torch.zeros(sub.num_tokens, dtype=torch.float32, device=self.device).index_put((idx,), ent_sel)  # (Tm,)
        return lp, ent

    def _perf_metrics(self, batch: TokenBatch, peak: packing.PeakMemory) -> dict[str, float]:
        """``perf/padding_frac`` (share of the positions the model ran on, over all ranks'
        micro-batches, that are padding; 0 when packed) and ``perf/peak_memory_mb`` (of
        ``peak``, started at the beginning of the step). Local: every rank holds the batch
        and micro-batching is deterministic, so no collective is needed."""
        lens = batch.seq_lens.tolist()
        pad = scored = 0
        for groups in self._core.all_rank_micro_batches(batch.num_rows, lens, self._row_layout):
            p, n = packing.padded_positions(groups, lens, self._row_layout)
            pad, scored = pad + p, scored + n
        return {"perf/padding_frac": pad / scored if scored else 0.0, "perf/peak_memory_mb": peak.peak_mb()}


def _lm_dummy_output(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward of a dummy pass (``TrainerCore.dummy_forward``): one token through the
    backbone and the LM head, as a real micro-batch; ``[1]`` log-prob."""
    return packing.dummy_score(model, ids)  # (1,)


def _row_slices(batch: TokenBatch, rows: Sequence[int]) -> list[slice]:
    slices = batch.row_slices()
    return [slices[r] for r in rows]
