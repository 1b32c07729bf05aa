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

Scoring layout: the batch is packed (``TokenBatch``), but rows are scored by right-padding
each micro-batch's rows to its longest row with an ``attention_mask`` (and the batch's
``position_ids``, restarting per row). That is exact for every HF attention kernel;
packing several rows into one unpadded sequence would need kernel-specific
variable-length attention and is left for later.

Dropout is switched off at load (every ``*dropout*`` float of the HF config set to 0,
every ``nn.Dropout`` to ``p=0``): the trainer must score tokens with the same
deterministic function the engine sampled from, and ``old_log_probs`` must equal the
first PPO epoch's log-probs exactly.
"""

from __future__ import annotations

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
from agentrl.trainer._core import TrainerCore
from agentrl.trainer.config import TrainerConfig
from agentrl.trainer.losses import entropy_from_logits, logprobs_from_logits, policy_loss
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

    Raises (constructor):
        ConfigError: invalid config, no process group, CUDA requested but absent, or a
            model folder that cannot be loaded.
    """

    def __init__(self, config: TrainerConfig) -> None:
        config.validate()
        self.config = config
        # seed, load (dropout off), gradient checkpointing, FSDP2, AdamW + warmup
        self._core = TrainerCore("PolicyTrainer", config, causal_lm=True, dummy_output=_lm_dummy_output)
        self.rank, self.world_size = self._core.rank, self._core.world_size
        self.device = self._core.device
        self.model = self._core.model

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
            lp, _ = self._score_rows(batch, rows, temperature, with_grad=False, with_entropy=False)
            idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(self.device)
            out[idx] = lp
        if self.world_size > 1:
            # Rows are disjoint across ranks and 0 elsewhere, so the sum is exact.
            dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out.cpu()

    # ------------------------------------------------------------------ training

    def step(self, batch: TokenBatch) -> dict[str, float]:
        """One training step on ``batch``: ``config.ppo_epochs`` optimizer steps.

        1. Global loss-token / sequence counts are all-reduced across ranks.
        2. ``old_log_probs`` at the current weights, taken (detached) from epoch 0's
           forward passes; the gap to ``behavior_log_probs`` on loss tokens is reported
           (design.md, invariant 4).
        3. Per epoch: forward/backward over this rank's micro-batches (gradient
           accumulation, loss normalised by the global counts), gradient clipping,
           AdamW step, scheduler step.

        Collective: call on every rank with the same batch.

        Returns:
            Metrics (floats, identical on every rank): ``actor/pg_loss``,
            ``actor/ppo_kl``, ``actor/pg_clipfrac``, ``actor/entropy``,
            ``actor/ratio_mean`` (means over epochs; token means over the batch's loss
            tokens, the loss itself as aggregated), ``actor/grad_norm`` (pre-clip, mean over
            epochs), ``actor/lr`` (of the last optimizer step), ``actor/num_loss_tokens``,
            ``actor/num_loss_seqs``, ``rollout_corr/gap_abs_mean``,
            ``rollout_corr/gap_abs_max``, ``actor/skipped_step`` (optimizer steps
            skipped for a non-finite gradient norm), ``actor/global_step``,
            ``perf/tokens_per_s`` (batch tokens / step time), ``perf/step_s``.

        Raises:
            ConfigError, ContractError: as ``compute_log_probs``; also a loss token at a
                row's first position, or ranks holding different batches.
        """
        t0 = time.perf_counter()
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

        # 2. old log-probs at the current weights, and their gap to the engine's, are taken
        # from epoch 0's own forward passes (detached): the weights do not change until the
        # optimizer step at the end of an epoch, so this equals a separate no-grad pass
        # and saves a full forward over the batch.
        old_lps: list[torch.Tensor | None] = [None] * len(groups)
        gap_sum = torch.zeros(1, dtype=torch.float64, device=dev)
        gap_max = torch.zeros(1, dtype=torch.float32, device=dev)

        # 3. PPO epochs: TrainerCore runs the loop (zero-grad, micro-batches or dummy
        # passes, all-reduce of these sums, clip, AdamW or a skipped step, scheduler).
        loss_keys = ("losses/policy_loss", "losses/approx_kl", "losses/clipfrac", "losses/entropy", "losses/ratio_mean")
        metric_names = ("actor/pg_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/entropy", "actor/ratio_mean")

        def micro_step(epoch: int, g: int, rows: list[int]) -> torch.Tensor:
            """Score, loss and backward of one micro-batch; returns
            [loss, kl*n, clipfrac*n, entropy*n, ratio*n] (n = its loss tokens), float64."""
            nonlocal gap_max
            sub = batch.select_rows(rows)
            lp, ent = self._score_rows(batch, rows, temperature, with_grad=True, with_entropy=True)
            mask = sub.loss_mask.to(dev)
            if epoch == 0:
                old_lps[g] = lp.detach()
                gap = (old_lps[g] - sub.behavior_log_probs.to(dev)).abs()[mask > 0]  # (n_loss,)
                if gap.numel():
                    gap_sum.add_(gap.double().sum())
                    gap_max = torch.maximum(gap_max, gap.max())
            old = old_lps[g]
            seq_ids = torch.repeat_interleave(torch.arange(len(rows)), sub.seq_lens).to(dev)
            loss, m = policy_loss(
                lp,
                old,
                sub.advantages.to(dev),
                mask,
                clip_ratio_low=cfg.clip_ratio_low,
                clip_ratio_high=cfg.clip_ratio_high,
                loss_agg_mode=cfg.loss_agg_mode,
                global_num_tokens=global_tokens,
                global_num_seqs=max(global_seqs, 1.0),
                seq_ids=seq_ids,
                entropy=ent,
            )
            loss.backward()
            n = mask.sum().double()
            return torch.stack([m[loss_keys[0]].double()] + [m[k].double() * n for k in loss_keys[1:]])

        stats = self._core.optimize(groups, cfg.ppo_epochs, micro_step, len(metric_names))
        self._core.all_reduce(gap_sum, dist.ReduceOp.SUM)
        self._core.all_reduce(gap_max, dist.ReduceOp.MAX)
        totals = {k: 0.0 for k in metric_names}
        for vals in stats.sums:
            totals[metric_names[0]] += vals[0]
            for k, v in zip(metric_names[1:], vals[1:]):
                totals[k] += v / global_tokens

        step_s = time.perf_counter() - t0
        n_ep = float(cfg.ppo_epochs)
        out = {k: v / n_ep for k, v in totals.items()}
        out.update(
            {
                "actor/grad_norm": sum(stats.grad_norms) / n_ep,
                "actor/lr": stats.lr,
                "actor/num_loss_tokens": global_tokens,
                "actor/num_loss_seqs": global_seqs,
                "rollout_corr/gap_abs_mean": float(gap_sum) / global_tokens,
                "rollout_corr/gap_abs_max": float(gap_max),
                "actor/skipped_step": float(stats.skipped),
                "actor/global_step": float(self.global_step),
                "perf/tokens_per_s": batch.num_tokens / step_s if step_s > 0 else 0.0,
                "perf/step_s": step_s,
            }
        )
        return out

    # ------------------------------------------------------------------ state

    def full_state_dict(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """The full (unsharded) model weights with HF parameter names, on CPU.

        What vLLM's ``reload_weights`` takes (platform-notes.md). Collective: every rank
        must call it; rank 0 gets the dict, other ranks get ``{}``.

        Args:
            dtype: cast floating-point tensors to this dtype (e.g. ``torch.bfloat16`` for a
                bf16 engine; note the precision warning in platform-notes.md); ``None``
                keeps fp32.

        Returns:
            ``{hf_name: tensor}`` on rank 0 (never sharing memory with the live
            parameters), ``{}`` elsewhere.
        """
        sd = get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return {}
        # On CPU with one rank the "gathered" tensors are the live parameters themselves;
        # copy those, or the caller's dict would change with the next optimizer step.
        live = {fc.storage_ptr(p) for p in self.model.parameters()}
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
        the ``dtype`` written. ``full_state_dict`` (the weight sync) is unchanged.

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

    def _micro_batches(self, rows: Sequence[int], batch: TokenBatch) -> list[list[int]]:
        """Group rows in order: at most ``micro_batch_size`` rows and (if set) at most
        ``micro_batch_tokens`` padded tokens per group."""
        return self._core.micro_batches(rows, batch.seq_lens.tolist())

    def _aligned_micro_batches(self, rows: Sequence[int], batch: TokenBatch) -> list[list[int]]:
        """This rank's micro-batches, padded with empty groups (dummy passes) to the
        largest count of any rank, so every rank runs the same number of FSDP passes."""
        return self._core.aligned_micro_batches(rows, batch.seq_lens.tolist())

    def _score_rows(
        self, batch: TokenBatch, rows: Sequence[int], temperature: float, *, with_grad: bool, with_entropy: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Forward ``rows`` right-padded; return their packed ``[Tm]`` log-probs (and
        entropies of the distribution that predicted each token), 0 at row starts."""
        dev = self.device
        ids, pos, attn = fc.right_pad_rows(batch.input_ids, batch.position_ids, batch.row_slices(), rows)  # (B, L) each
        ids, pos, attn = ids.to(dev), pos.to(dev), attn.to(dev)
        n_rows, width = ids.shape
        with torch.set_grad_enabled(with_grad):
            logits = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=False).logits  # (B, L, V)
            flat = logits.reshape(n_rows * width, logits.shape[-1])  # (B*L, V), a view
            labels = torch.zeros_like(ids)  # (B, L): labels[b, t] = ids[b, t + 1]
            labels[:, :-1] = ids[:, 1:]
            lp_next = logprobs_from_logits(
                flat, labels.reshape(-1), temperature, chunk_tokens=self.config.logprob_chunk_tokens
            ).reshape(n_rows, width)  # (B, L): log p(ids[b, t+1] | ids[b, :t+1])
            zeros = torch.zeros(n_rows, 1, dtype=torch.float32, device=dev)
            lp = torch.cat([zeros, lp_next[:, :-1]], dim=1)  # (B, L): log p(ids[b, t] | prefix)
        valid = attn.bool()  # (B, L)
        ent = None
        if with_entropy:
            with torch.no_grad():
                e_next = entropy_from_logits(
                    flat.detach(), temperature, chunk_tokens=self.config.logprob_chunk_tokens
                ).reshape(n_rows, width)  # (B, L)
                ent = torch.cat([zeros, e_next[:, :-1]], dim=1)[valid]  # (Tm,)
        return lp[valid], ent  # (Tm,) in row order, matching batch.select_rows(rows)


def _lm_dummy_output(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The forward of a dummy pass (``TrainerCore.dummy_forward``): ``[1, 1, V]`` logits."""
    return model(input_ids=ids, use_cache=False).logits  # (1, 1, V)


def _row_slices(batch: TokenBatch, rows: Sequence[int]) -> list[slice]:
    slices = batch.row_slices()
    return [slices[r] for r in rows]
