"""The frozen reference policy of the KL term (``TrainerConfig.kl``): loading it beside the
policy, scoring a rank's micro-batches with it, and the per-token KL estimate of the
sampling policy to it that the reward-mode penalty subtracts from the reward
(``kl_to_reference``, behind ``PolicyTrainer.kl_to_reference``; the loss-mode term is
``agentrl.trainer.kl``).

Collective where it says so: the reference is sharded with FSDP2 like the policy, so every
rank joins its all-gathers.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import torch
import torch.distributed as dist

from agentrl.errors import ConfigError
from agentrl.trainer import _fsdp_common as fc
from agentrl.trainer.config import KL_ESTIMATORS, KLConfig, KLEstimator, TrainerConfig
from agentrl.trainer.kl import kl_penalty
from agentrl.trainer.scoring import dummy_score, install_scorer
from agentrl.types import TokenBatch

ScoreRows = Callable[[list[int], torch.nn.Module], torch.Tensor]
"""``(rows, model) -> [Tm]`` float32 log-probs of one micro-batch's loss tokens (0
elsewhere), without gradients: ``PolicyTrainer._score_rows`` with ``model`` set."""


def load_reference(
    config: TrainerConfig, policy: torch.nn.Module, *, device: torch.device, world_size: int
) -> torch.nn.Module | None:
    """The frozen reference policy of the KL term, or ``None`` when ``kl.coef == 0``.

    Weights: ``config.kl.reference_path``, or by default the initial policy
    (``config.model_path``), loaded as the policy is (``load_hf_model``: fp32, dropout
    off, the same attention kernel), ``requires_grad_(False)``, ``eval()``, and sharded
    with FSDP2 like the policy (same mesh shape and compute dtype) but with no
    optimizer. It is not part of the checkpoint: it never changes, so a resumed run
    loads it again from the same folder (which must therefore still hold the same
    weights). Memory: one more copy of the weights (sharded over the ranks), and no
    gradients or optimizer state. Collective.

    Raises:
        ConfigError: the folder cannot be loaded, or its vocabulary (input-embedding
            rows, or output-embedding rows) differs from ``policy``'s.
    """
    if not config.kl.coef > 0:
        return None
    path = config.kl.reference_path or config.model_path
    ref = fc.load_hf_model(dataclasses.replace(config, model_path=path), causal_lm=True)
    for what, get in (("input", "get_input_embeddings"), ("output", "get_output_embeddings")):
        mine, theirs = getattr(policy, get)(), getattr(ref, get)()
        n_mine = None if mine is None else int(mine.weight.shape[0])
        n_ref = None if theirs is None else int(theirs.weight.shape[0])
        if n_mine != n_ref:
            raise ConfigError(
                f"kl.reference_path={path!r} has {n_ref} {what}-embedding rows but the policy "
                f"(model_path={config.model_path!r}) has {n_mine}; the reference must share the policy's vocabulary"
            )
    ref.requires_grad_(False)
    ref.eval()
    fc.shard_fsdp2(ref, device=device, world_size=world_size, dtype=config.dtype)
    install_scorer(ref)  # scored like the policy: LM head only where a loss reads
    return ref


def reference_log_probs(
    reference: torch.nn.Module, groups: Sequence[list[int]], score: ScoreRows, device: torch.device
) -> list[torch.Tensor | None]:
    """The reference's log-probs of each of this rank's micro-batches ``groups``
    (aligned: an empty group runs a dummy pass, so every rank joins the reference's
    FSDP all-gathers), without gradients. Collective.

    Returns:
        per group ``[Tm]`` float32 on ``device`` (``score``'s layout: loss tokens scored,
        0 elsewhere), or ``None`` for an empty group.
    """
    out: list[torch.Tensor | None] = []
    with torch.no_grad():
        for rows in groups:
            if not rows:
                dummy_score(reference, torch.zeros(1, 1, dtype=torch.long, device=device))
                out.append(None)
                continue
            out.append(score(rows, reference))  # (Tm,)
    return out


def kl_reward_estimate(
    behavior_log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    estimator: KLEstimator,
    coef: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token estimate of KL(sampling ‖ reference) with ``d_t = behavior_t -
    reference_t`` (``kl_penalty``, Schulman 2020), for the reward-mode penalty.

    Args:
        behavior_log_probs: ``[T]`` the engine's log-probs of the sampled tokens.
        ref_log_probs: ``[T]`` float32 the reference's log-probs of the same tokens.
        loss_mask: ``[T]`` 0/1; other positions are ignored. At least one loss token.
        estimator: ``"k1"``, ``"k2"`` or ``"k3"``, the estimate returned per token.
        coef: ``kl.coef``, reported as ``kl/coef``.

    Returns:
        ``(k, metrics)``: ``k`` ``[T]`` float32 (nats), the estimate on loss tokens, 0
        elsewhere; ``metrics``: ``kl/ref_k1``, ``kl/ref_k2``, ``kl/ref_k3`` (means over the
        loss tokens of each estimator) and ``kl/coef``.
    """
    mask = loss_mask > 0  # (T,)
    zero = torch.zeros(())
    behavior = torch.where(mask, behavior_log_probs.float(), zero)  # (T,)
    ref = torch.where(mask, ref_log_probs, zero)  # (T,)
    n = float(mask.sum())
    metrics = {
        f"kl/ref_{k}": float(torch.where(mask, kl_penalty(behavior, ref, k), zero).double().sum()) / n
        for k in KL_ESTIMATORS
    }
    metrics["kl/coef"] = float(coef)
    per_token = torch.where(mask, kl_penalty(behavior, ref, estimator), zero)  # (T,)
    return per_token, metrics


def kl_to_reference(
    reference: torch.nn.Module,
    batch: TokenBatch,
    groups: Sequence[list[int]],
    score: ScoreRows,
    kl: KLConfig,
    *,
    device: torch.device,
    world_size: int,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token KL estimate of the sampling policy to the reference, for the KL penalty
    in the reward (``kl.mode: "reward"``; verl's ``use_kl_in_reward``).

    The sampling policy's log-prob of each sampled token is the engine's
    (``batch.behavior_log_probs``); the reference scores the same tokens with ``score``
    (the policy's scoring function, at the batch's temperature) over this rank's aligned
    micro-batches ``groups``. With ``d_t = behavior_t - reference_t``, the estimator
    ``kl.estimator`` of KL(sampling ‖ reference) (``kl_reward_estimate``) is returned per
    token; the caller scales it by ``kl.coef`` and subtracts it from the reward
    (``agentrl.credit.kl_reward``). Collective: every rank gets the result.

    Returns:
        ``(k, metrics)``: ``k`` ``[T]`` float32 on CPU (nats), the estimate on loss tokens,
        0 elsewhere; ``metrics``: ``kl/ref_k1``, ``kl/ref_k2``, ``kl/ref_k3`` (means over
        the batch's loss tokens) and ``kl/coef``.
    """
    ref = torch.zeros(batch.num_tokens, dtype=torch.float32, device=device)  # (T,)
    slices = batch.row_slices()
    for rows, lp in zip(groups, reference_log_probs(reference, groups, score, device)):
        if lp is not None:
            idx = torch.cat([torch.arange(slices[r].start, slices[r].stop) for r in rows]).to(device)  # (Tm,)
            ref[idx] = lp
    if world_size > 1:
        dist.all_reduce(ref, op=dist.ReduceOp.SUM)  # rows are disjoint across ranks, 0 elsewhere
    return kl_reward_estimate(batch.behavior_log_probs, ref.cpu(), batch.loss_mask, kl.estimator, kl.coef)
